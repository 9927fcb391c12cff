"""`torch.autograd.grad` returns once the autograd engine has let go of the gradients it returns.

A backward pass on (fake) CUDA tensors runs on the engine's device thread. When the pass ends, that thread wakes the
caller first and drops its own reference to the pass (the GraphTask, whose future holds the returned gradients) a
moment later. A C++ reference dropped from a tensor that has a Python object (PyTorch's PyObject preservation,
c10/util/intrusive_ptr.h) decrefs that object, which needs the GIL: where the caller has already wrapped the
gradients (the device thread preempted: under load on two cores, nearly always on one), the device thread waits for
the GIL, and the gradients outlive the caller's `del`, their storage freed only when the caller next lets the GIL go
(a print, a later op), in the middle of whatever runs then: allocated memory and its peak are too high meanwhile, and
a measurement around the next op sees its outputs offset by the late free. On a GPU host the device thread
normally has a core of its own and lets go first; the simulation must not depend on how loaded the simulating
machine is.

The fence: a token stashed in the caller's thread-local state (`torch._C._stash_obj_in_tls`, as `_engine_run_backward`
stashes its contextvars context for the device threads) is copied into the GraphTask (its `thread_locals_`, destroyed
after its future), so the token dies when the engine has dropped the gradients. After the call, the caller waits for
that with the GIL released, at most `TIMEOUT_S` (a copy of the thread-local state kept by something else, a future's
callback registered during the pass, must not hang the program). Not counted as host work (a race between threads).
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from .clock import METER

TIMEOUT_S = 0.5
_KEY = "phantora_grad_fence"


class _Token:
    __slots__ = ("gone",)

    def __init__(self) -> None:
        self.gone = threading.Event()

    def __del__(self) -> None:          # on whichever thread drops the last copy: not counted
        METER.enter()
        try:
            self.gone.set()
        finally:
            METER.exit()


def _settle(gone: threading.Event) -> None:
    METER.enter()
    try:
        torch._C._remove_obj_from_tls(_KEY)
        gone.wait(TIMEOUT_S)            # releases the GIL: the device thread drops the pass (at once if it has)
    finally:
        METER.exit()


def install() -> None:
    import torch.autograd
    import torch.autograd.graph

    original = torch.autograd.graph._engine_run_backward
    if getattr(original, "_phantora_fence", False):
        return
    is_compiling = torch.compiler.is_compiling

    def _engine_run_backward(t_outputs: Any, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("accumulate_grad", True) or is_compiling():   # backward(): nothing returned to wait for
            return original(t_outputs, *args, **kwargs)
        token = _Token()
        gone = token.gone
        torch._C._stash_obj_in_tls(_KEY, token)
        del token
        try:
            return original(t_outputs, *args, **kwargs)
        finally:
            _settle(gone)

    _engine_run_backward._phantora_fence = True        # type: ignore[attr-defined]
    _engine_run_backward.__wrapped__ = original        # type: ignore[attr-defined]
    torch.autograd.graph._engine_run_backward = _engine_run_backward
    torch.autograd._engine_run_backward = _engine_run_backward
