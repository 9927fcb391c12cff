"""The `torch.cuda` device API of the simulated host: availability, device count, current device, properties.

- device count: the simulated host's GPUs (`PHANTORA_LOCAL_DEVICES`) that `CUDA_VISIBLE_DEVICES` shows this process
  (`visible`), current device kept in sync with the C++ device guard;
- properties, name and capability from the GPU preset (`PHANTORA_GPU`), memory size from the preset or
  `PHANTORA_VRAM_BYTES`.
Also the helpers every torch.cuda stand-in uses: the rank's context (`_ctx`) and a device argument as an index
(`_index`, `_check_index`).
"""

from __future__ import annotations

import os
import re
from typing import Any, Sequence

import torch

from . import context


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
    return len(visible())


def visible() -> list[int]:
    """The host's GPUs this process sees, in its device order (device i is GPU `visible()[i]` of the simulated
    host). Read from `CUDA_VISIBLE_DEVICES` the first time it is asked, as CUDA reads it when it initialises, and kept:
    a script that sets the variable before it first uses CUDA is shown what it asked for."""
    ctx = _ctx()
    gpus = ctx.extras.get("visible_gpus")
    if gpus is None:
        n = ctx.dev.device_count
        var = os.environ.get("CUDA_VISIBLE_DEVICES")
        gpus = visible_gpus(var, n, [str(_DeviceUuid(uuid_name(ctx.gpu, i))) for i in range(n)])
        if not gpus:
            raise RuntimeError(f"CUDA_VISIBLE_DEVICES={var!r} shows this process none of the simulated host's {n} "
                               f"GPUs: on a GPU host torch.cuda.is_available() would answer False and the script "
                               f"would run without CUDA, which Phantora does not simulate. Name GPUs 0-{n - 1} (or "
                               f"their UUIDs, torch.cuda.get_device_properties(i).uuid), or leave it unset")
        ctx.extras["visible_gpus"], ctx.extras["visible_var"] = gpus, var
        from .cuda_rng import show_generators
        show_generators(len(gpus))
    return gpus


def visible_gpus(var: str | None, physical: int, uuids: Sequence[str]) -> list[int]:
    """The GPUs (0 .. physical-1) that `CUDA_VISIBLE_DEVICES` = `var` makes visible, in order, read as CUDA reads it
    and as torch reads it for its device count (`_parse_visible_devices`, `_device_count_nvml`): unset, all of them;
    a list that starts with "GPU-" is of UUIDs (each a unique prefix of one, after "GPU-"), read up to the first entry
    without that prefix; any other list is of ordinals, each read like strtoul (its leading digits), up to the first
    that is not one. A repeated entry hides every GPU; the GPUs are those before the first entry that names none of
    the host's (an unknown UUID, an ordinal past its GPUs)."""
    if var is None:
        return list(range(physical))
    entries: list[str | int] = []
    if var.startswith("GPU-"):
        for entry in var.split(","):
            if not entry.startswith("GPU-"):
                break
            entries.append(entry)
    else:
        for entry in var.split(","):
            m = re.match(r"\+?\d+", entry.strip())
            if m is None:
                break
            entries.append(int(m.group()))
    if len(set(entries)) < len(entries):
        return []
    out: list[int] = []
    for entry in entries:
        if isinstance(entry, str):
            want = entry[4:].lower()
            hits = [i for i, u in enumerate(uuids) if want and u.lower().startswith(want)]
            gpu = hits[0] if len(hits) == 1 else None
        else:
            gpu = entry if entry < physical else None
        if gpu is None:
            break
        out.append(gpu)
    return out


def uuid_name(gpu: Any, index: int) -> str:
    """What GPU `index` of the simulated host's UUID is made from."""
    return f"phantora-{gpu.name}-{index}"


def current_device() -> int:
    return _ctx().dev.device()


def set_device(device: Any) -> None:
    idx = _index(device)
    if idx >= 0:
        _check_index(idx)
        _ctx().dev.set_device(idx)
        _ctx().extras["device_selected"] = True


def device_selected() -> bool:
    """Whether the program has chosen its device or used CUDA (what a real CUDA context's lazy initialisation
    follows): `torch.cuda.set_device` was called or a CUDA tensor was made. `is_initialized()` answers True from
    the start (the simulated device needs no initialisation); DeviceMesh asks this instead (fake.py)."""
    if _ctx().extras.get("device_selected"):
        return True
    from .cuda_memory import max_memory_reserved
    return max_memory_reserved() > 0


def _check_index(idx: int) -> None:
    n = device_count()
    if not 0 <= idx < n:
        where = (f"CUDA_VISIBLE_DEVICES={_ctx().extras.get('visible_var')!r} shows this process {n} of the "
                 f"simulated host's {_ctx().dev.device_count} GPUs" if n != _ctx().dev.device_count else
                 f"the simulated host has {n} GPUs: phantora run --gpus-per-node")
        raise RuntimeError(f"CUDA error: invalid device ordinal (device {idx}; {where})")


def _exchange_device(device: int) -> int:
    prev = current_device()
    if device >= 0:
        set_device(device)
    return prev


def _maybe_exchange_device(device: int) -> int:
    """torch.cuda._maybe_exchange_device: the same answer as `_exchange_device`, but its own function, as in torch
    (Dynamo keeps a table of torch functions and refuses two names for one object)."""
    return _exchange_device(device)


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


# Per compute capability (CUDA C++ Programming Guide, "Technical Specifications per Compute Capability"): resident
# threads per SM, shared memory per SM (what cudaDevAttrMaxSharedMemoryPerMultiprocessor answers) and the most one
# block may opt in to, in bytes.
_SM_LIMITS = {
    (7, 0): (2048, 98304, 98304), (7, 5): (1024, 65536, 65536),
    (8, 0): (2048, 167936, 166912), (8, 6): (1536, 102400, 101376), (8, 7): (2048, 167936, 166912),
    (8, 9): (1536, 102400, 101376), (9, 0): (2048, 233472, 232448), (10, 0): (2048, 233472, 232448),
    (12, 0): (1536, 102400, 101376),
}


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
        threads, smem_sm, smem_block = _SM_LIMITS.get((major, minor), _SM_LIMITS[(9, 0)] if major >= 9 else
                                                     _SM_LIMITS[(8, 0)])
        self.max_threads_per_multi_processor = threads
        self.regs_per_multiprocessor = 65536
        self.shared_memory_per_block = 49152
        self.shared_memory_per_block_optin = smem_block
        self.shared_memory_per_multiprocessor = smem_sm
        self.clock_rate = int(gpu.boost_clock_mhz * 1000)
        self.memory_clock_rate = 0
        self.memory_bus_width = 0
        self.gcnArchName = "NVIDIA CUDA"
        self.uuid = _DeviceUuid(uuid_name(gpu, index))     # index: the GPU of the host (what the process sees
        self.pci_bus_id = index                           # as its device i is visible()[i])
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
    return _DeviceProperties(ctx.gpu, ctx.runtime.allocator.capacity, visible()[idx])


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
