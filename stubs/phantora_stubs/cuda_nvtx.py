"""`torch.cuda.nvtx` stand-ins: ranges and marks are no-ops (only the push/pop depth is kept)."""

from __future__ import annotations

import contextlib
from typing import Any


# ---- NVTX ------------------------------------------------------------------------------------------------------------

class _Nvtx:
    depth = 0


def range_push(msg: str) -> int:
    _Nvtx.depth += 1
    return _Nvtx.depth - 1


def range_pop() -> int:
    if _Nvtx.depth == 0:
        return -1
    _Nvtx.depth -= 1
    return _Nvtx.depth


def range_start(msg: str) -> int:
    return 0


def range_end(range_id: int) -> None:
    return None


def mark(msg: str) -> None:
    return None


@contextlib.contextmanager
def nvtx_range(msg: str, *args: Any, **kwargs: Any):
    range_push(msg)
    try:
        yield
    finally:
        range_pop()


# ---- torch.autograd.profiler.emit_nvtx -------------------------------------------------------------------------------

def install_emit_nvtx() -> None:
    """`torch.autograd.profiler.emit_nvtx()` turns on the C++ profiler in its NVTX state, which a CPU-only torch
    refuses ("PyTorch was compiled without CUDA"): here it only synchronizes on entry and exit, as the real one does
    around its ranges, whose marks no NVTX tool sees in a simulated rank."""
    import torch
    from torch.autograd import profiler

    cls = getattr(profiler, "emit_nvtx", None)
    if cls is None or getattr(cls.__enter__, "_phantora", False):
        return

    def __enter__(self):
        if not self.enabled:
            return None
        if self.entered:
            raise RuntimeError("NVTX annotation context manager is not reentrant")
        self.entered = True
        torch.cuda.synchronize()
        return self

    def __exit__(self, exc_type, exc_val, exc_tb):
        if not self.enabled:
            return None
        torch.cuda.synchronize()
        return False

    __enter__._phantora = True   # type: ignore[attr-defined]
    cls.__enter__, cls.__exit__ = __enter__, __exit__
