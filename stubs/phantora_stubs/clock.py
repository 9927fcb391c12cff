"""Virtual time: the `time` module reads and advances the rank's virtual CPU clock, and the CPU-time meter.

After `install(runtime)`:
- `time.perf_counter()`, `time.monotonic()` (and their `_ns` forms) return the rank's virtual CPU time;
- `time.time()` / `time.time_ns()` return a fixed epoch offset plus virtual time (the offset is
  `PHANTORA_EPOCH`, or the real wall-clock time when the rank started);
- `time.sleep(s)` advances the virtual clock by `s` and only yields the processor (no real wait).
`time.process_time` and `time.thread_time` stay real: the meter needs them.

`CpuMeter` measures the framework's own CPU time between two entries into the stubs, with `time.thread_time`
read on entry (`enter`) and on exit (`exit`), so that the stubs' own work and the fake-tensor machinery they run
are excluded. The reading is per thread: backward passes run on the autograd engine's device thread.

Every read of the virtual clock first charges the CPU time the framework spent since the last entry.
"""

from __future__ import annotations

import threading
import time as _time
from typing import Callable

_real_thread_time = _time.thread_time
_real_sleep = _time.sleep
REAL = {name: getattr(_time, name) for name in (
    "perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns", "time", "time_ns", "sleep", "thread_time")}


class CpuMeter:
    """Framework CPU time between stub entries, per thread.

    `enter()` on entry into the stubs adds the thread CPU time since the thread last left them to the thread's
    pending time; `claim()` hands the pending time to the op (or clock read) that charges it; `exit()` marks the
    moment the thread leaves. Nested entries (a stub calling another) measure nothing. Time taken on entries that
    emit nothing (views, host ops) stays pending for the next op.
    """

    def __init__(self) -> None:
        self._local = threading.local()
        self.entry_cost = 0.0
        """Seconds subtracted from every gap between two entries: the cost of reaching the stubs themselves (a
        Python dispatch mode's entry and exit), which a real run does not pay (see `interceptor.calibrate_entry_cost`)."""

    def _loc(self):
        loc = self._local
        if not hasattr(loc, "depth"):
            loc.depth = 0
            loc.pending = 0.0
            loc.last = None
        return loc

    def enter(self) -> None:
        loc = self._loc()
        loc.depth += 1
        if loc.depth > 1:
            return
        now = _real_thread_time()
        if loc.last is not None:
            gap = now - loc.last - self.entry_cost
            if gap > 0:
                loc.pending += gap
        loc.last = now

    def claim(self) -> float:
        """The pending framework CPU time of this thread, reset to 0."""
        loc = self._loc()
        p = loc.pending
        loc.pending = 0.0
        return p

    def reset(self) -> None:
        """Forget this thread's pending time and start measuring from now (after the stubs' own setup)."""
        loc = self._loc()
        loc.pending = 0.0
        loc.depth = 0
        loc.last = _real_thread_time()

    def exit(self) -> None:
        loc = self._loc()
        loc.depth -= 1
        if loc.depth <= 0:
            loc.depth = 0
            loc.last = _real_thread_time()


METER = CpuMeter()


class VirtualClock:
    """The functions that replace those of the `time` module."""

    def __init__(self, runtime_getter: Callable[[], object], epoch: float):
        self._rt = runtime_getter
        self.epoch = epoch

    def now(self) -> float:
        rt = self._rt()
        METER.enter()
        try:
            d = METER.claim()
            if d:
                rt.advance_cpu(d)      # type: ignore[attr-defined]
            return rt.now()            # type: ignore[attr-defined]
        finally:
            METER.exit()

    def perf_counter(self) -> float:
        return self.now()

    def perf_counter_ns(self) -> int:
        return int(self.now() * 1e9)

    def time(self) -> float:
        return self.epoch + self.now()

    def time_ns(self) -> int:
        return int(self.epoch * 1e9) + int(self.now() * 1e9)

    def sleep(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("sleep length must be non-negative")
        rt = self._rt()
        METER.enter()
        try:
            rt.advance_cpu(METER.claim() + float(seconds))    # type: ignore[attr-defined]
        finally:
            _real_sleep(0)
            METER.exit()


CLOCK: VirtualClock | None = None


def install(runtime_getter: Callable[[], object], epoch: float | None = None) -> VirtualClock:
    """Replace the `time` module's clocks with the virtual ones (idempotent)."""
    global CLOCK
    if CLOCK is not None:
        return CLOCK
    # Modules that keep a private reference to a clock for real timeouts must bind the real one first.
    import queue  # noqa: F401
    import selectors  # noqa: F401
    import subprocess  # noqa: F401
    import threading as _threading  # noqa: F401

    clock = VirtualClock(runtime_getter, REAL["time"]() if epoch is None else float(epoch))

    # Each replacement is a distinct function object (some libraries index functions by identity).
    def perf_counter() -> float:
        return clock.now()

    def perf_counter_ns() -> int:
        return clock.perf_counter_ns()

    def monotonic() -> float:
        return clock.now()

    def monotonic_ns() -> int:
        return clock.perf_counter_ns()

    def time() -> float:
        return clock.time()

    def time_ns() -> int:
        return clock.time_ns()

    def sleep(seconds: float) -> None:
        clock.sleep(seconds)

    for fn in (perf_counter, perf_counter_ns, monotonic, monotonic_ns, time, time_ns, sleep):
        fn.__doc__ = f"Phantora virtual clock: replaces time.{fn.__name__} (see phantora_stubs.clock)."
        setattr(_time, fn.__name__, fn)
    CLOCK = clock
    return clock
