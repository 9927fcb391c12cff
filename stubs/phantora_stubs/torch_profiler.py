"""`torch.profiler` in a simulated rank: the CPU activity as in a real run, the CUDA activity left out.

A CPU build of torch has no CUDA profiler (Kineto's CUPTI side): asked for `ProfilerActivity.CUDA`, or `use_cuda=True`
/ `use_device="cuda"`, torch's profiler tries to record a CUDA event around every op and warns with a stack trace each
time (thousands of lines a step, and seconds of the simulation's time). The profiler runs with the CPU activity only;
rank 0 says once where the simulated kernels are: the run's trace (`phantora export` writes them as a timeline). The
profiler's own Python is the program's host work, as it is on a real host (profiled steps are slower).
"""

from __future__ import annotations

import functools
from typing import Any

from .errors import note_once

def _note() -> None:
    note_once("torch.profiler", "torch.profiler runs without its CUDA activity in a simulated rank (a CPU build of "
              "torch has no CUDA profiler); the simulated kernels are in the run's trace: `phantora export TRACE` "
              "(docs/stubs.md)")


def _without_cuda(init: Any, strip: Any) -> Any:
    if getattr(init, "__phantora__", False):
        return init

    @functools.wraps(init)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        strip(self)

    __init__.__phantora__ = True        # type: ignore[attr-defined]
    return __init__


def _strip_kineto(profiler: Any) -> None:
    from torch.profiler import ProfilerActivity
    activities = getattr(profiler, "activities", None)
    if activities and ProfilerActivity.CUDA in activities:
        profiler.activities = {a for a in activities if a != ProfilerActivity.CUDA}
        getattr(profiler, "activity_filters", {}).pop(ProfilerActivity.CUDA, None)
        if getattr(profiler, "use_device", None) == "cuda":
            profiler.use_device = None
        _note()


def _strip_legacy(profiler: Any) -> None:
    from torch.profiler import ProfilerActivity
    changed = False
    if getattr(profiler, "use_device", None) == "cuda":
        profiler.use_device = None
        changed = True
    if getattr(profiler, "use_cuda", False):
        profiler.use_cuda = False
        changed = True
    kineto = getattr(profiler, "kineto_activities", None)
    if kineto and ProfilerActivity.CUDA in kineto:
        kineto.discard(ProfilerActivity.CUDA)
        changed = True
    from torch.autograd.profiler import ProfilerState
    if getattr(profiler, "profiler_kind", None) == ProfilerState.KINETO_GPU_FALLBACK:
        profiler.profiler_kind = ProfilerState.KINETO       # CUDA events around every op: not in a CPU build
        changed = True
    if changed:
        _note()


def install() -> None:
    """Wrap the profilers' constructors (idempotent)."""
    import torch.autograd.profiler as legacy
    import torch.profiler.profiler as kineto

    kineto._KinetoProfile.__init__ = _without_cuda(kineto._KinetoProfile.__init__, _strip_kineto)
    legacy.profile.__init__ = _without_cuda(legacy.profile.__init__, _strip_legacy)
