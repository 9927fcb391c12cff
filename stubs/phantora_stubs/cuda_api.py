"""`torch.cuda` stand-ins: devices, properties, streams, events, synchronisation, memory statistics and RNG state.

`install(ctx)` replaces the functions and classes of `torch.cuda` (and of `torch.cuda.memory`, `torch.cuda.random`,
`torch.cuda.streams`, `torch.cuda.nvtx`, the `torch._C._cuda_*` entry points and `torch.accelerator`'s synchronize and
memory functions) with versions that answer from the simulated device:
- device count `PHANTORA_LOCAL_DEVICES`, current device kept in sync with the C++ device guard;
- properties, name and capability from the GPU preset (`PHANTORA_GPU`), memory size from the preset or
  `PHANTORA_VRAM_BYTES`;
- streams (a subclass of `torch.Stream`) and events whose records, waits and synchronisations become ops for the
  runtime; `Event.elapsed_time` is the difference of the events' virtual completion times;
- memory statistics from the simulated caching allocator (every key of torch.cuda.memory_stats, per pool),
  snapshots of its segments, raw allocations through it;
- `torch.cuda.default_generators`: one generator per device keeping seed and offset, whose state is the 16-byte
  tensor of a CUDA generator; the torch.cuda RNG functions go through them;
- on a CPU-only torch, the versions a CUDA build reports (CUDA, cuDNN, NCCL: `_install_versions`);
- NVML queries fail as torch's do without nvidia-ml-py.
Nothing here touches a real GPU, also on a CUDA build of torch. docs/stubs.md lists how each query is answered.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
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
        self.uuid = _DeviceUuid(f"phantora-{gpu.name}-{index}")
        self.pci_bus_id = index
        self.pci_device_id = 0
        self.pci_domain_id = 0

    def __repr__(self) -> str:
        return (f"_CudaDeviceProperties(name='{self.name}', major={self.major}, minor={self.minor}, "
                f"total_memory={self.total_memory // 2**20}MB, multi_processor_count={self.multi_processor_count}, "
                f"uuid={self.uuid}, L2_cache_size={self.L2_cache_size // 2**20}MB)")


class _DeviceUuid:
    """The device's UUID as torch shows it (`_CUuuid`: 16 `bytes`, printed as 8-4-4-4-12 hex digits); a fixed
    name-based UUID per simulated device."""

    def __init__(self, name: str):
        import uuid
        self.bytes = uuid.uuid5(uuid.NAMESPACE_DNS, name).bytes

    def __str__(self) -> str:
        h = self.bytes.hex()
        return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"

    __repr__ = __str__

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, _DeviceUuid) and other.bytes == self.bytes

    def __hash__(self) -> int:
        return hash(self.bytes)


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


def memory_stats(device: Any = None) -> "collections.OrderedDict[str, int]":
    """The flat, sorted statistics of the caching allocator, as torch.cuda.memory_stats() returns them (an
    OrderedDict of every key a CUDA build reports; values from the simulated allocator)."""
    return collections.OrderedDict(sorted(_alloc().stats.items()))


def memory_stats_as_nested_dict(device: Any = None) -> dict[str, Any]:
    """The statistics nested as `torch._C._cuda_memoryStats` returns them (stat -> pool -> metric)."""
    out: dict[str, Any] = {}
    for key, value in _alloc().stats.items():
        node = out
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return out


def _segments() -> list[dict[str, Any]]:
    """The segments of the simulated allocator as torch.cuda.memory_snapshot() lists them (mapped blocks only;
    no stack frames: allocation history is not recorded)."""
    a = _alloc()
    heads: dict[int, Any] = {}
    blocks = list(getattr(a, "_live", {}).values())
    for fl in getattr(a, "_free", {}).values():
        blocks.extend(b for _, _, b in fl.items)
    for b in blocks:
        while b.prev is not None:
            b = b.prev
        heads[id(b)] = b
    device_index = current_device()
    out = []
    for head in sorted(heads.values(), key=lambda b: b.addr):
        seg_blocks, b = [], head
        while b is not None:
            if b.mapped:
                seg_blocks.append(b)
            b = b.next
        if not seg_blocks:
            continue
        allocated = sum(b.size for b in seg_blocks if b.allocated)
        out.append({
            "device": device_index, "address": seg_blocks[0].addr, "total_size": sum(b.size for b in seg_blocks),
            "allocated_size": allocated, "active_size": allocated,
            "requested_size": sum(b.requested for b in seg_blocks if b.allocated),
            "stream": head.stream, "segment_type": "small" if head.small else "large",
            "segment_pool_id": (0, 0), "is_expandable": bool(head.expandable), "frames": [],
            "blocks": [{"address": b.addr, "size": b.size, "requested_size": b.requested if b.allocated else 0,
                        "state": "active_allocated" if b.allocated else "inactive", "frames": []}
                       for b in seg_blocks],
        })
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


def list_gpu_processes(device: Any = None) -> str:
    return f"GPU:{_index(device)}\nno processes are running"


def get_allocator_backend() -> str:
    return "native"


def _record_memory_history(*args: Any, **kwargs: Any) -> None:
    return None


def _snapshot(device: Any = None, augment_with_fx_traces: bool = False) -> dict[str, Any]:
    a = _alloc()
    conf = getattr(a, "config", None)
    settings = {"PYTORCH_CUDA_ALLOC_CONF": conf.to_text() if conf is not None else "",
                "max_split_size": -1, "garbage_collection_threshold": 0.0,
                "expandable_segments": bool(getattr(conf, "expandable_segments", False)),
                "roundup_power2_divisions": {}}
    return {"segments": _segments(), "device_traces": [[] for _ in range(device_count())],
            "allocator_settings": settings, "external_annotations": []}


def memory_snapshot(mempool_id: Any = None, include_traces: bool = True) -> list[dict[str, Any]]:
    return _segments()


def _memory_fraction(device: Any = None) -> float:
    ctx = _ctx()
    total = ctx.extras.get("vram_total")
    if total is None:
        return 1.0
    return ctx.runtime.allocator.capacity / total


def get_per_process_memory_fraction(device: Any = None) -> float:
    return _memory_fraction(device)


_HOST_STATS = ("allocations", "allocated_bytes", "active_requests", "active_bytes")


def host_memory_stats_as_nested_dict() -> dict[str, Any]:
    """The pinned host allocator's statistics (`torch._C._cuda_hostMemoryStats`): page-locked host memory is plain
    host memory here, so every count is 0."""
    out: dict[str, Any] = {k: {"current": 0, "peak": 0, "allocated": 0, "freed": 0} for k in _HOST_STATS}
    out["num_host_alloc"] = 0
    out["num_host_free"] = 0
    for k in ("host_alloc_time", "host_free_time"):
        out[k] = {"total": 0, "max": 0, "min": 0, "count": 0, "avg": 0}
    return out


def host_memory_stats() -> "collections.OrderedDict[str, int]":
    flat: list[tuple[str, int]] = []
    for k, v in host_memory_stats_as_nested_dict().items():
        if isinstance(v, dict):
            flat.extend((f"{k}.{m}", x) for m, x in v.items())
        else:
            flat.append((k, v))
    return collections.OrderedDict(sorted(flat))


def _raw_alloc(nbytes: int, stream: int = 0) -> int:
    """`torch.cuda.caching_allocator_alloc`: a block of the simulated allocator (an ALLOC op like a tensor's);
    returns its fake device address."""
    ctx = _ctx()
    with _ENTRY:
        block = -next(_RAW_IDS)       # negative ids: never a tensor storage's
        sid = int(stream) if stream else ctx.dev.stream()
        try:
            rounded = ctx.runtime.allocator.alloc(int(nbytes), block, sid)
        except Exception as exc:  # DeviceOutOfMemory
            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {int(nbytes)} bytes "
                                         f"({exc})") from None
        ctx.runtime.submit(Op(OpKind.ALLOC, stream=sid, nbytes=int(nbytes), arg=block, mem=rounded,
                              cpu_delta=METER.claim()))
        addr = ctx.runtime.allocator._live[block].addr
        _RAW_BLOCKS[addr] = (block, int(nbytes))
    return addr


def _raw_delete(ptr: int) -> None:
    ctx = _ctx()
    entry = _RAW_BLOCKS.pop(int(ptr), None)
    if entry is None:
        raise RuntimeError("invalid device pointer: " + hex(int(ptr)))
    block, nbytes = entry
    with _ENTRY:
        rounded = ctx.runtime.allocator.free(block)
        ctx.runtime.submit(Op(OpKind.FREE, nbytes=nbytes, arg=block, mem=rounded, cpu_delta=METER.claim()))


_RAW_IDS = itertools.count(1)
_RAW_BLOCKS: dict[int, tuple[int, int]] = {}


def caching_allocator_alloc(size: int, device: Any = None, stream: Any = None) -> int:
    idx = _index(device)
    if stream is None:
        stream = current_stream(idx)
    if isinstance(stream, torch.Stream):
        stream = stream.stream_id
    if not isinstance(stream, int):
        raise TypeError("Invalid type for stream argument, must be `torch.cuda.Stream` or `int` representing a "
                        "pointer to an existing stream")
    return _raw_alloc(size, stream)


def caching_allocator_delete(mem_ptr: int) -> None:
    _raw_delete(mem_ptr)


def _dump_snapshot(filename: str = "dump_snapshot.pickle") -> None:
    with open(filename, "wb") as f:
        pickle.dump(_snapshot(), f)


# ---- RNG -------------------------------------------------------------------------------------------------------------

DEFAULT_SEED = 67280421310721          # PyTorch's default_rng_seed_val


class CudaGenerator(torch.Generator):
    """A CUDA generator of the simulated device (one per device in `torch.cuda.default_generators`).

    Its state is what PyTorch's CUDA (Philox) generator keeps, the seed and the offset, and `get_state()` is the same
    16-byte uint8 tensor (seed, offset as little-endian 64-bit integers). `graphsafe_get_state()` / `clone_state()`
    return a generator holding a copy of the state, `graphsafe_set_state()` takes one back. Random kernels on fake
    tensors do not advance the offset (no numbers are drawn). The object is a `torch.Generator`, so it can be passed
    as `generator=` to random ops (their fake kernels ignore it)."""

    def __new__(cls, device: Any = None):
        self = super().__new__(cls, device="cpu")
        return self

    def __init__(self, device: Any = None):
        self._index = _index(device)
        self._seed = DEFAULT_SEED
        self._offset = 0

    @property
    def device(self) -> torch.device:
        return torch.device("cuda", self._index)

    def get_state(self) -> torch.Tensor:
        return _real_byte_tensor(struct.pack("<Qq", self._seed & (2**64 - 1), self._offset))

    def set_state(self, new_state: torch.Tensor) -> "CudaGenerator":
        raw = _state_bytes(new_state)
        if raw is not None:
            if len(raw) != 16:
                raise RuntimeError(f"RNG state is wrong size: expected 16 bytes, got {len(raw)}")
            self._seed, self._offset = struct.unpack("<Qq", raw)
        return self

    def manual_seed(self, seed: int) -> "CudaGenerator":
        self._seed = int(seed) & (2**64 - 1)
        self._offset = 0
        return self

    def seed(self) -> int:
        self.manual_seed(random.getrandbits(63))
        return self._seed

    def initial_seed(self) -> int:
        return self._seed

    def get_offset(self) -> int:
        return self._offset

    def set_offset(self, offset: int) -> "CudaGenerator":
        self._offset = int(offset)
        return self

    def clone_state(self) -> "CudaGenerator":
        g = CudaGenerator(self._index)
        g._seed, g._offset = self._seed, self._offset
        return g

    graphsafe_get_state = clone_state

    def graphsafe_set_state(self, state: "CudaGenerator") -> "CudaGenerator":
        if not isinstance(state, CudaGenerator):
            raise RuntimeError("graphsafe_set_state expects the state of a CUDA generator")
        self._seed, self._offset = state._seed, state._offset
        return self

    def __getstate__(self):
        return {"index": self._index, "seed": self._seed, "offset": self._offset}

    def __setstate__(self, st):
        self._index, self._seed, self._offset = st["index"], st["seed"], st["offset"]

    def __reduce__(self):
        return (CudaGenerator, (self._index,), self.__getstate__())

    def __repr__(self) -> str:
        return f"<torch._C.Generator object (cuda:{self._index}) at {id(self):#x}>"


def _state_bytes(new_state: Any) -> bytes | None:
    """The bytes of a uint8 state tensor: a real one, or a fake one whose value the host knows (a state from
    get_state() that the program cloned or copied; values.py); None for a fake one without a value."""
    from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily

    from .values import VALUES
    if not isinstance(new_state, torch.Tensor) or new_state.dtype != torch.uint8:
        raise TypeError("RNG state must be a torch.ByteTensor")
    if isinstance(new_state, FakeTensor):
        new_state = VALUES.get(new_state)
        if new_state is None:
            return None
    with unset_fake_temporarily():
        return bytes(new_state.detach().cpu().reshape(-1).tolist())


def _real_byte_tensor(data: bytes) -> torch.Tensor:
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    with unset_fake_temporarily():
        return torch.frombuffer(bytearray(data), dtype=torch.uint8).clone()


def _generators() -> tuple:
    gens = _ctx().extras.get("cuda_generators")
    if gens is None:
        gens = _ctx().extras["cuda_generators"] = tuple(CudaGenerator(i) for i in range(device_count()))
    return gens


def _generator(device: Any = "cuda") -> CudaGenerator:
    idx = _index(device)
    _check_index(idx)
    return _generators()[idx]


def get_rng_state(device: Any = "cuda") -> torch.Tensor:
    return _generator(device).get_state()


def get_rng_state_all() -> list[torch.Tensor]:
    return [g.get_state() for g in _generators()]


def set_rng_state(new_state: torch.Tensor, device: Any = "cuda") -> None:
    _generator(device).set_state(new_state)


def set_rng_state_all(new_states: Any) -> None:
    for i, state in enumerate(new_states):
        set_rng_state(state, i)


def manual_seed(seed: int) -> None:
    _generator(current_device()).manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    for g in _generators():
        g.manual_seed(int(seed))


def seed() -> None:
    _generator(current_device()).seed()


def seed_all() -> None:
    s = random.getrandbits(63)
    for g in _generators():
        g.manual_seed(s)


def initial_seed() -> int:
    return _generator(current_device()).initial_seed()


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


# ---- software versions, NVML --------------------------------------------------------------------------------------

# What a CPU-only torch lacks, answered as the CUDA build of the release the project measures on its H100s does:
# torch 2.11.0 from PyPI, built with CUDA 13.0 and pinned to cuDNN 9.19.0 and NCCL 2.28.9 (its wheel's requirements;
# the NCCL version is also what groundtruth/nccl/ recorded). A CUDA build of torch answers with its own.
CUDA_VERSION = "13.0"
CUDA_COMPILED_VERSION = 13000          # CUDA_VERSION macro: major * 1000 + minor * 10
CUDNN_VERSION = 91900                  # cuDNN 9.19.0: major * 10000 + minor * 100 + patch
NCCL_VERSION = (2, 28, 9)


def nccl_version_code() -> int:
    """`torch._C._nccl_version()`: major << 32 | minor << 16 | patch, as torch.cuda.nccl.version() decodes it."""
    major, minor, patch = NCCL_VERSION
    return (major << 32) | (minor << 16) | patch


def _nccl_unsupported(name: str):
    def call(*args: Any, **kwargs: Any):
        raise UnsupportedOpError(f"phantora does not simulate torch.cuda.nccl.{name} (single-process multi-GPU "
                                 f"NCCL, called at {user_location(2)}); use torch.distributed collectives")
    call.__name__ = f"_nccl_{name}"
    return call


def _nvml_missing(*args: Any, **kwargs: Any):
    """NVML queries (utilization, temperature, power draw, clock rate, memory usage, device memory used): the
    simulated GPU has no NVML, so they fail as torch's do on a machine without nvidia-ml-py."""
    raise ModuleNotFoundError("nvidia-ml-py does not seem to be installed or it can't be imported.")


class _CudaRuntime:
    """`torch.cuda.cudart()`: the CUDA runtime calls scripts make through it (profiler ranges for nsys, host
    registration), each answering cudaSuccess."""

    class cudaError:
        success = 0

    @staticmethod
    def cudaProfilerStart() -> int:
        return 0

    @staticmethod
    def cudaProfilerStop() -> int:
        return 0

    @staticmethod
    def cudaHostRegister(ptr: int, size: int, flags: int) -> int:
        return 0

    @staticmethod
    def cudaHostUnregister(ptr: int) -> int:
        return 0

    @staticmethod
    def cudaGetErrorString(err: int) -> str:
        return "no error" if err == 0 else f"CUDA error {err}"


_TUNABLE = {"enabled": False, "tuning": False, "record_untuned": False}


def _tunable_functions() -> dict[str, Any]:
    """TunableOp's switches (off, as on a CUDA build without PYTORCH_TUNABLEOP_ENABLED); kernels are costed the
    same either way."""

    def _cuda_tunableop_enable(val: bool = True) -> None:
        _TUNABLE["enabled"] = bool(val)

    def _cuda_tunableop_is_enabled() -> bool:
        return _TUNABLE["enabled"]

    def _cuda_tunableop_tuning_enable(val: bool = True) -> None:
        _TUNABLE["tuning"] = bool(val)

    def _cuda_tunableop_tuning_is_enabled() -> bool:
        return _TUNABLE["tuning"]

    def _cuda_tunableop_record_untuned_enable(val: bool = True) -> None:
        _TUNABLE["record_untuned"] = bool(val)

    def _cuda_tunableop_record_untuned_is_enabled() -> bool:
        return _TUNABLE["record_untuned"]

    return {f.__name__: f for f in (_cuda_tunableop_enable, _cuda_tunableop_is_enabled,
                                    _cuda_tunableop_tuning_enable, _cuda_tunableop_tuning_is_enabled,
                                    _cuda_tunableop_record_untuned_enable,
                                    _cuda_tunableop_record_untuned_is_enabled)}


def current_blas_handle() -> int:
    """A cuBLAS handle is an opaque pointer: a stable nonzero value per device."""
    return 0x7F0000001000 + (current_device() << 12)


def _install_versions(ctx) -> None:
    """Versions and availability a CUDA build reports, where the installed torch lacks them."""
    import torch.backends.cuda as backends_cuda
    import torch.backends.cudnn as cudnn
    import torch.cuda.nccl as nccl
    import torch.version

    if torch.version.cuda is not None and getattr(torch._C, "_has_cuda", False):
        return                       # a CUDA build: its own versions are the real ones
    torch.version.cuda = CUDA_VERSION
    backends_cuda.is_built = lambda: True
    torch._C._cuda_getCompiledVersion = lambda: CUDA_COMPILED_VERSION

    def _nccl_version() -> int:
        return nccl_version_code()

    def _nccl_version_suffix() -> bytes:
        return b""

    torch._C._nccl_version = _nccl_version
    torch._C._nccl_version_suffix = _nccl_version_suffix
    for name in ("all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter", "init_rank", "unique_id"):
        if not hasattr(torch._C, f"_nccl_{name}"):
            setattr(torch._C, f"_nccl_{name}", _nccl_unsupported(name))
    del nccl

    def version() -> int:
        return CUDNN_VERSION

    def is_available() -> bool:
        return True

    def is_acceptable(tensor: torch.Tensor) -> bool:
        if not torch._C._get_cudnn_enabled():
            return False
        return tensor.device.type == "cuda" and tensor.dtype in cudnn.CUDNN_TENSOR_DTYPES

    cudnn.version = version
    cudnn.is_available = is_available
    cudnn.is_acceptable = is_acceptable


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
    "list_gpu_processes": list_gpu_processes, "memory_snapshot": memory_snapshot,
    "caching_allocator_alloc": caching_allocator_alloc, "caching_allocator_delete": caching_allocator_delete,
    "get_per_process_memory_fraction": get_per_process_memory_fraction, "host_memory_stats": host_memory_stats,
    "host_memory_stats_as_nested_dict": host_memory_stats_as_nested_dict,
    "get_allocator_backend": get_allocator_backend, "ipc_collect": lambda: None,
    "get_rng_state": get_rng_state, "get_rng_state_all": get_rng_state_all, "set_rng_state": set_rng_state,
    "set_rng_state_all": set_rng_state_all, "manual_seed": manual_seed, "manual_seed_all": manual_seed_all,
    "seed": seed, "seed_all": seed_all, "initial_seed": initial_seed,
    "utilization": _nvml_missing, "memory_usage": _nvml_missing, "temperature": _nvml_missing,
    "power_draw": _nvml_missing, "clock_rate": _nvml_missing, "device_memory_used": _nvml_missing,
    "current_blas_handle": current_blas_handle, "set_sync_debug_mode": lambda debug_mode: None,
    "get_sync_debug_mode": lambda: 0,
}

_MEMORY_FUNCS = ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
                 "memory_cached", "max_memory_cached", "reset_peak_memory_stats", "reset_max_memory_allocated",
                 "reset_max_memory_cached", "reset_accumulated_memory_stats", "memory_stats",
                 "memory_stats_as_nested_dict", "mem_get_info", "empty_cache", "set_per_process_memory_fraction",
                 "list_gpu_processes", "get_allocator_backend", "memory_snapshot", "caching_allocator_alloc",
                 "caching_allocator_delete", "get_per_process_memory_fraction", "host_memory_stats",
                 "host_memory_stats_as_nested_dict", "device_memory_used")
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

    def _cuda_memorySnapshot(args: Any = None) -> dict:
        return _snapshot()

    def _cuda_hostMemoryStats() -> dict:
        return host_memory_stats_as_nested_dict()

    def _cuda_resetPeakHostMemoryStats() -> None:
        return None

    def _cuda_resetAccumulatedHostMemoryStats() -> None:
        return None

    def _cuda_getMemoryFraction(idx: int) -> float:
        return _memory_fraction(idx)

    def _cuda_setMemoryFraction(fraction: float, idx: int) -> None:
        set_per_process_memory_fraction(fraction, idx)

    def _cuda_cudaCachingAllocator_raw_alloc(size: int, stream: int) -> int:
        return _raw_alloc(size, stream)

    def _cuda_cudaCachingAllocator_raw_delete(ptr: int) -> None:
        _raw_delete(ptr)

    def _cuda_getCurrentBlasHandle() -> int:
        return current_blas_handle()

    def _cuda_get_conv_benchmark_empty_cache() -> bool:
        return True

    return {f.__name__: f for f in (
        _cuda_getDeviceCount, _cuda_getDevice, _cuda_setDevice, _cuda_exchangeDevice, _cuda_maybeExchangeDevice,
        _cuda_synchronize, _cuda_init, _cuda_isInBadFork, _cuda_getCurrentRawStream, _cuda_getArchFlags,
        _cuda_emptyCache, _cuda_memoryStats, _cuda_resetPeakMemoryStats, _cuda_resetAccumulatedMemoryStats,
        _cuda_memorySnapshot, _cuda_hostMemoryStats, _cuda_resetPeakHostMemoryStats,
        _cuda_resetAccumulatedHostMemoryStats, _cuda_getMemoryFraction, _cuda_setMemoryFraction,
        _cuda_cudaCachingAllocator_raw_alloc, _cuda_cudaCachingAllocator_raw_delete, _cuda_getCurrentBlasHandle,
        _cuda_get_conv_benchmark_empty_cache)}


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
    cuda.default_generators = _generators()
    cuda._cudart = _CudaRuntime
    for name, fn in _tunable_functions().items():
        if not hasattr(torch._C, name):
            setattr(torch._C, name, fn)
    _install_versions(ctx)
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
