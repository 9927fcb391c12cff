"""File locks between the ranks of a simulated run.

The ranks of a simulated run are processes of one machine sharing its files: when a framework takes a file lock
(Hugging Face `datasets` preparing its cache, a tokenizer download guard), one rank gets it and the others poll until
it is free, sleeping between attempts. How long they wait is the other process's real time, and which rank gets the
lock first is a race: charged as virtual time, either would make the simulated numbers change from run to run. So
`filelock`'s `acquire` runs with `clock.free_sleeps()`: its polling advances no virtual time and is not counted as the
framework's host work. (A real job's ranks may or may not contend for the lock, on a shared or a local file
system; the wait is not simulated.)
"""

from __future__ import annotations

import functools
from typing import Any

from .clock import free_sleeps


def patch(module: Any) -> None:
    """Wrap `filelock.BaseFileLock.acquire` (every lock class of the package, and its subclasses elsewhere)."""
    base = getattr(module, "BaseFileLock", None)
    acquire = getattr(base, "acquire", None)
    if acquire is None or getattr(acquire, "_phantora", False):
        return

    @functools.wraps(acquire)
    def wrapped(self, *args: Any, **kwargs: Any) -> Any:
        with free_sleeps():
            return acquire(self, *args, **kwargs)

    wrapped._phantora = True                 # type: ignore[attr-defined]
    base.acquire = wrapped
