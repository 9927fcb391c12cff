"""GPU ops from a thread the program started: not simulated, and said so.

The fake mode and the interceptor are entered on the main thread and reach the autograd engine's threads, which
inherit them; a `threading.Thread` the program starts itself does not. An op such a thread runs on the rank's tensors
still computes its result's shape (the tensors are fake and dispatch to the fake mode themselves) but reaches no
runtime: no kernel, no time, no memory. The simulated step then looks right and is short of that work. So the first
such op of each thread name prints a line on rank 0's stderr (`errors.note_once`, as the stubs' other notes) naming
the thread and the op (docs/stubs.md, "Known limitations"); the op itself runs as before.

Not flagged: the main thread, threads that are not the program's (the autograd engine's C++ threads, seen from
Python as dummy threads) and the stubs' own (named `phantora-...`). A thread started with `_thread.start_new_thread`
is a dummy thread to Python too and is not flagged either.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor

from .errors import note_once

_FAKE_KEY = torch._C._TorchDispatchModeKey.FAKE


def _program_thread() -> threading.Thread | None:
    """The calling thread if the program started it, else None."""
    thread = threading.current_thread()
    if thread is threading.main_thread() or isinstance(thread, threading._DummyThread):
        return None
    if thread.name.startswith("phantora-"):
        return None
    return thread


def _note(thread: threading.Thread, func: Any) -> None:
    note_once(f"program-thread {thread.name}",
              f"thread {thread.name!r} ran {func} on the rank's tensors outside the simulation: GPU ops of threads the "
              f"program starts are not simulated (no time, no memory), so the simulated times and memory leave them "
              f"out (docs/stubs.md, \"Known limitations\")")


def install() -> None:
    """Wrap `FakeTensor.__torch_dispatch__` (reached only where no fake mode is active on the thread; idempotent)."""
    current = FakeTensor.__dict__["__torch_dispatch__"]
    if getattr(current.__func__, "_phantora", False):
        return
    original = current.__func__

    @functools.wraps(original)
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if torch._C._get_dispatch_mode(_FAKE_KEY) is None:
            thread = _program_thread()
            if thread is not None:
                _note(thread, func)
        if kwargs is None:                 # the original's own default, not None
            return original(cls, func, types, args)
        return original(cls, func, types, args, kwargs)

    __torch_dispatch__._phantora = True
    FakeTensor.__torch_dispatch__ = classmethod(__torch_dispatch__)
