"""`torch.distributed.checkpoint.async_save` under `phantora run`: it completes, writes a checkpoint that loads, and
holds the calling thread for its staging copies over the host link (stubs/phantora_stubs/dcp_async.py)."""

from __future__ import annotations

import json

from phantora.cluster import load_cluster
from phantora.gpus import load_gpu
from test_live_run import SCRIPTS, phantora_run, results

SCRIPT = str(SCRIPTS / "async_checkpoint.py")


def _run(tmp_path, **env):
    proc = phantora_run("--nodes", "1", "--gpus-per-node", "2", "--no-trace", "--", "python", SCRIPT,
                        str(tmp_path / "ckpt"), env_extra=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = sorted(results(proc.stdout), key=lambda r: r["rank"])
    assert [r["rank"] for r in res] == [0, 1]
    return res


def test_async_save_writes_a_checkpoint_and_holds_the_thread_for_its_copies(tmp_path):
    res = _run(tmp_path)
    link = load_gpu(load_cluster("h100-hgx").gpu).pcie_gbyte_per_s * 1e9     # the GPU's host link, bytes per second
    for r in res:
        assert "error" not in r, r.get("error")
        assert r["thread"]["done"] == [True] and r["pinned"]["done"] == [True, True, True]
        for mode in ("thread", "pinned"):
            # torch's FileSystemWriter layout: the metadata and one data file per rank
            assert r[mode]["files"] == [".metadata", "__0_0.distcp", "__1_0.distcp"], json.dumps(r)
            # every byte of the rank's shard crosses the host link before async_save returns
            assert r[mode]["held_s"] >= r["bytes"] / link
        # pageable host memory is no faster to copy into than pinned memory
        assert r["thread"]["held_s"] >= r["pinned"]["held_s"]
        assert r["loaded"] == sorted(f"{i}.{p}" for i in range(4) for p in ("weight", "bias"))


def test_async_save_needs_a_cpu_backend_as_in_torch(tmp_path):
    # state_dict_saver.async_save: the group must list the CPU device ("cpu:gloo,cuda:nccl"); an NCCL-only group fails
    for r in _run(tmp_path, BACKEND="nccl"):
        assert r["error"].startswith("AssertionError: A CPU backend must be enabled for async save"), r
