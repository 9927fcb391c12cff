"""Megatron-core's optimizer step as the iteration boundary, and its pipeline stages checked against `--ranks auto`.

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


def install_parallel_state(parallel_state: Any) -> None:
    """After `initialize_model_parallel`, Megatron-core's parallel state knows this rank's pipeline stage: checked
    against what `--ranks auto` assumed (pipeline_layout.py; its `order` may put the stages elsewhere)."""
    import functools

    from ..pipeline_layout import check
    fn = getattr(parallel_state, "initialize_model_parallel", None)
    if fn is None or getattr(fn, "_phantora", False):
        return

    @functools.wraps(fn)
    def initialize_model_parallel(*args: Any, **kwargs: Any) -> Any:
        out = fn(*args, **kwargs)
        check(parallel_state.get_pipeline_model_parallel_rank(),
              parallel_state.get_pipeline_model_parallel_world_size(),
              "megatron.core.parallel_state.initialize_model_parallel")
        return out

    initialize_model_parallel._phantora = True   # type: ignore[attr-defined]
    parallel_state.initialize_model_parallel = initialize_model_parallel
