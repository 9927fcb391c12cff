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
