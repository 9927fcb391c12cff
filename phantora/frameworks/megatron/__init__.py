"""Megatron-core (release 0.16.1), run unmodified under `phantora run -- python presets/workloads/megatron_gpt.py`.

- `command.py`: `megatron_argv`, the command line of presets/workloads/megatron_gpt.py (a training loop in the style
  of Megatron-LM's `examples/run_simple_mcore_train_loop.py`) for a workload: the framework's ground-truth records
  and its model presets run through it.

Megatron-core needs nothing framework-specific from the stubs: the gaps it found in `torch.cuda` and
`torch.distributed` are filled for every framework (docs/megatron.md lists them). The registry
(phantora/frameworks/__init__.py) reaches this package as `framework_module("megatron")`.
"""

from __future__ import annotations

from .command import RECOMPUTE, megatron_argv, workload_script

__all__ = ["RECOMPUTE", "megatron_argv", "workload_script"]
