"""Events, stream waits and synchronisations that reach the fake CUDA device guard, as simulator ops.

`torch.cuda.Event` and `torch.cuda.Stream` are the stubs' own classes (cuda_streams.py). Everything else that
records, waits on or synchronises CUDA events and streams goes through the device guard of the fake CUDA library
(csrc/fake_cuda.cpp): the device-generic `torch.Event` and `torch.Stream` (and `torch.accelerator.current_stream()`,
which returns a `torch.Stream`), and PyTorch's C++ itself (the autograd engine synchronising a backward op's stream
with the stream that made its input). The library calls `on_event` for each; it submits the same ops the stubs'
classes do: a record (EVENT_RECORD), a wait (STREAM_WAIT), a synchronisation (SYNC_EVENT, SYNC_STREAM), and answers
queries and elapsed times from the virtual timeline. Until 2026-11-29 these were no-ops: `torch.Event.elapsed_time`
read 0.0 and a `torch.Stream`'s `wait_stream` ordered nothing.

The guard's event handles are its own counter; each is mapped to an event id of the rank's (`DeviceState`), so the
two kinds of events never share an id in the engine.
"""

from __future__ import annotations

import ctypes
import sys

from phantora.engine.ops import OpKind

RECORD, BLOCK, SYNC_EVENT, SYNC_STREAM, ELAPSED, QUERY_EVENT, QUERY_STREAM, DESTROY = range(8)
NOT_READY, NOT_RECORDED, FAILED = -1, -2, -3

CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                            ctypes.POINTER(ctypes.c_double))

_IDS: dict[int, int] = {}         # guard event handle -> the rank's event id (recorded at least once)
_KEEP: list = []                  # the ctypes callback object, alive as long as the library may call it


def _record(handle: int, stream: int) -> int:
    from .cuda_device import _ctx
    from .cuda_ops import _submit
    eid = _IDS.get(handle)
    if eid is None:
        eid = _IDS[handle] = _ctx().dev.new_event_id()
    _submit(OpKind.EVENT_RECORD, stream=int(stream), arg=eid)
    return 0


def _call(what: int, handle: int, stream: int, out) -> int:
    from .cuda_device import _ctx
    from .cuda_ops import _event_done, _submit, _wait
    if what == RECORD:
        return _record(handle, stream)
    if what == DESTROY:
        _IDS.pop(handle, None)
        return 0
    eid = _IDS.get(handle)
    if what == BLOCK:
        if eid is not None:                      # waiting on an event never recorded waits for nothing
            _submit(OpKind.STREAM_WAIT, stream=int(stream), arg=eid)
        return 0
    if what == SYNC_EVENT:
        if eid is not None:
            _wait(OpKind.SYNC_EVENT, arg=eid)
        return 0
    if what == SYNC_STREAM:
        _wait(OpKind.SYNC_STREAM, stream=int(stream))
        return 0
    if what == QUERY_EVENT:
        return 1 if eid is None or _event_done(eid) else 0
    if what == QUERY_STREAM:
        return 1                                  # as the stubs' Stream.query (docs/stubs.md)
    if what == ELAPSED:
        end = _IDS.get(int(out[0]))
        rt = _ctx().runtime
        t0 = rt.event_time(eid) if eid is not None else None
        t1 = rt.event_time(end) if end is not None else None
        if t0 is None or t1 is None:
            return NOT_RECORDED
        if not (_event_done(eid) and _event_done(end)):
            return NOT_READY
        out[1] = (t1 - t0) * 1000.0
        return 0
    return 0


def on_event(what: int, handle: int, stream: int, device: int, out) -> int:
    """The library's callback (csrc/fake_cuda.cpp `EventCallback`). Never raises into C++: a failure is printed
    and answered with FAILED, which the library raises as a RuntimeError."""
    try:
        return _call(what, int(handle), int(stream), out)
    except BaseException as exc:  # noqa: BLE001 - nothing may unwind through the C++ caller
        print(f"phantora: simulating a CUDA event call failed: {type(exc).__name__}: {exc}", file=sys.stderr,
              flush=True)
        return FAILED


def install(lib) -> None:
    """Route the fake library's event and stream calls to `on_event` (no library: nothing to route)."""
    if lib is None or not hasattr(lib, "phantora_set_event_callback"):
        return
    import atexit
    cb = CALLBACK(on_event)
    _KEEP.append(cb)
    lib.phantora_set_event_callback.argtypes = [CALLBACK]
    lib.phantora_set_event_callback(cb)
    # events destroyed while the interpreter shuts down must not call into it: no-ops from then on
    atexit.register(lib.phantora_set_event_callback, CALLBACK())
