"""Framework stand-ins: what a simulated rank puts in place of a framework's compiled pieces, one module per framework.

The rest of the stubs knows no framework: it intercepts torch, whatever drives it. A framework whose own compiled
extensions cannot run in a rank (no CUDA toolkit to build them, no tensor data to run them on) gets a stand-in here,
installed by an import hook when the framework's module is imported (never importing the framework itself), and
costed like the kernels it stands for: it issues the torch ops that read and write the same tensors, or charges the
host time of a host loop. `HOOKS` maps a framework module to the function that patches it.

- `deepspeed.py`: DeepSpeed's compiled ops (FusedAdam, FusedLamb, the CPU optimizers of ZeRO-Offload)
  and its engine's optimizer step as the iteration boundary (docs/deepspeed.md).
"""

from __future__ import annotations

from typing import Any, Callable

from . import deepspeed

HOOKS: dict[str, Callable[[Any], None]] = {
    "deepspeed.ops.op_builder.builder": deepspeed.install,
    "deepspeed.runtime.engine": deepspeed.install_engine,
}


def install(when_imported: Callable[[str, Callable[[Any], None]], None]) -> None:
    """Register every stand-in's import hook."""
    for module, hook in HOOKS.items():
        when_imported(module, hook)
