"""The `torch._C._cuda_*` entry points (what torch.cuda's own Python calls into), each a distinct function object
answering through the torch.cuda stand-ins."""

from __future__ import annotations

from typing import Any

from .cuda_device import _ctx, _exchange_device, current_device, device_count, get_arch_list, set_device
from .cuda_libraries import current_blas_handle
from .cuda_memory import (_memory_fraction, _raw_alloc, _raw_delete, _snapshot, empty_cache,
                          host_memory_stats_as_nested_dict, memory_stats_as_nested_dict,
                          reset_accumulated_memory_stats, reset_peak_memory_stats, set_per_process_memory_fraction)
from .cuda_streams import synchronize


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


class _cuda_CUDAAllocator_AllocatorState:
    """The caching allocator's saved state (a CUDA graph pool's), which torch._inductor.cudagraph_trees imports
    wherever torch.backends.cuda.is_built() says True; CUDA graphs are not simulated, so it is never made."""


def _set_cached_tensors_enabled(enabled: bool) -> None:
    """CUDA-graph trees' cached-tensor switch (imported with the class above): nothing is cached."""


CUDA_GRAPH_NAMES = {"_cuda_CUDAAllocator_AllocatorState": _cuda_CUDAAllocator_AllocatorState,
                    "_set_cached_tensors_enabled": _set_cached_tensors_enabled}
"""torch._C names a CPU-only torch lacks that torch imports for CUDA graphs once CUDA is said to be built
(`torch.compiler.cudagraph_mark_step_begin()`, Dynamo's compiled optimizer step)."""

