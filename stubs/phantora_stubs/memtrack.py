"""Device memory of fake tensors: which op outputs allocate, and when their storage dies.

Every op output on the fake CUDA device is looked up by its storage (`untyped_storage()._cdata`, shared by all views
of a tensor): a storage seen for the first time allocates a block of its size from the runtime's allocator model and
emits `OpKind.ALLOC`; a `weakref.finalize` on the storage object frees the block (`OpKind.FREE`) when the storage
dies (PyTorch keeps one Python object per live storage, so the finalizer runs exactly when the storage is freed).
A storage whose size changed (`resize_`, `untyped_storage().resize_()` as FSDP2 does) is freed and reallocated.
An allocation beyond the device's memory raises `torch.OutOfMemoryError` with a message like CUDA's.
"""

from __future__ import annotations

import itertools
import weakref
from typing import Iterable

import torch
from phantora.engine.ops import Op, OpKind

from phantora.engine.allocator import DeviceOutOfMemory
from .clock import METER
from .errors import user_location


def format_size(n: float) -> str:
    """Sizes as PyTorch prints them in OOM messages."""
    if n < 1024:
        return f"{int(n)} bytes"
    for unit, scale in (("KiB", 1 << 10), ("MiB", 1 << 20), ("GiB", 1 << 30)):
        if n < scale * 1024 or unit == "GiB":
            return f"{n / scale:.2f} {unit}"
    return f"{n} bytes"


class MemoryTracker:
    def __init__(self, runtime, dev, gpu_name: str):
        self.runtime = runtime
        self.dev = dev
        self.gpu_name = gpu_name
        self._live: dict[int, tuple[int, int]] = {}      # storage key -> (block id, nbytes)
        self._ids = itertools.count(1)
        self._first = True                                 # no allocation on the GPU yet
        self._devices: int | None = None                   # the CUDA devices the process sees (after the first)

    @property
    def allocator(self):
        return self.runtime.allocator

    def track(self, tensors: Iterable[torch.Tensor]) -> int:
        """Account the storages of op outputs; returns the bytes newly allocated."""
        total = 0
        live = self._live
        for t in tensors:
            if t.device.type != "cuda":
                continue
            if t.layout != torch.strided:
                from .errors import UnsupportedOpError
                raise UnsupportedOpError(
                    f"a {t.layout} tensor on the GPU (nn.Embedding(sparse=True)'s gradient, say): how many elements "
                    "it stores depends on the data, which a simulated rank does not have (its fake tensor stores "
                    "none, so its memory and kernels would cost nothing); use a dense layout (docs/stubs.md)")
            s = t.untyped_storage()
            key = s._cdata
            n = s.nbytes()
            known = live.get(key)
            if known is not None:
                if known[1] == n:
                    continue
                self._release(key)
                if n == 0:
                    continue
            elif n == 0:
                self._watch(s, key, 0, 0)
                continue
            total += self._alloc(s, key, n, t.device.index)
        return total

    def storage_resized(self, storage: torch.UntypedStorage, device_index: int | None) -> None:
        """After `UntypedStorage.resize_` on a fake CUDA storage."""
        key = storage._cdata
        n = storage.nbytes()
        known = self._live.get(key)
        if known is not None and known[1] == n:
            return
        if known is not None:
            self._release(key)
        if n > 0:
            self._alloc(storage, key, n, device_index)
        elif known is None:
            self._watch(storage, key, 0, 0)

    def scratch(self, nbytes: int, device_index: int | None) -> int:
        """A temporary block a CUDA kernel allocates beside its outputs (cuda_scratch.py): allocated now, freed by
        `free_scratch` once the kernel is issued. Returns its block id."""
        return self._new_block(nbytes, device_index)[0]

    def free_scratch(self, block: int, nbytes: int) -> None:
        self._free_block(block, nbytes)

    def keep(self, nbytes: int, device_index: int | None) -> int:
        """A block a library takes from the caching allocator and never returns (cuda_blas.py: the GEMM
        libraries' workspaces), allocated now on the device's current stream. Returns its block id."""
        return self._new_block(nbytes, device_index)[0]

    # -- internals -------------------------------------------------------------------------------------------------
    def _watch(self, storage, key: int, block: int, nbytes: int) -> None:
        fresh = key not in self._live
        self._live[key] = (block, nbytes)
        if fresh:
            fin = weakref.finalize(storage, self._storage_died, key)
            fin.atexit = False

    def _alloc(self, storage, key: int, nbytes: int, device_index: int | None) -> int:
        if self._first:                  # CUDA initialises here at the latest: CUDA_VISIBLE_DEVICES is read
            self._first = False
            from . import context
            if context.CTX is not None:
                from .cuda_device import visible
                self._devices = len(visible())
        if device_index is not None and self._devices is not None and device_index >= self._devices:
            from .cuda_device import _check_index
            _check_index(device_index)   # a tensor on a device the process does not have: invalid device ordinal
        block, rounded = self._new_block(nbytes, device_index)
        self._watch(storage, key, block, nbytes)
        return rounded

    def _new_block(self, nbytes: int, device_index: int | None) -> tuple[int, int]:
        """A block of `nbytes` from the allocator model on the device's current stream, announced as `ALLOC`:
        (block id, its rounded size); beyond the device's memory, torch.OutOfMemoryError."""
        block = next(self._ids)
        stream = self.dev.stream(device_index)
        try:
            rounded = self.allocator.alloc(nbytes, block, stream)
        except DeviceOutOfMemory as oom:
            raise torch.OutOfMemoryError(self._oom_message(oom, device_index)) from None
        self.runtime.submit(Op(OpKind.ALLOC, stream=stream, nbytes=nbytes, arg=block, mem=rounded))
        return block, rounded

    def _free_block(self, block: int, nbytes: int) -> None:
        rounded = self.allocator.free(block)
        self.runtime.submit(Op(OpKind.FREE, nbytes=nbytes, arg=block, mem=rounded))

    def _release(self, key: int) -> None:
        block, nbytes = self._live.get(key, (0, 0))
        if block:
            self._live[key] = (0, 0)
            self._free_block(block, nbytes)

    def _storage_died(self, key: int) -> None:
        METER.enter(3)         # the tracker's own work is not the framework's CPU time (reached through the
                               # finalizer's __call__, this frame and the meter's)
        try:
            self._release(key)
        finally:
            self._live.pop(key, None)
            METER.exit()

    def _oom_message(self, oom: DeviceOutOfMemory, device_index: int | None) -> str:
        dev = self.dev.device() if device_index is None else device_index
        # as PyTorch words it: the device's total capacity, and with set_per_process_memory_fraction what is allowed
        limited = getattr(self.allocator, "fraction_limit", False)
        total = getattr(self.allocator, "device_total", oom.capacity) if limited else oom.capacity
        allowed = f"{format_size(oom.capacity)} allowed; " if limited else ""
        free = max(total - oom.reserved - oom.outside, 0)
        return (f"CUDA out of memory. Tried to allocate {format_size(oom.rounded)}. GPU {dev} has a total capacity of "
                f"{format_size(total)} of which {format_size(free)} is free. Including non-PyTorch memory, "
                f"this process has {format_size(oom.reserved + oom.outside)} memory in use. {allowed}Of the allocated memory "
                f"{format_size(oom.allocated)} is allocated by PyTorch, and "
                f"{format_size(max(oom.reserved - oom.allocated, 0))} is reserved by PyTorch but unallocated. "
                f"(simulated by phantora on a {self.gpu_name}; allocation at {user_location(3)})")
