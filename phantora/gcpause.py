"""`gc_paused()`: the cyclic garbage collector off for a block, restored after it.

The engine's hot loops (replay, in-memory simulation, building op objects from a trace) allocate an object or two
per op and make no reference cycles worth collecting; left on, the collector scans those objects over and over and
costs about a third of a replay's time.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def gc_paused() -> Iterator[None]:
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
