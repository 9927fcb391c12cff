"""Phantora's rank-side stubs: what every simulated rank process runs in place of CUDA, NCCL and the clock.

`stubs/sitecustomize.py` calls `phantora_stubs.bootstrap.install()` when the environment variable `PHANTORA_RANK`
is set. See docs/stubs.md for the whole picture: the bootstrap, the environment variables, what is faked and how
values that would need real tensor data are answered.
"""
