"""Megatron-core's optimizer step as the iteration boundary.

Megatron-core's optimizers are not torch Optimizers: `MixedPrecisionOptimizer` / `DistributedOptimizer` step an
inner torch optimizer, and `ChainedOptimizer` (a model with expert parameters, or several parameter groups) steps
one such optimizer per chain member. Left to torch's optimizer hooks, every inner step would mark an iteration
(two per training step of a mixture-of-experts model). `install_optimizers` (run once a module of Megatron's
optimizers is imported; standins/__init__.py) makes each `step` these modules define the outermost step of its nest
(`fake.iteration_step`), so one call of the training loop's `optimizer.step()` marks one iteration, whatever it
chains.
"""

from __future__ import annotations

from typing import Any


def install_optimizers(module: Any) -> None:
    """Wrap the `step` of every class `module` defines (idempotent)."""
    from ..fake import iteration_step
    for obj in list(vars(module).values()):
        if isinstance(obj, type) and obj.__module__ == module.__name__ and "step" in vars(obj):
            step = vars(obj)["step"]
            if callable(step) and not getattr(step, "_phantora", False):
                obj.step = iteration_step(step)
