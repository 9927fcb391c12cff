"""Waits for another thread, not counted as the waiting thread's host work (model mode).

A thread that waits for another (a future's result, a condition, an event, a join, a queue) runs more or less
Python depending on which of the two got there first: `Future.result` waits only if the worker has not finished,
`Condition.wait` loops as often as it wakes, `Future.add_done_callback` runs the callback at once on the caller
when the future is already done, else later on the worker, and a thread pool's `submit` starts a thread or not
depending on whether a worker has marked itself idle yet. Which happens is a race between the processes and threads
of the simulating machine, so counted, it would reach the simulated time (Hugging Face `datasets` resolves a dataset's
files on a thread pool while the main thread waits: its counted work changed from run to run by a few Python calls
and lines). A thread that issues no op runs beside the one that issues ops and delays nothing (docs/host-cpu.md,
"Threads"), so the wait itself costs the waiting thread nothing either: these functions run with counting off, like
the stubs, with what they call (a callback run at once included).
"""

from __future__ import annotations

import concurrent.futures
import concurrent.futures._base as futures_base
import functools
import queue
import threading
from typing import Any, Callable

from .clock import METER

METHODS: tuple[tuple[Any, str], ...] = (
    (threading.Condition, "wait"),
    (threading.Condition, "wait_for"),
    (threading.Condition, "notify"),
    (threading.Condition, "notify_all"),
    (threading.Event, "set"),
    (threading.Event, "wait"),
    (threading.Thread, "join"),
    (threading.Barrier, "wait"),
    (threading.Semaphore, "acquire"),
    (futures_base.Future, "result"),
    (futures_base.Future, "exception"),
    (futures_base.Future, "add_done_callback"),
    (concurrent.futures.ThreadPoolExecutor, "_adjust_thread_count"),
    (queue.Queue, "get"),
    (queue.Queue, "put"),
)
"""The waits, as (class, method name)."""

FUNCTIONS: tuple[str, ...] = ("wait", "as_completed")
"""`concurrent.futures` functions that wait for futures (replaced in `concurrent.futures` and its `_base`)."""


def _uncounted(fn: Callable) -> Callable:
    if getattr(fn, "_phantora", False):
        return fn

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if not METER.counting():       # a thread whose work is not counted stays so
            return fn(*args, **kwargs)
        METER.enter(2)                 # this frame and the meter's, charged back (clock.ENTRY_FRAMES)
        try:
            return fn(*args, **kwargs)
        finally:
            METER.exit()

    wrapped._phantora = True           # type: ignore[attr-defined]
    return wrapped


def _uncounted_generator(fn: Callable) -> Callable:
    """`as_completed` is a generator: each resumption waits, so each runs uncounted."""
    if getattr(fn, "_phantora", False):
        return fn

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if not METER.counting():
            yield from fn(*args, **kwargs)
            return
        METER.enter(2)
        try:
            gen = fn(*args, **kwargs)
        finally:
            METER.exit()
        while True:
            METER.enter(2)
            try:
                item = next(gen)
            except StopIteration:
                return
            finally:
                METER.exit()
            yield item

    wrapped._phantora = True           # type: ignore[attr-defined]
    return wrapped


def install() -> None:
    """Replace the waits (idempotent). Called when the rank sets torch up (fake.py), right after the program's
    `import torch`: the methods are replaced on their classes, so every caller sees them; a module that imported
    `concurrent.futures.wait` or `as_completed` by name before that keeps the original (counted) function."""
    for cls, name in METHODS:
        setattr(cls, name, _uncounted(getattr(cls, name)))
    for name in FUNCTIONS:
        original = getattr(futures_base, name)
        wrap = _uncounted_generator if name == "as_completed" else _uncounted
        replacement = wrap(original)
        setattr(futures_base, name, replacement)
        setattr(concurrent.futures, name, replacement)
