"""`torch.cuda` stand-ins: devices, properties, streams, events, synchronisation, memory statistics and RNG state.

`install(ctx)` replaces the functions and classes of `torch.cuda` (and of `torch.cuda.memory`, `torch.cuda.random`,
`torch.cuda.streams`, `torch.cuda.nvtx`, the `torch._C._cuda_*` entry points and `torch.accelerator`'s synchronize and
memory functions) with versions that answer from the simulated device:
- device count `PHANTORA_LOCAL_DEVICES`, current device kept in sync with the C++ device guard;
- properties, name and capability from the GPU preset (`PHANTORA_GPU`), memory size from the preset or
  `PHANTORA_VRAM_BYTES`;
- streams (a subclass of `torch.Stream`) and events whose records, waits and synchronisations become ops for the
  runtime; `Event.elapsed_time` is the difference of the events' virtual completion times;
- memory statistics from the simulated caching allocator;
- RNG state kept per device (seed and offset), as a real 16-byte state tensor.
Nothing here touches a real GPU, also on a CUDA build of torch.
"""

from __future__ import annotations

import contextlib
import pickle
import random
import struct
from typing import Any

import torch
from phantora.engine.ops import Op, OpKind

from . import context
from .clock import METER
from .errors import UnsupportedOpError, user_location

CUDA_TYPE = 1      # c10::DeviceType::CUDA


def _ctx():
    return context.get()


def _index(device: Any = None, optional: bool = True) -> int:
    """A device argument (None, int, str, torch.device, Stream) as an index; None is the current device."""
    if device is None:
        return _ctx().dev.device()
    if isinstance(device, int):
        return _ctx().dev.device() if device < 0 else device
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type not in ("cuda", "meta") and not optional:
            raise ValueError(f"Expected a cuda device, but got: {device}")
        return _ctx().dev.device() if device.index is None else device.index
    if isinstance(device, torch.Stream):
        return device.device_index
    idx = getattr(device, "idx", None)
    if isinstance(idx, int):
        return idx
    raise ValueError(f"Invalid device argument {device!r}")


class _Entry:
    """Brackets a stub entry point for the CPU-time meter."""

    __slots__ = ()

    def __enter__(self):
        METER.enter()
        return self

    def __exit__(self, *exc):
        METER.exit()
        return False


_ENTRY = _Entry()


def _submit(kind: OpKind, **fields: Any) -> None:
    with _ENTRY:
        _ctx().runtime.submit(Op(kind, cpu_delta=METER.claim(), **fields))


def _wait(kind: OpKind, **fields: Any) -> float:
    with _ENTRY:
        return _ctx().runtime.wait(Op(kind, cpu_delta=METER.claim(), **fields))


# ---- devices ---------------------------------------------------------------------------------------------------------

def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return True


def _lazy_init() -> None:
    return None


def init() -> None:
    return None


def _is_in_bad_fork() -> bool:
    return False


def device_count() -> int:
    return _ctx().dev.device_count


def current_device() -> int:
    return _ctx().dev.device()


def set_device(device: Any) -> None:
    idx = _index(device)
    if idx >= 0:
        _check_index(idx)
        _ctx().dev.set_device(idx)


def _check_index(idx: int) -> None:
    n = device_count()
    if not 0 <= idx < n:
        raise RuntimeError(f"CUDA error: invalid device ordinal (device {idx}, the simulated host has {n} GPUs; "
                           f"set PHANTORA_LOCAL_DEVICES)")


def _exchange_device(device: int) -> int:
    prev = current_device()
    if device >= 0:
        set_device(device)
    return prev


class device:
    """Context manager that changes the current device (torch.cuda.device)."""

    def __init__(self, device: Any):
        self.idx = -1 if device is None else _index(device)
        self.prev_idx = -1

    def __enter__(self):
        self.prev_idx = _exchange_device(self.idx)
        return self

    def __exit__(self, *exc):
        if self.prev_idx >= 0:
            set_device(self.prev_idx)
        return False


class device_of(device):
    """Context manager that makes the device of a tensor current."""

    def __init__(self, obj: Any):
        idx = obj.get_device() if getattr(obj, "is_cuda", False) else -1
        super().__init__(idx)


class _DeviceProperties:
    """What torch.cuda.get_device_properties returns, from the GPU preset."""

    def __init__(self, gpu: Any, total_memory: int, index: int):
        major, minor = (int(x) for x in gpu.compute_capability.split("."))
        self.name = gpu.display_name
        self.major = major
        self.minor = minor
        self.total_memory = int(total_memory)
        self.multi_processor_count = int(gpu.sm_count)
        self.L2_cache_size = int(gpu.l2_cache_mib * 2**20)
        self.is_integrated = 0
        self.is_multi_gpu_board = 0
        self.warp_size = 32
        self.max_threads_per_block = 1024
        self.max_threads_per_multi_processor = 2048 if major >= 8 else 1024
        self.regs_per_multiprocessor = 65536
        self.shared_memory_per_block = 49152
        self.shared_memory_per_block_optin = 232448 if major >= 9 else 166912
        self.shared_memory_per_multiprocessor = 233472 if major >= 9 else 167936
        self.clock_rate = int(gpu.boost_clock_mhz * 1000)
        self.memory_clock_rate = 0
        self.memory_bus_width = 0
        self.gcnArchName = "NVIDIA CUDA"
        self.uuid = f"phantora-{gpu.name}-{index}"
        self.pci_bus_id = index
        self.pci_device_id = 0
        self.pci_domain_id = 0

    def __repr__(self) -> str:
        return (f"_CudaDeviceProperties(name='{self.name}', major={self.major}, minor={self.minor}, "
                f"total_memory={self.total_memory // 2**20}MB, multi_processor_count={self.multi_processor_count}, "
                f"uuid={self.uuid}, L2_cache_size={self.L2_cache_size // 2**20}MB)")


def get_device_properties(device: Any = None) -> _DeviceProperties:
    idx = _index(device)
    _check_index(idx)
    ctx = _ctx()
    return _DeviceProperties(ctx.gpu, ctx.runtime.allocator.capacity, idx)


def get_device_name(device: Any = None) -> str:
    return get_device_properties(device).name


def get_device_capability(device: Any = None) -> tuple[int, int]:
    p = get_device_properties(device)
    return p.major, p.minor


def get_arch_list() -> list[str]:
    return [f"sm_{_ctx().gpu.sm_version}"]


def get_gencode_flags() -> str:
    sm = _ctx().gpu.sm_version
    return f"-gencode compute=compute_{sm},code=sm_{sm}"


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return _ctx().gpu.sm_version >= 80


def is_tf32_supported() -> bool:
    return _ctx().gpu.sm_version >= 80


def can_device_access_peer(device: Any, peer_device: Any) -> bool:
    return True


def _zero(device: Any = None) -> int:
    return 0


# ---- streams and events --------------------------------------------------------------------------------------------

class Stream(torch.Stream):
    """A CUDA stream of the simulated device (a `torch.Stream`, so `Tensor.record_stream` accepts it)."""

    def __new__(cls, device: Any = None, priority: int = 0, stream_id: int | None = None,
                device_index: int | None = None, device_type: int | None = None, **kwargs: Any):
        if stream_id is None:
            idx = _index(device)
            stream_id = _ctx().dev.new_stream_id()
        else:
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
        rt = _ctx().runtime
        t = rt.event_time(self.id)
        return t is None or t <= rt.now()

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


# ---- memory ----------------------------------------------------------------------------------------------------------

def _alloc():
    return _ctx().runtime.allocator


def memory_allocated(device: Any = None) -> int:
    return _alloc().allocated.current


def max_memory_allocated(device: Any = None) -> int:
    return _alloc().allocated.peak


def memory_reserved(device: Any = None) -> int:
    return _alloc().reserved.current


def max_memory_reserved(device: Any = None) -> int:
    return _alloc().reserved.peak


def reset_peak_memory_stats(device: Any = None) -> None:
    _alloc().reset_peak()


def reset_accumulated_memory_stats(device: Any = None) -> None:
    _alloc().reset_accumulated()


def memory_stats(device: Any = None) -> dict[str, int]:
    return dict(sorted(_alloc().stats.items()))


def memory_stats_as_nested_dict(device: Any = None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in _alloc().stats.items():
        node = out
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return out


def mem_get_info(device: Any = None) -> tuple[int, int]:
    a = _alloc()
    return a.free_bytes, a.capacity


def empty_cache() -> None:
    _alloc().empty_cache()


def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
    if not 0 <= fraction <= 1:
        raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
    ctx = _ctx()
    total = ctx.extras.setdefault("vram_total", ctx.runtime.allocator.capacity)
    ctx.runtime.allocator.capacity = max(int(total * fraction), 1)
    ctx.runtime.allocator.fraction_limit = True


def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    s = _alloc().stats
    lines = ["|" + "=" * 60 + "|", "|  phantora simulated CUDA memory summary" + " " * 21 + "|",
             "|" + "-" * 60 + "|"]
    for key in ("allocated_bytes.all.current", "allocated_bytes.all.peak", "reserved_bytes.all.current",
                "reserved_bytes.all.peak", "allocation.all.current", "num_ooms"):
        lines.append(f"| {key:<40}{s.get(key, 0):>18} |")
    lines.append("|" + "=" * 60 + "|")
    return "\n".join(lines)


def list_gpu_processes(device: Any = None) -> str:
    return f"GPU:{_index(device)}\nno processes are running"


def get_allocator_backend() -> str:
    return "native"


def _record_memory_history(*args: Any, **kwargs: Any) -> None:
    return None


def _snapshot(device: Any = None) -> dict[str, Any]:
    return {"segments": [], "device_traces": [], "allocator_settings": {}}


def _dump_snapshot(filename: str = "dump_snapshot.pickle") -> None:
    with open(filename, "wb") as f:
        pickle.dump(_snapshot(), f)


# ---- RNG -------------------------------------------------------------------------------------------------------------

class _RngState:
    """Seed and offset per device; the state tensor is the 16 bytes (seed, offset) as PyTorch's CUDA generator."""

    def __init__(self) -> None:
        self.seed: dict[int, int] = {}
        self.offset: dict[int, int] = {}

    def get_seed(self, idx: int) -> int:
        return self.seed.get(idx, 67280421310721)    # PyTorch's default seed


RNG = _RngState()


def _real_byte_tensor(data: bytes) -> torch.Tensor:
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    with unset_fake_temporarily():
        return torch.frombuffer(bytearray(data), dtype=torch.uint8).clone()


def get_rng_state(device: Any = "cuda") -> torch.Tensor:
    idx = _index(device)
    return _real_byte_tensor(struct.pack("<QQ", RNG.get_seed(idx) & (2**64 - 1), RNG.offset.get(idx, 0)))


def get_rng_state_all() -> list[torch.Tensor]:
    return [get_rng_state(i) for i in range(device_count())]


def set_rng_state(new_state: torch.Tensor, device: Any = "cuda") -> None:
    idx = _index(device)
    from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily
    if isinstance(new_state, FakeTensor):
        return
    with unset_fake_temporarily():
        raw = bytes(new_state.detach().cpu().to(torch.uint8).reshape(-1).tolist())
    if len(raw) >= 16:
        seed, offset = struct.unpack("<QQ", raw[:16])
        RNG.seed[idx] = seed
        RNG.offset[idx] = offset


def set_rng_state_all(new_states: Any) -> None:
    for i, state in enumerate(new_states):
        set_rng_state(state, i)


def manual_seed(seed: int) -> None:
    RNG.seed[current_device()] = int(seed)
    RNG.offset[current_device()] = 0


def manual_seed_all(seed: int) -> None:
    for i in range(device_count()):
        RNG.seed[i] = int(seed)
        RNG.offset[i] = 0


def seed() -> None:
    manual_seed(random.getrandbits(63))


def seed_all() -> None:
    manual_seed_all(random.getrandbits(63))


def initial_seed() -> int:
    return RNG.get_seed(current_device())


# ---- NVTX ------------------------------------------------------------------------------------------------------------

class _Nvtx:
    depth = 0


def range_push(msg: str) -> int:
    _Nvtx.depth += 1
    return _Nvtx.depth - 1


def range_pop() -> int:
    if _Nvtx.depth == 0:
        return -1
    _Nvtx.depth -= 1
    return _Nvtx.depth


def range_start(msg: str) -> int:
    return 0


def range_end(range_id: int) -> None:
    return None


def mark(msg: str) -> None:
    return None


@contextlib.contextmanager
def nvtx_range(msg: str, *args: Any, **kwargs: Any):
    range_push(msg)
    try:
        yield
    finally:
        range_pop()


# ---- installation ----------------------------------------------------------------------------------------------------

_CUDA_FUNCS = {
    "is_available": is_available, "is_initialized": is_initialized, "_lazy_init": _lazy_init, "init": init,
    "_is_in_bad_fork": _is_in_bad_fork, "device_count": device_count, "current_device": current_device,
    "set_device": set_device, "_exchange_device": _exchange_device, "_maybe_exchange_device": _exchange_device,
    "device": device, "device_of": device_of, "get_device_properties": get_device_properties,
    "get_device_name": get_device_name, "get_device_capability": get_device_capability,
    "get_arch_list": get_arch_list, "get_gencode_flags": get_gencode_flags, "is_bf16_supported": is_bf16_supported,
    "is_tf32_supported": is_tf32_supported, "can_device_access_peer": can_device_access_peer,
    "Stream": Stream, "ExternalStream": ExternalStream, "Event": Event, "current_stream": current_stream,
    "default_stream": default_stream, "set_stream": set_stream, "StreamContext": StreamContext, "stream": stream,
    "synchronize": synchronize, "CUDAGraph": CUDAGraph, "graph": _cuda_graph_unsupported,
    "make_graphed_callables": _cuda_graph_unsupported, "graph_pool_handle": _cuda_graph_unsupported,
    "is_current_stream_capturing": is_current_stream_capturing,
    "memory_allocated": memory_allocated, "max_memory_allocated": max_memory_allocated,
    "memory_reserved": memory_reserved, "max_memory_reserved": max_memory_reserved,
    "memory_cached": memory_reserved, "max_memory_cached": max_memory_reserved,
    "reset_peak_memory_stats": reset_peak_memory_stats, "reset_max_memory_allocated": reset_peak_memory_stats,
    "reset_max_memory_cached": reset_peak_memory_stats,
    "reset_accumulated_memory_stats": reset_accumulated_memory_stats, "memory_stats": memory_stats,
    "memory_stats_as_nested_dict": memory_stats_as_nested_dict, "mem_get_info": mem_get_info,
    "empty_cache": empty_cache, "set_per_process_memory_fraction": set_per_process_memory_fraction,
    "memory_summary": memory_summary, "list_gpu_processes": list_gpu_processes,
    "get_allocator_backend": get_allocator_backend, "ipc_collect": lambda: None,
    "get_rng_state": get_rng_state, "get_rng_state_all": get_rng_state_all, "set_rng_state": set_rng_state,
    "set_rng_state_all": set_rng_state_all, "manual_seed": manual_seed, "manual_seed_all": manual_seed_all,
    "seed": seed, "seed_all": seed_all, "initial_seed": initial_seed,
    "utilization": _zero, "memory_usage": _zero, "temperature": _zero, "power_draw": _zero, "clock_rate": _zero,
    "current_blas_handle": lambda: 0, "set_sync_debug_mode": lambda debug_mode: None,
    "get_sync_debug_mode": lambda: 0,
}

_MEMORY_FUNCS = ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
                 "memory_cached", "max_memory_cached", "reset_peak_memory_stats", "reset_max_memory_allocated",
                 "reset_max_memory_cached", "reset_accumulated_memory_stats", "memory_stats",
                 "memory_stats_as_nested_dict", "mem_get_info", "empty_cache", "set_per_process_memory_fraction",
                 "memory_summary", "list_gpu_processes", "get_allocator_backend")
_RANDOM_FUNCS = ("get_rng_state", "get_rng_state_all", "set_rng_state", "set_rng_state_all", "manual_seed",
                 "manual_seed_all", "seed", "seed_all", "initial_seed")


def _c_functions() -> dict[str, Any]:
    """torch._C._cuda_* entry points; each a distinct function object."""

    def _cuda_getDeviceCount() -> int:
        return device_count()

    def _cuda_getDevice() -> int:
        return current_device()

    def _cuda_setDevice(idx: int) -> None:
        set_device(idx)

    def _cuda_exchangeDevice(idx: int) -> int:
        return _exchange_device(idx)

    def _cuda_maybeExchangeDevice(idx: int) -> int:
        return _exchange_device(idx)

    def _cuda_synchronize() -> None:
        synchronize()

    def _cuda_init() -> None:
        return None

    def _cuda_isInBadFork() -> bool:
        return False

    def _cuda_getCurrentRawStream(idx: int) -> int:
        return _ctx().dev.stream(idx)

    def _cuda_getArchFlags() -> str:
        return " ".join(get_arch_list())

    def _cuda_emptyCache() -> None:
        empty_cache()

    def _cuda_memoryStats(idx: int) -> dict:
        return memory_stats_as_nested_dict(idx)

    def _cuda_resetPeakMemoryStats(idx: int) -> None:
        reset_peak_memory_stats(idx)

    def _cuda_resetAccumulatedMemoryStats(idx: int) -> None:
        reset_accumulated_memory_stats(idx)

    return {f.__name__: f for f in (
        _cuda_getDeviceCount, _cuda_getDevice, _cuda_setDevice, _cuda_exchangeDevice, _cuda_maybeExchangeDevice,
        _cuda_synchronize, _cuda_init, _cuda_isInBadFork, _cuda_getCurrentRawStream, _cuda_getArchFlags,
        _cuda_emptyCache, _cuda_memoryStats, _cuda_resetPeakMemoryStats, _cuda_resetAccumulatedMemoryStats)}


def install(ctx) -> None:
    """Patch torch.cuda and friends (idempotent)."""
    import torch.cuda
    import torch.cuda.memory
    import torch.cuda.nvtx
    import torch.cuda.random
    import torch.cuda.streams

    if ctx.extras.get("cuda_api_installed"):
        return
    cuda = torch.cuda
    for name, fn in _CUDA_FUNCS.items():
        setattr(cuda, name, fn)
    for name in _MEMORY_FUNCS:
        setattr(cuda.memory, name, _CUDA_FUNCS[name])
    cuda.memory._record_memory_history = _record_memory_history
    cuda.memory._snapshot = _snapshot
    cuda.memory._dump_snapshot = _dump_snapshot
    for name in _RANDOM_FUNCS:
        setattr(cuda.random, name, _CUDA_FUNCS[name])
    cuda.streams.Stream = Stream
    cuda.streams.Event = Event
    cuda.streams.ExternalStream = ExternalStream
    for name, fn in (("range_push", range_push), ("range_pop", range_pop), ("range_start", range_start),
                     ("range_end", range_end), ("mark", mark), ("range", nvtx_range)):
        setattr(cuda.nvtx, name, fn)
    cuda._initialized = True
    for name, fn in _c_functions().items():
        setattr(torch._C, name, fn)
    acc = getattr(torch, "accelerator", None)
    if acc is not None:
        if hasattr(acc, "synchronize"):
            acc.synchronize = lambda device=None: synchronize(device)
        mem = getattr(acc, "memory", None)
        for name in _MEMORY_FUNCS:
            for ns in (acc, mem):
                if ns is not None and hasattr(ns, name):
                    setattr(ns, name, _CUDA_FUNCS[name])
        for ns in (acc, mem):
            if ns is not None and hasattr(ns, "get_memory_info"):
                ns.get_memory_info = mem_get_info
    ctx.extras["cuda_api_installed"] = True
