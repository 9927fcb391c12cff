"""Virtual time: the `time` module reads and advances the rank's virtual CPU clock, and the CPU-time meter.

After `install(runtime)`:
- `time.perf_counter()`, `time.monotonic()` (and their `_ns` forms) return the rank's virtual CPU time;
- `time.time()` / `time.time_ns()` return a fixed epoch offset plus virtual time (the offset is
  `PHANTORA_EPOCH`, or the real wall-clock time when the rank started);
- `time.sleep(s)` advances the virtual clock by `s` and only yields the processor (no real wait).
`time.process_time` and `time.thread_time` stay real: the meter needs them.

`CpuMeter` charges the framework's own host work between two entries into the stubs (docs/host-cpu.md):
- `model` (the default): the work is *counted* — Python function calls, built-in calls and Python lines run (a CPython
  profile and trace function in C, csrc/host_counter.cpp, active only while the thread is outside the stubs) and aten
  ops dispatched — and priced by the host preset (phantora/hostcpu.py). The counts depend on the program alone: the
  simulated time is the same on any machine, loaded or quiet.
- `measured`: `time.thread_time` read on entry (`enter`) and exit (`exit`), so that the stubs' own work and the
  fake-tensor machinery they run are excluded, minus the calibrated cost of reaching the stubs (`entry_cost`).
Either way the reading is per thread: backward passes run on the autograd engine's device thread.

Every read of the virtual clock first charges the host time the framework spent since the last entry.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import sys
import threading
import time as _time
import functools
from functools import partial
from typing import Callable

from .errors import EngineGone

_real_thread_time = _time.thread_time
_real_sleep = _time.sleep
REAL = {name: getattr(_time, name) for name in (
    "perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns", "time", "time_ns", "sleep", "thread_time")}

ENTRY_FRAMES = 2
"""Python calls that reaching the stubs adds to the counts, charged back on every outermost entry: the stub's own
entry point (a `__torch_dispatch__`, a wrapped `torch.cuda` or `torch.distributed` function, the gc and import hooks)
and `CpuMeter.enter` itself. Each entry point calls `enter` first."""

ENTRY_LINES = 2
"""Python lines that reaching the stubs adds to the counts beyond one per entry frame: `CpuMeter.enter` runs three
before counting stops, each other entry frame one (the line that calls the next). Charged back with the frames."""


class CpuMeter:
    """The framework's host work between stub entries, per thread.

    `enter()` on entry into the stubs ends the thread's current stretch of framework work; `claim()` hands the
    pending host time (seconds) to the op (or clock read) that charges it; `exit()` marks the moment the thread
    leaves. Nested entries (a stub calling another) do nothing. Work before entries that emit nothing (views, host
    ops) stays pending for the next op. In `model` mode the work claimed is also kept as counts, which `take()`
    hands to the op that the runtime issues next on the thread (for the trace; docs/host-cpu.md).
    """

    def __init__(self) -> None:
        self._local = threading.local()
        self.mode = "measured"
        self.costs = None
        self.entry_cost = 0.0
        """`measured` mode: seconds subtracted from every gap between two entries, the cost of reaching the stubs
        themselves (a Python dispatch mode's entry and exit), which a real run does not pay (see
        `interceptor.calibrate_entry_cost`)."""
        self._on = None                # model mode: counting on / off on the calling thread (C, csrc/host_counter.cpp)
        self._off = None
        self._counts_of = None
        self.count_lines = True
        """`model` mode: whether Python lines are counted (a trace function, besides the profile function's calls)."""
        self.dispatch_bias = (0, 0, 0)
        """`model` mode: Python calls, built-in calls and Python lines that a dispatch mode's own machinery adds to
        each aten op dispatched, charged back per `dispatch()` (`interceptor.calibrate_dispatch_counts`)."""
        self.last_counts = (0, 0, 0, 0)
        """`model` mode: the counts of the last claim (calibration): Python calls, built-in calls, dispatches, lines."""

    # -- set-up ------------------------------------------------------------------------------------------------
    def use_model(self, costs) -> None:
        """Count and price the framework's work (`costs`: phantora.hostcpu.HostCosts). Loads the counter library."""
        from . import build
        lib = build.host_counter()
        _skip_lookup_calls(lib)
        hooks = ctypes.PyDLL(lib._name)            # the same library; its switches must run with the GIL held
        on, off = hooks.phantora_hc_on, hooks.phantora_hc_off
        on.argtypes, on.restype, off.argtypes, off.restype = [ctypes.c_int], ctypes.c_int, [], ctypes.c_int
        self._on, self._off = partial(on, 1 if self.count_lines else 0), off
        self._counts_of = lib.phantora_hc_counts
        self.costs = costs
        self.mode = "model"
        pause, resume = hooks.phantora_hc_gc_pause, hooks.phantora_hc_gc_resume
        pause.argtypes, pause.restype, resume.argtypes, resume.restype = [], ctypes.c_int, [], ctypes.c_int
        _GC_SWITCH[:] = [pause, resume]
        if _phantora_gc_hook not in gc.callbacks:
            gc.callbacks.append(_phantora_gc_hook)
        _hook_imports()

    def _loc(self):
        loc = self._local
        if not hasattr(loc, "depth"):
            loc.depth = 0
            loc.pending = 0.0
            loc.last = None
            loc.counts = None          # this thread's counters (model mode), once the profile function is on
            loc.base = (0, 0, 0)       # counts at the last claim (Python calls, built-in calls, lines)
            loc.bias = 0               # entry frames counted since the last claim
            loc.bias_lines = 0         # and their lines
            loc.disp = 0               # aten ops dispatched since the last claim
            loc.taken = [0, 0, 0, 0]   # counts claimed and not yet handed to an op (py, c, disp, lines)
        return loc

    # -- the framework's stretches of work ------------------------------------------------------------------
    def enter(self, frames: int = ENTRY_FRAMES) -> None:
        """Entry into the stubs; `frames`: the Python calls from the framework's frame to this one, inclusive."""
        off = self._off
        if off is not None:
            off()                      # first: nothing the stubs do is counted
        loc = self._loc()
        loc.depth += 1
        if loc.depth > 1:
            return
        if off is not None:
            if loc.counts is None:     # the thread's first entry: counting starts when it leaves
                loc.counts = self._counts_of()
                loc.base = (loc.counts[0], loc.counts[1], loc.counts[2])
            elif frames:
                loc.bias += frames
                loc.bias_lines += frames + ENTRY_LINES
            real = getattr(loc, "real", None)
            if real is not None:
                spent = _real_thread_time() - real
                if spent > UNCOUNTED_S:
                    self._uncounted(loc, spent)
            return
        now = _real_thread_time()
        if loc.last is not None:
            gap = now - loc.last - self.entry_cost
            if gap > 0:
                loc.pending += gap
        loc.last = now

    def counting(self) -> bool:
        """Whether the calling thread's work is counted (model mode, once the thread has entered the stubs)."""
        return self._off is not None and getattr(self._local, "counts", None) is not None

    def outermost(self) -> bool:
        """Whether the thread's current entry into the stubs is its outermost one (the framework called it)."""
        return self._loc().depth == 1

    def dispatch(self) -> None:
        """An aten op reached the dispatcher (called by the interceptor on entry, which has entered the meter). Only
        the framework's ops count: an op the stubs themselves run (exchanging a small tensor's value, printing one)
        reaches the interceptor with the meter already entered, and is their own work."""
        loc = self._loc()
        if loc.depth <= 1:
            loc.disp += 1

    def claim(self) -> float:
        """The pending framework host time of this thread (seconds), reset to 0."""
        loc = self._loc()
        if self._off is None:
            p = loc.pending
            loc.pending = 0.0
            return p
        counts = loc.counts
        if counts is None:
            py = c = lines = 0
        else:
            now_py, now_c, now_lines = counts[0], counts[1], counts[2]
            base = loc.base
            py = now_py - base[0] - loc.bias
            c = now_c - base[1]
            lines = now_lines - base[2] - loc.bias_lines
            loc.base = (now_py, now_c, now_lines)
        loc.bias = 0
        loc.bias_lines = 0
        disp = loc.disp
        loc.disp = 0
        if disp:
            bias = self.dispatch_bias
            py -= disp * bias[0]
            c -= disp * bias[1]
            lines -= disp * bias[2]
        py = py if py > 0 else 0
        c = c if c > 0 else 0
        lines = lines if lines > 0 else 0
        self.last_counts = (py, c, disp, lines)
        if not (py or c or disp or lines):
            return 0.0
        taken = loc.taken
        taken[0] += py
        taken[1] += c
        taken[2] += disp
        taken[3] += lines
        return self.costs.seconds(py, c, disp, lines)

    def take(self) -> tuple[int, int, int, int]:
        """The counts claimed on this thread since the last `take` (model mode), reset: Python calls, built-in
        calls, dispatches, lines."""
        loc = self._loc()
        t = loc.taken
        if not (t[0] or t[1] or t[2] or t[3]):
            return (0, 0, 0, 0)
        loc.taken = [0, 0, 0, 0]
        return (t[0], t[1], t[2], t[3])

    def reset(self) -> None:
        """Forget this thread's pending work and start measuring from now (after the stubs' own setup)."""
        if self._off is not None:
            self._off()                # nothing before the return to the caller is counted
        loc = self._loc()
        loc.pending = 0.0
        loc.depth = 0
        loc.last = _real_thread_time()
        loc.bias = 0
        loc.bias_lines = 0
        loc.disp = 0
        loc.taken = [0, 0, 0, 0]
        loc.real = None
        if self._on is not None:
            if loc.counts is None:
                loc.counts = self._counts_of()
            loc.base = (loc.counts[0], loc.counts[1], loc.counts[2])
            self._on()

    def _uncounted(self, loc, seconds: float) -> None:
        """A stretch of the framework's own work that took this machine far more CPU than its counts price: work
        in built-in code (numpy, PIL, a C extension), which the model prices per Python line and dispatch only. The
        simulated numbers stay what the counts say (they must not depend on this machine); the user is told once,
        for stretches after the first training step (a data set prepared at start-up delays no step)."""
        from .fake import ITERATIONS
        if not ITERATIONS[0] or self.costs is None or loc.counts is None:
            return
        c, base = loc.counts, loc.base
        priced = self.costs.seconds(max(c[0] - base[0], 0), max(c[1] - base[1], 0), loc.disp, max(c[2] - base[2], 0))
        if priced * 20 > seconds:
            return
        from .errors import note_once
        note_once("uncounted", f"the program ran {seconds * 1e3:.0f} ms of CPU work on this machine between two GPU "
                  f"ops that the host model prices at {priced * 1e3:.2f} ms: built-in code (numpy, PIL, a C "
                  f"extension) is priced by the Python lines that call it, not by its own work. If the training "
                  f"host runs such work on this thread, the simulated step is too fast; `--host-cpu measured` "
                  f"times it on this machine (docs/host-cpu.md, \"Work the counts do not see\")")

    def exit(self) -> None:
        loc = self._loc()
        loc.depth -= 1
        if loc.depth <= 0:
            loc.depth = 0
            if self._on is not None:
                loc.real = _real_thread_time()
                self._on()                 # last: the framework's work is counted again
            else:
                loc.last = _real_thread_time()


UNCOUNTED_S = 0.05
"""`model` mode: a stretch of the framework's work between two stub entries that takes this machine more CPU than
this (seconds) and more than 20 times what its counts price gets a note (`CpuMeter._uncounted`)."""

METER = CpuMeter()


def unmetered(fn: Callable) -> Callable:
    """`fn` with its own Python excluded from the framework's host work (the ops it issues still count): a stub
    that stands for C++ or for work a real run does not do. Inside a region Dynamo traces, `fn` is called as it is."""
    if getattr(fn, "__phantora_unmetered__", False):
        return fn
    import torch
    is_compiling = torch.compiler.is_compiling

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        if is_compiling():             # Dynamo traces the function itself (a compiled region's op)
            return fn(*args, **kwargs)
        METER.enter()
        try:
            return fn(*args, **kwargs)
        finally:
            METER.exit()

    wrapped.__phantora_unmetered__ = True   # type: ignore[attr-defined]
    return wrapped

SKIPPED_NAMES = ("__eq__", "__ne__", "__hash__", "_randbelow_with_getrandbits", "_phantora_gc_hook")
"""Functions the counter leaves out, with all they call, because how often they run or what they call depends on
more than the program: containers call the first three while probing keys, as often as the keys' hashes collide, and
those hashes may come from object addresses (see csrc/host_counter.cpp); `random`'s rejection sampling draws until
a draw fits, as often as the (unseeded) generator says; the stubs' gc callback runs when a collection does."""


def _code_name_offset() -> int:
    """Byte offset of `co_name` in a code object of this interpreter (found, and checked on several code objects,
    by looking for the name's address among the object's first words)."""
    def probe_a():
        pass

    def probe_bb(x):
        return x

    codes = [probe_a.__code__, probe_bb.__code__, _code_name_offset.__code__, CpuMeter.claim.__code__]
    width = ctypes.sizeof(ctypes.c_void_p)
    for off in range(width, 64 * width, width):
        if all(ctypes.c_void_p.from_address(id(c) + off).value == id(c.co_name) for c in codes):
            return off
    raise RuntimeError("cannot find co_name in this interpreter's code objects")


_SKIP_KEEP: list = []


def _skip_lookup_calls(lib) -> None:
    names = [sys.intern(n) for n in SKIPPED_NAMES]
    _SKIP_KEEP[:] = names
    array = (ctypes.c_void_p * len(names))(*[id(n) for n in names])
    if lib.phantora_hc_skip_names(_code_name_offset(), array, len(names)) != 0:
        raise RuntimeError("the host-work counter cannot reach this interpreter's PyFrame_GetCode / Py_DecRef")


def _phantora_gc_hook(phase: str, info: dict) -> None:
    """A garbage collection runs at a moment that depends on every thread's allocations, the stubs' included: its
    work (finalizers, weak-reference callbacks) is not counted (model mode). Its name is one the counter skips (this
    function and what it calls count nothing); the counter switches itself off for the collection and back to the
    state it found (csrc/host_counter.cpp), whether the collection started in the framework's code, in the stubs or
    as the stubs switched counting on or off; the meter's depth, raised for the collection, makes the stubs entered
    by a finalizer nested entries, which charge nothing back."""
    loc = METER._loc()
    if phase == "start":
        _GC_SWITCH[0]()
        loc.depth += 1
    else:
        loc.depth -= 1
        _GC_SWITCH[1]()


_GC_SWITCH: list = []
"""The counter library's `phantora_hc_gc_pause` and `phantora_hc_gc_resume` (set by `CpuMeter.use_model`)."""


def _hook_imports() -> None:
    """A module imported for the first time runs importlib's Python, which depends on the files on disk (a cached
    .pyc or not): not counted (model mode). The interpreter looks `_find_and_load` up on importlib at each import."""
    import importlib._bootstrap as bootstrap

    original = bootstrap._find_and_load
    if getattr(original, "_phantora", False):
        return

    def _find_and_load(name, import_):
        METER.enter()
        try:
            return original(name, import_)
        finally:
            METER.exit()

    _find_and_load._phantora = True      # type: ignore[attr-defined]
    bootstrap._find_and_load = _find_and_load


class VirtualClock:
    """The functions that replace those of the `time` module."""

    def __init__(self, runtime_getter: Callable[[], object], epoch: float):
        self._rt = runtime_getter
        self.epoch = epoch
        self._last = 0.0
        self._gone_at: float | None = None

    def now(self) -> float:
        """Virtual time. Reached from the framework through one of the `time` functions `install` puts in place
        (their frame, this one and the meter's: 3)."""
        METER.enter(3)
        try:
            if self._gone_at is not None:
                return self._after_engine()
            rt = self._rt()
            d = METER.claim()
            if d:
                rt.advance_cpu(d)      # type: ignore[attr-defined]
            self._last = rt.now()      # type: ignore[attr-defined]
            return self._last
        except EngineGone:
            # the run is over (an exit handler reads the clock: multiprocessing's managers, atexit hooks):
            # virtual time goes on at the real rate from where it stood
            self._gone_at = REAL["perf_counter"]()
            return self._after_engine()
        finally:
            METER.exit()

    def _after_engine(self) -> float:
        return self._last + (REAL["perf_counter"]() - self._gone_at)

    def perf_counter(self) -> float:
        return self.now()

    def perf_counter_ns(self) -> int:
        return int(self.now() * 1e9)

    def time(self) -> float:
        return self.epoch + self.now()

    def time_ns(self) -> int:
        return int(self.epoch * 1e9) + int(self.now() * 1e9)

    def sleep(self, seconds: float) -> None:
        METER.enter(3)                 # first: the lines that reach the stubs are charged back (ENTRY_LINES)
        try:
            if seconds < 0:
                raise ValueError("sleep length must be non-negative")
            if getattr(FREE_SLEEPS, "depth", 0):
                seconds = 0.0          # a wait for another process of this machine (free_sleeps)
            self._rt().advance_cpu(METER.claim() + float(seconds))    # type: ignore[attr-defined]
        finally:
            _real_sleep(0)
            METER.exit()


CLOCK: VirtualClock | None = None

FREE_SLEEPS = threading.local()
"""Depth of `free_sleeps()` blocks on this thread."""


@contextlib.contextmanager
def free_sleeps():
    """A wait for another process of this machine (a rank holding a file lock): the sleeps that poll for it do not
    advance the virtual clock and the Python that polls is not counted, so how long the other process took in real
    time, and which rank got the lock first, do not reach the simulated time."""
    FREE_SLEEPS.depth = getattr(FREE_SLEEPS, "depth", 0) + 1
    METER.enter(2)
    try:
        yield
    finally:
        METER.exit()
        FREE_SLEEPS.depth -= 1


def host_work(seconds: float) -> None:
    """Charge `seconds` of modelled host compute to the calling thread's rank, after the framework's pending work
    (a stand-in for a host loop that runs on tensors holding no data: DeepSpeed's CPU optimizers)."""
    METER.enter(2)                     # first: the lines that reach the stubs are charged back (ENTRY_LINES)
    try:
        if CLOCK is None or seconds <= 0:
            return
        CLOCK._rt().advance_cpu(METER.claim() + float(seconds))    # type: ignore[attr-defined]
    finally:
        METER.exit()


def host_now(frames: int = 2) -> float:
    """The calling thread's rank's virtual time, after the framework's pending work (a stand-in that starts work
    beside the host and the GPU: DeepSpeed's async I/O, standins/deepspeed.py); `frames`: the calls from the
    framework's frame to this one, inclusive."""
    METER.enter(frames)
    try:
        if CLOCK is None:
            return 0.0
        rt = CLOCK._rt()                                                  # type: ignore[attr-defined]
        rt.advance_cpu(METER.claim())
        return rt.now()
    finally:
        METER.exit()


def host_wait_until(t: float) -> None:
    """Hold the calling thread's rank until virtual time `t`, after the framework's pending work (a wait for such
    work)."""
    METER.enter(2)
    try:
        if CLOCK is None:
            return
        rt = CLOCK._rt()                                                  # type: ignore[attr-defined]
        rt.advance_cpu(METER.claim())
        now = rt.now()
        if t > now:
            # the runtimes scale what advance_cpu charges by [host] cpu_time_scale, a factor on the framework's CPU
            # time: a wait for the storage is not that, so it is charged unscaled (lost only at a scale of 0)
            scale = getattr(rt, "scale", getattr(rt, "cpu_time_scale", 1.0))
            if scale > 0:
                rt.advance_cpu((t - now) / scale)
            else:
                from .errors import note_once
                note_once("storage-wait-scale", "with [host] cpu_time_scale = 0, waits for DeepSpeed's async I/O "
                                                "take no simulated time")
    finally:
        METER.exit()


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

    # each calls clock.now() itself: the meter charges back the same 3 frames for every clock read
    def perf_counter_ns() -> int:
        return int(clock.now() * 1e9)

    def monotonic() -> float:
        return clock.now()

    def monotonic_ns() -> int:
        return int(clock.now() * 1e9)

    def time() -> float:
        return clock.epoch + clock.now()

    def time_ns() -> int:
        return int(clock.epoch * 1e9) + int(clock.now() * 1e9)

    def sleep(seconds: float) -> None:
        clock.sleep(seconds)

    for fn in (perf_counter, perf_counter_ns, monotonic, monotonic_ns, time, time_ns, sleep):
        fn.__doc__ = f"Phantora virtual clock: replaces time.{fn.__name__} (see phantora_stubs.clock)."
        setattr(_time, fn.__name__, fn)
    CLOCK = clock
    return clock
