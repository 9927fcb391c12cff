"""`torch.cuda` memory queries and control, answered by the simulated caching allocator.

Memory statistics from the simulated caching allocator (every key of torch.cuda.memory_stats, per pool), snapshots
of its segments, raw allocations through it, the per-process memory fraction, the pinned host allocator's (empty)
statistics.
"""

from __future__ import annotations

import collections
import itertools
import pickle
from typing import Any

import torch
from phantora.engine.ops import Op, OpKind

from .clock import METER
from .cuda_device import _ctx, _index, current_device, device_count
from .cuda_ops import _ENTRY
from .cuda_streams import current_stream


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
    ctx.runtime.allocator.device_total = total           # what an out-of-memory message calls the total capacity


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
