"""At exit, PyTorch's autograd worker threads are let finish before the interpreter finalizes.

After a backward pass the autograd engine's device threads (named `pt_autograd_N`) may still be releasing the graph's
Python objects, which needs the GIL. If the main thread is already finalizing the interpreter, CPython ends such a
thread with `pthread_exit`, and the forced unwind through PyTorch's C++ frames calls `std::terminate`: the process
prints "terminate called without an active exception" and dies of SIGABRT after the program has finished (seen under
load, a few runs in ten). `settle_autograd_threads` (run last by `atexit`) waits, holding the GIL only between short
real sleeps, until those threads have used no CPU for a short window (Linux: their run time in
`/proc/self/task/*/schedstat`), at most a second; elsewhere it does nothing.
"""

from __future__ import annotations

import os

from .clock import REAL


def _autograd_run_time() -> int | None:
    total = 0
    found = False
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return None
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if not f.read().startswith("pt_autograd"):
                    continue
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
            found = True
        except (OSError, ValueError, IndexError):
            continue
    return total if found else None


def settle_autograd_threads(timeout_s: float = 1.0, window_s: float = 0.02) -> None:
    now = REAL["monotonic"]
    deadline = now() + timeout_s
    before = _autograd_run_time()
    while before is not None and now() < deadline:
        REAL["sleep"](window_s)              # releases the GIL: a thread waiting for it runs now
        after = _autograd_run_time()
        if after == before:
            return
        before = after
