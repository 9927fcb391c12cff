"""Installs the `torch.cuda` stand-ins: which function or class goes where, and `install(ctx)` that puts them there.

`install(ctx)` replaces the functions and classes of `torch.cuda` (and of `torch.cuda.memory`, `torch.cuda.random`,
`torch.cuda.streams`, `torch.cuda.nvtx`, the `torch._C._cuda_*` entry points and `torch.accelerator`'s synchronize and
memory functions) with versions that answer from the simulated device. The stand-ins, one surface a module:
- `cuda_device.py`: device count, current device, properties from the GPU preset;
- `cuda_streams.py`: streams, events, synchronisation (ops for the runtime), CUDA graphs (unsupported);
- `cuda_memory.py`: memory statistics, snapshots and raw allocations from the simulated caching allocator;
- `cuda_rng.py`: `torch.cuda.default_generators` and the torch.cuda RNG functions;
- `cuda_nvtx.py`: NVTX ranges (no-ops);
- `cuda_versions.py`: on a CPU-only torch, the versions a CUDA build reports (CUDA, cuDNN, NCCL);
- `cuda_libraries.py`: NVML queries (failing as torch's do without nvidia-ml-py), cudart, TunableOp, cuBLAS handle;
- `cuda_c_bindings.py`: the `torch._C._cuda_*` entry points.
Nothing here touches a real GPU, also on a CUDA build of torch. docs/stubs.md lists how each query is answered.
"""

from __future__ import annotations

from .cuda_c_bindings import CUDA_GRAPH_NAMES, _c_functions
from .cuda_device import (_exchange_device, _is_in_bad_fork, _maybe_exchange_device, _lazy_init, can_device_access_peer, current_device,
                          device, device_count, device_of, get_arch_list, get_device_capability, get_device_name,
                          get_device_properties, get_gencode_flags, init, is_available, is_bf16_supported,
                          is_initialized, is_tf32_supported, set_device)
from .cuda_libraries import _CudaRuntime, _nvml_missing, _tunable_functions, current_blas_handle
from .cuda_memory import (_dump_snapshot, _record_memory_history, _snapshot, caching_allocator_alloc,
                          caching_allocator_delete, empty_cache, get_allocator_backend,
                          get_per_process_memory_fraction, host_memory_stats, host_memory_stats_as_nested_dict,
                          list_gpu_processes, max_memory_allocated, max_memory_reserved, mem_get_info,
                          memory_allocated, memory_reserved, memory_snapshot, memory_stats,
                          memory_stats_as_nested_dict, reset_accumulated_memory_stats, reset_peak_memory_stats,
                          set_per_process_memory_fraction)
from .cuda_nvtx import install_emit_nvtx, mark, nvtx_range, range_end, range_pop, range_push, range_start
from .cuda_rng import (all_generators, get_rng_state, get_rng_state_all, initial_seed, manual_seed, manual_seed_all,
                       seed, seed_all, set_rng_state, set_rng_state_all)
from .cuda_streams import (CUDAGraph, Event, ExternalStream, Stream, StreamContext, _cuda_graph_unsupported,
                           current_stream, default_stream, is_current_stream_capturing, set_stream, stream,
                           synchronize)
from .cuda_versions import _install_versions
from .errors import UnsupportedOpError


# ---- installation ----------------------------------------------------------------------------------------------------

_CUDA_FUNCS = {
    "is_available": is_available, "is_initialized": is_initialized, "_lazy_init": _lazy_init, "init": init,
    "_is_in_bad_fork": _is_in_bad_fork, "device_count": device_count, "current_device": current_device,
    "set_device": set_device, "_exchange_device": _exchange_device, "_maybe_exchange_device": _maybe_exchange_device,
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
    cuda.default_generators = all_generators()
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
    from . import cuda_guard_events
    cuda_guard_events.install(ctx.lib)       # torch.Event, torch.Stream and C++'s own events as ops
    cuda.streams.Stream = Stream
    cuda.streams.Event = Event
    cuda.streams.ExternalStream = ExternalStream
    for name, fn in (("range_push", range_push), ("range_pop", range_pop), ("range_start", range_start),
                     ("range_end", range_end), ("mark", mark), ("range", nvtx_range)):
        setattr(cuda.nvtx, name, fn)
    install_emit_nvtx()
    _install_single_process_comm()
    cuda._initialized = True
    for name, fn in _c_functions().items():
        setattr(torch._C, name, fn)
    for name, obj in CUDA_GRAPH_NAMES.items():
        if not hasattr(torch._C, name):
            setattr(torch._C, name, obj)
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


def _install_single_process_comm() -> None:
    """`torch.nn.parallel.comm` (scatter, gather, broadcast and reduce across the GPUs of one process, what
    `nn.DataParallel` runs on) stops with a message: a rank simulates one GPU, and a CPU-only torch has none of
    these C functions (`torch._C._scatter`: an AttributeError)."""
    import torch
    import torch.nn.parallel.comm as comm

    def one_device(name: str, args: tuple, kwargs: dict):
        """`nn.DataParallel` over one device scatters its inputs to it and gathers from it (copies, or nothing)."""
        if name == "scatter":
            devices = kwargs.get("devices", args[1] if len(args) > 1 else None)
            if devices is not None and len(devices) == 1:
                d = devices[0]
                return (args[0].to(d if isinstance(d, torch.device) else torch.device("cuda", int(d))),)
        if name == "gather":
            tensors = args[0] if args else kwargs.get("tensors")
            if tensors is not None and len(tensors) == 1:
                dest = kwargs.get("destination", args[2] if len(args) > 2 else None)
                t = tensors[0]
                if dest is None or (isinstance(dest, int) and dest == -1):
                    return t if dest is None else t.cpu()
                return t.to(dest if isinstance(dest, (torch.device, str)) else torch.device("cuda", int(dest)))
        return None

    def refuse(name: str):
        def refused(*args, **kwargs):
            out = one_device(name, args, kwargs)
            if out is not None:
                return out
            raise UnsupportedOpError(
                f"torch.nn.parallel.comm.{name}: one process driving several GPUs (nn.DataParallel) is not "
                "simulated; use DistributedDataParallel with one process per GPU (phantora run --gpus-per-node N)")
        refused._phantora = True   # type: ignore[attr-defined]
        return refused

    for name in ("broadcast", "broadcast_coalesced", "reduce_add", "reduce_add_coalesced", "scatter", "gather"):
        fn = getattr(comm, name, None)
        if fn is not None and not getattr(fn, "_phantora", False):
            setattr(comm, name, refuse(name))
