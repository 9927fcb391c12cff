"""`torch.cuda` streams, events and synchronisation, and CUDA graphs (unsupported).

Streams (a subclass of `torch.Stream`) and events whose records, waits and synchronisations become ops for the
runtime; `Event.elapsed_time` is the difference of the events' virtual completion times. A stream keeps the priority
PyTorch's stream pool would give it on the simulated GPU (it is answered, not modelled: the engine does not schedule
kernels by stream priority).
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from phantora.engine.ops import OpKind

from .cuda_device import _ctx, _index, current_device, set_device
from .cuda_ops import _event_done, _submit, _wait
from .errors import UnsupportedOpError, user_location

CUDA_TYPE = 1      # c10::DeviceType::CUDA

# Stream priorities. cudaDeviceGetStreamPriorityRange answers (least, greatest) = (0, -5) on sm_70 and later GPUs
# (Volta to Hopper and Blackwell, CUDA 11 and 12): six levels. PyTorch pools streams at no more than
# max_compile_time_stream_priorities = 4 of them (c10/cuda/CUDAStream.h), so a pooled stream has priority 0, -1, -2
# or -3: getStreamFromPool(priority) takes the pool std::clamp(-priority, 0, max_stream_priorities - 1) (PyTorch
# #143849; before it a positive priority raised), and Stream.priority is cudaStreamGetPriority of that stream.
# Stream.priority_range() answers (0, max(-4 + 1, -5)) = (0, -3).
CUDA_STREAM_PRIORITY_RANGE = (0, -5)
MAX_COMPILE_TIME_STREAM_PRIORITIES = 4
MAX_STREAM_PRIORITIES = min(CUDA_STREAM_PRIORITY_RANGE[0] - CUDA_STREAM_PRIORITY_RANGE[1] + 1,
                            MAX_COMPILE_TIME_STREAM_PRIORITIES)
_PRIORITIES: dict[int, int] = {}     # stream id -> priority of the pooled streams made with one other than 0


def pool_priority(priority: int) -> int:
    """The priority of the pooled stream `torch.cuda.Stream(priority=priority)` gets (c10/cuda/CUDAStream.cpp,
    getStreamFromPool): out-of-range values are mapped to the nearest level PyTorch pools."""
    return -min(max(-int(priority), 0), MAX_STREAM_PRIORITIES - 1)


# ---- streams and events --------------------------------------------------------------------------------------------

class Stream(torch.Stream):
    """A CUDA stream of the simulated device (a `torch.Stream`, so `Tensor.record_stream` accepts it)."""

    def __new__(cls, device: Any = None, priority: int = 0, stream_id: int | None = None,
                device_index: int | None = None, device_type: int | None = None, **kwargs: Any):
        if stream_id is None:
            idx = _index(device)
            stream_id = _ctx().dev.new_stream_id()
            # THCPStream_pynew parses the priority as a C int. Only here, for a new stream: rebuilding an existing
            # one (`current_stream()`, hot in FSDP2) runs the lines it ran before priorities were kept, which the
            # host model counts (this stand-in's Python runs where a GPU run runs C++: docs/host-cpu.md)
            level = pool_priority(operator.index(priority))
            if level:
                _PRIORITIES[int(stream_id)] = level
        else:       # an existing stream (unpack3): its own priority, whatever `priority` says
            idx = device_index if device_index is not None else _index(device)
        self = super().__new__(cls, stream_id=int(stream_id), device_index=int(idx), device_type=CUDA_TYPE)
        return self

    def __init__(self, *args: Any, **kwargs: Any):
        pass

    @property
    def cuda_stream(self) -> int:
        return self.stream_id

    @property
    def device(self) -> torch.device:
        return torch.device("cuda", self.device_index)

    @property
    def priority(self) -> int:
        """cudaStreamGetPriority: the pooled level it was made at; 0 for the default stream, a stream of another
        origin (an external stream, one the C++ guard made) and a stream made with priority 0 or above."""
        return _PRIORITIES.get(int(self.stream_id), 0)

    @staticmethod
    def priority_range() -> tuple[int, int]:
        """(least, greatest) priority PyTorch supports on the device: (0, -3) (see MAX_STREAM_PRIORITIES)."""
        return (CUDA_STREAM_PRIORITY_RANGE[0], -(MAX_STREAM_PRIORITIES - 1))

    def wait_event(self, event: "Event") -> None:
        event.wait(self)

    def wait_stream(self, stream: "Stream") -> None:
        self.wait_event(stream.record_event())

    def record_event(self, event: "Event | None" = None) -> "Event":
        if event is None:
            event = Event()
        event.record(self)
        return event

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        _wait(OpKind.SYNC_STREAM, stream=self.stream_id)

    def __enter__(self):
        self._ctx_prev = current_stream(self.device_index)
        set_stream(self)
        return self

    def __exit__(self, *exc):
        set_stream(self._ctx_prev)
        return False

    def __repr__(self) -> str:
        return f"<torch.cuda.Stream device=cuda:{self.device_index} cuda_stream={self.stream_id:#x}>"


class ExternalStream(Stream):
    def __new__(cls, stream_ptr: int, device: Any = None, **kwargs: Any):
        if kwargs.get("priority", 0):        # THCPStream_pynew's check for a stream_ptr
            raise RuntimeError("Priority was explicitly set for a external stream")
        return super().__new__(cls, device=device, stream_id=int(stream_ptr))


def _as_stream(s: Any) -> Stream:
    if isinstance(s, Stream):
        return s
    return Stream(stream_id=s.stream_id, device_index=s.device_index)


def current_stream(device: Any = None) -> Stream:
    idx = _index(device)
    return Stream(stream_id=_ctx().dev.stream(idx), device_index=idx)


def default_stream(device: Any = None) -> Stream:
    return Stream(stream_id=0, device_index=_index(device))


def set_stream(stream: Any) -> None:
    if stream is None:
        return
    _ctx().dev.set_stream(stream.device_index, stream.stream_id)


class StreamContext:
    """`with torch.cuda.stream(s):` makes `s` the current stream (and its device the current device)."""

    def __init__(self, stream: Any):
        self.stream = stream
        self.src_prev = None
        self.prev_device = -1

    def __enter__(self):
        if self.stream is None:
            return self
        self.prev_device = current_device()
        if self.stream.device_index != self.prev_device:
            set_device(self.stream.device_index)
        self.src_prev = current_stream(self.stream.device_index)
        set_stream(self.stream)
        return self

    def __exit__(self, *exc):
        if self.stream is None:
            return False
        set_stream(self.src_prev)
        if self.prev_device >= 0 and self.prev_device != self.stream.device_index:
            set_device(self.prev_device)
        return False


def stream(stream: Any) -> StreamContext:
    return StreamContext(stream)


class Event:
    """A CUDA event: records, waits and synchronisations become ops; times come from the virtual timeline."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False,
                 external: bool = False):
        self.enable_timing = enable_timing
        self.blocking = blocking
        self.id = _ctx().dev.new_event_id()
        self.recorded = False

    def record(self, stream: Any = None) -> None:
        if stream is None:
            stream = current_stream()
        _submit(OpKind.EVENT_RECORD, stream=stream.stream_id, arg=self.id)
        self.recorded = True

    def wait(self, stream: Any = None) -> None:
        if not self.recorded:
            return
        if stream is None:
            stream = current_stream()
        _submit(OpKind.STREAM_WAIT, stream=stream.stream_id, arg=self.id)

    def query(self) -> bool:
        if not self.recorded:
            return True
        return _event_done(self.id)

    def synchronize(self) -> None:
        if self.recorded:
            _wait(OpKind.SYNC_EVENT, arg=self.id)

    def elapsed_time(self, end_event: "Event") -> float:
        """Milliseconds between this event and `end_event` on the virtual timeline."""
        if not (self.enable_timing and end_event.enable_timing):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'.")
        rt = _ctx().runtime
        t0, t1 = rt.event_time(self.id), rt.event_time(end_event.id)
        if not self.recorded or not end_event.recorded or t0 is None or t1 is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        if not (_event_done(self.id) and _event_done(end_event.id)):
            # cudaEventElapsedTime of an event the GPU has not reached: cudaErrorNotReady
            raise RuntimeError("CUDA error: device not ready (an event of elapsed_time has not completed: "
                               "synchronize on it first)")
        return (t1 - t0) * 1000.0

    def ipc_handle(self):
        raise UnsupportedOpError("phantora: CUDA IPC event handles are not simulated")

    @property
    def cuda_event(self) -> int:
        return self.id

    @property
    def event_id(self) -> int:
        return self.id

    def __repr__(self) -> str:
        return f"<torch.cuda.Event {self.id:#x}>" if self.recorded else "<torch.cuda.Event uninitialized>"


def synchronize(device: Any = None) -> None:
    _wait(OpKind.SYNC_DEVICE)


def _cuda_graph_unsupported(*args: Any, **kwargs: Any):
    raise UnsupportedOpError(f"phantora does not simulate CUDA graphs (called at {user_location(2)}); "
                             "disable CUDA graphs in the simulated run")


class CUDAGraph:
    def __init__(self, *args: Any, **kwargs: Any):
        _cuda_graph_unsupported()


def is_current_stream_capturing() -> bool:
    return False
