"""`torch.save` in a simulated rank: checkpoints of tensors that hold no data.

A rank's tensors are fake (docs/stubs.md): pickled as they are, they drag their fake mode along and `torch.save`
fails (a checkpoint every N steps is in most training scripts). While `torch.save` runs, a fake tensor pickles as a
meta tensor of its shape, strides, dtype and `requires_grad`: the file is small, holds every key and shape of the
object, and loads anywhere (`torch.load` gives meta tensors). What a real save costs the GPU is kept: PyTorch copies
each CUDA storage to the host before writing it, so each device storage saved is copied to the host once, a blocking
device-to-host copy on the cluster's PCIe link (its first tensor's bytes: a state dict's tensors own their storages).
Writing the file is not simulated: it takes no simulated time beyond the Python that runs.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import _disable_current_modes

from .clock import METER

_SAVING = threading.local()      # the storages copied by the save in progress on this thread (None: no save)


def _storage_key(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage()._cdata
    except Exception:  # noqa: BLE001 - a tensor without a storage of its own: count it alone
        return id(t)


def _reduce_fake(self: FakeTensor, protocol: int) -> Any:
    copied = getattr(_SAVING, "storages", None)
    if copied is not None and self.device.type == "cuda":
        key = _storage_key(self)
        if key not in copied:
            copied.add(key)
            self.detach().cpu()                  # the device-to-host copy torch.save makes of the storage
    METER.enter()
    try:
        with _disable_current_modes():
            meta = torch.empty_strided(tuple(self.shape), tuple(self.stride()), dtype=self.dtype, device="meta")
            if self.requires_grad:
                meta.requires_grad_(True)
    finally:
        METER.exit()
    return meta.__reduce_ex__(protocol)


def install() -> None:
    """Wrap `torch.save` (`torch.serialization.save`, the same function) for fake tensors (idempotent)."""
    import torch.serialization as serialization

    original = serialization.save
    if getattr(original, "__phantora__", False):
        return

    @functools.wraps(original)
    def save(obj: Any, *args: Any, **kwargs: Any) -> Any:
        outer = getattr(_SAVING, "storages", None) is None
        if outer:
            _SAVING.storages = set()
        previous = FakeTensor.__dict__.get("__reduce_ex__")
        FakeTensor.__reduce_ex__ = _reduce_fake
        try:
            return original(obj, *args, **kwargs)
        finally:
            if outer:
                _SAVING.storages = None
                if previous is None:
                    del FakeTensor.__reduce_ex__
                else:
                    FakeTensor.__reduce_ex__ = previous

    save.__phantora__ = True       # type: ignore[attr-defined]
    serialization.save = save
    torch.save = save
