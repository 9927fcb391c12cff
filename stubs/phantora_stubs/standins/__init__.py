"""Framework stand-ins: what a simulated rank puts in place of a framework's compiled pieces, one module per framework.

The rest of the stubs knows no framework: it intercepts torch, whatever drives it. A framework whose own compiled
extensions cannot run in a rank (no CUDA toolkit to build them, no tensor data to run them on) gets a stand-in here,
installed by an import hook when the framework's module is imported (never importing the framework itself), and
costed like the kernels it stands for: it issues the torch ops that read and write the same tensors, or charges the
host time of a host loop. `HOOKS` maps a framework module to the function that patches it.

- `deepspeed.py`: DeepSpeed's compiled ops (FusedAdam, FusedLamb, the CPU optimizers of ZeRO-Offload, ZeRO++'s
  quantizer), its engine's optimizer step as the iteration boundary (and its optimizers' state initialization as
  none), its PipelineModule's stage checked against `--ranks auto` (docs/deepspeed.md).
- `megatron.py`: Megatron-core's optimizer step (chained or not) as the iteration boundary, its parallel state's
  pipeline stage checked against `--ranks auto`.
- `kernels.py`: the torch ops that stand for the fused optimizers' multi-tensor kernels, shared by the above.

A package that does not install on a CPU-only machine at all, but is part of the simulated cluster's software, is a
stand-in package under `packages/`, importable under its own name when the run asks for it (`provide`):

- `packages/transformer_engine`: Transformer Engine's Python API (`phantora run --transformer-engine VERSION`;
  docs/megatron.md).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from typing import Any, Callable

from . import deepspeed, megatron

PACKAGES_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "packages")

HOOKS: dict[str, Callable[[Any], None]] = {
    "deepspeed.ops.op_builder.builder": deepspeed.install,
    "deepspeed.runtime.engine": deepspeed.install_engine,
    "deepspeed.runtime.pipe.module": deepspeed.install_pipe_module,
    "deepspeed.runtime.fp16.fused_optimizer": deepspeed.install_state_initialization,
    "deepspeed.runtime.fp16.unfused_optimizer": deepspeed.install_state_initialization,
    "deepspeed.runtime.zero.stage_1_and_2": deepspeed.install_state_initialization,
    "deepspeed.runtime.zero.stage3": deepspeed.install_state_initialization,
    "deepspeed.runtime.zenflow.zenflow_stage_1_and_2": deepspeed.install_state_initialization,
    "megatron.core.optimizer.optimizer": megatron.install_optimizers,
    "megatron.core.optimizer.layer_wise_optimizer": megatron.install_optimizers,
    "megatron.core.parallel_state": megatron.install_parallel_state,
}


def install(when_imported: Callable[[str, Callable[[Any], None]], None]) -> None:
    """Register every stand-in's import hook."""
    for module, hook in HOOKS.items():
        when_imported(module, hook)


class _PackageFinder(importlib.abc.MetaPathFinder):
    """Answers the import of a stand-in package's top-level name from packages/ (its submodules then resolve
    through the package's own path)."""

    def __init__(self, names: set[str]):
        self.names = names

    def find_spec(self, fullname, path=None, target=None):
        if fullname in self.names:
            return importlib.machinery.PathFinder.find_spec(fullname, [PACKAGES_DIR])
        return None


def provide(transformer_engine: str = "") -> None:
    """Make the stand-in packages the run asks for importable (before the program imports anything); a
    Transformer Engine release answers as `transformer_engine.__version__`."""
    names = set()
    if transformer_engine:
        os.environ["PHANTORA_TRANSFORMER_ENGINE"] = transformer_engine
        names.add("transformer_engine")
    if names and not any(isinstance(f, _PackageFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _PackageFinder(names))
