"""`torch.save` in a simulated rank: checkpoints of tensors that hold no data.

A rank's tensors are fake (docs/stubs.md): pickled as they are, they drag their fake mode along and `torch.save`
fails (a checkpoint every N steps is in most training scripts). While `torch.save` runs, a fake tensor pickles as a
meta tensor of its shape, strides, dtype and `requires_grad`: the file is small, holds every key and shape of the
object, and loads anywhere (`torch.load` gives meta tensors). Each also carries the device it was on and, for a small
tensor, its known value: `torch.load` in a simulated rank gives tensors of their shapes on their devices (or
`map_location`'s), with those values, each loaded to the host and copied to its GPU as a real load does. What a real
save costs the GPU is kept: PyTorch copies
each CUDA storage to the host before writing it, so each device storage saved is copied to the host once, a blocking
device-to-host copy on the cluster's PCIe link (its first tensor's bytes: a state dict's tensors own their storages).
Writing the file is not simulated: it takes no simulated time beyond the Python that runs.

safetensors (`save_file`, what Hugging Face's `save_pretrained`, the Trainer's checkpoints and accelerate's
`save_state` write) reads each tensor's memory through its data pointer, which a fake tensor does not have: a
`save_file` of fake tensors writes a safetensors file of the same header (names, dtypes, shapes, offsets) whose data
is zeros, as a sparse file (no disk space for it), after the device-to-host copy of each CUDA tensor a real save
makes; `save` (to bytes) gives the same bytes. `load_file`, `load` and `safe_open` read the header and give tensors
of its names, shapes and dtypes on the device asked for, without data (values unknown, as every tensor's here),
whichever run wrote the file.
"""

from __future__ import annotations

import copy
import functools
import json
import sys
import threading
import warnings
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import _disable_current_modes

from .clock import METER
from .values import VALUES, simulated, storage_key

_SAVING = threading.local()      # the storages copied by the save in progress on this thread (None: no save)


def _reduce_fake(self: FakeTensor, protocol: int) -> Any:
    copied = getattr(_SAVING, "storages", None)
    if copied is not None and self.device.type == "cuda":
        key = storage_key(self) or id(self)     # a tensor without a storage of its own: alone
        if key not in copied:
            copied.add(key)
            self.detach().cpu()                  # the device-to-host copy torch.save makes of the storage
    METER.enter()
    try:
        value = VALUES.as_list(self)
        with _disable_current_modes():
            meta = torch.empty_strided(tuple(self.shape), tuple(self.stride()), dtype=self.dtype, device="meta")
            if self.requires_grad:
                meta.requires_grad_(True)
            meta._phantora_device = str(self.device)                   # what torch.load in a rank restores
            if value is not None:
                meta._phantora_value = value
    finally:
        METER.exit()
    return meta.__reduce_ex__(protocol)


def _target(saved: str, map_location: Any) -> str:
    """The device torch.load puts a tensor saved on `saved` on (map_location a device, a string or a dict of them;
    a callable is not called: the saved device)."""
    if map_location is None or callable(map_location):
        return saved
    if isinstance(map_location, dict):
        return str(map_location.get(saved, saved))
    return str(map_location)


def _materialize(obj: Any, map_location: Any, seen: dict) -> Any:
    """`obj` with each meta tensor that a rank's torch.save wrote (it carries its saved device) made a tensor of its
    shape on its device, with its saved value where it had a known one; containers rebuilt, other objects as they
    are."""
    if isinstance(obj, torch.Tensor):
        device = getattr(obj, "_phantora_device", None)
        if device is None or obj.device.type != "meta":
            return obj
        if id(obj) in seen:
            return seen[id(obj)]
        target = _target(device, map_location)
        host = torch.empty_strided(tuple(obj.shape), tuple(obj.stride()), dtype=obj.dtype, device="cpu")
        value = getattr(obj, "_phantora_value", None)
        if value is not None:
            VALUES.set_from_list(host, value)
        t = host if torch.device(target).type == "cpu" else host.to(target)    # loaded to the host, then copied
        if isinstance(obj, torch.nn.Parameter):
            t = torch.nn.Parameter(t, requires_grad=obj.requires_grad)
        elif obj.requires_grad:
            t.requires_grad_(True)
        seen[id(obj)] = t
        return t
    if isinstance(obj, dict):
        out = {k: _materialize(v, map_location, seen) for k, v in obj.items()}
        if type(obj) is dict:
            return out
        try:
            rebuilt = copy.copy(obj)
            rebuilt.clear()
            rebuilt.update(out)
            return rebuilt
        except Exception:  # noqa: BLE001 - a mapping that cannot be rebuilt: as it is
            return obj
    if isinstance(obj, (list, tuple)):
        items = [_materialize(v, map_location, seen) for v in obj]
        if all(new is old for new, old in zip(items, obj)):
            return obj                  # nothing to make: the object as loaded (a torch.Size stays one)
        if type(obj) in (list, tuple):
            return type(obj)(items)
        try:                            # a named tuple, or another list or tuple type: rebuilt as its own type
            if isinstance(obj, list):
                rebuilt = copy.copy(obj)        # its attributes kept
                rebuilt[:] = items
                return rebuilt
            return type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)
        except Exception:  # noqa: BLE001 - a sequence that cannot be rebuilt: as it is
            warnings.warn(f"phantora: torch.load kept a {type(obj).__name__} as loaded: its tensors stay meta "
                          "tensors (it cannot be rebuilt from its items)", stacklevel=2)
            return obj
    return obj


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

    original_load = serialization.load

    @functools.wraps(original_load)
    def load(f: Any, map_location: Any = None, *args: Any, **kwargs: Any) -> Any:
        obj = original_load(f, map_location, *args, **kwargs)
        return _materialize(obj, map_location, {})

    load.__phantora__ = True       # type: ignore[attr-defined]
    serialization.load = load
    torch.load = load


# ---- safetensors ---------------------------------------------------------------------------------------------------

_SAFETENSORS_DTYPES = {
    "float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16", "int64": "I64", "int32": "I32",
    "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL", "uint16": "U16", "uint32": "U32", "uint64": "U64",
    "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2", "complex64": "C64",
}


def _safetensors_header(tensors: dict, metadata: dict | None) -> tuple[bytes, int]:
    """The safetensors header of `tensors` (its JSON padded to 8 bytes, with its length first) and the data bytes."""
    header: dict[str, Any] = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    offset = 0
    for name in sorted(tensors, key=lambda n: (-tensors[n].element_size(), n)):    # larger alignment first
        t = tensors[name]
        dtype = str(t.dtype).removeprefix("torch.")
        if dtype not in _SAFETENSORS_DTYPES:
            raise ValueError(f"safetensors cannot save tensor {name!r} of dtype {t.dtype}")
        n = t.numel() * t.element_size()
        header[name] = {"dtype": _SAFETENSORS_DTYPES[dtype], "shape": list(t.shape), "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text, offset


def _copy_to_host(tensors: dict) -> None:
    """The device-to-host copies a real safetensors save makes of its CUDA tensors."""
    for t in tensors.values():
        if simulated(t) and t.device.type == "cuda":
            t.detach().to("cpu")


def patch_safetensors(module: Any) -> None:
    """`safetensors.torch.save_file` / `save` of fake tensors (module docstring); real tensors as before."""
    original_file, original_bytes = module.save_file, module.save
    if getattr(original_file, "__phantora__", False):
        return

    @functools.wraps(original_file)
    def save_file(tensors: dict, filename: Any, metadata: dict | None = None) -> None:
        if not any(simulated(t) for t in tensors.values()):
            return original_file(tensors, filename, metadata=metadata)
        module._evaluate_tensors_for_save(tensors)       # safetensors' own checks (shared, sparse tensors)
        header, nbytes = _safetensors_header(tensors, metadata)
        _copy_to_host(tensors)
        with open(filename, "wb") as f:
            f.write(header)
            f.truncate(len(header) + nbytes)              # the data: zeros, a hole in a sparse file
        return None

    @functools.wraps(original_bytes)
    def save(tensors: dict, metadata: dict | None = None) -> bytes:
        if not any(simulated(t) for t in tensors.values()):
            return original_bytes(tensors, metadata=metadata)
        module._evaluate_tensors_for_save(tensors)
        header, nbytes = _safetensors_header(tensors, metadata)
        _copy_to_host(tensors)
        return header + bytes(nbytes)

    def load_file(filename: Any, device: Any = "cpu") -> dict:
        with open(filename, "rb") as f:
            header = _read_header(f.read(8), f)
        return {name: _placeholder(spec, device) for name, spec in header.items() if name != "__metadata__"}

    def load(data: bytes) -> dict:
        n = int.from_bytes(data[:8], "little")
        header = json.loads(data[8:8 + n])
        return {name: _placeholder(spec, "cpu") for name, spec in header.items() if name != "__metadata__"}

    save_file.__phantora__ = True      # type: ignore[attr-defined]
    module.save_file, module.save, module.load_file, module.load = save_file, save, load_file, load
    module.safe_open = _SafeOpen
    patch_safetensors_root(sys.modules.get("safetensors"))


def patch_safetensors_root(root: Any) -> None:
    """`from safetensors import safe_open` (the package's own name for it)."""
    if root is not None and hasattr(root, "safe_open"):
        root.safe_open = _SafeOpen


_TORCH_DTYPES = {v: k for k, v in _SAFETENSORS_DTYPES.items()}


def _read_header(first: bytes, f: Any) -> dict:
    n = int.from_bytes(first, "little")
    return json.loads(f.read(n))


def _placeholder(spec: dict, device: Any, index: Any = None) -> torch.Tensor:
    dtype = getattr(torch, _TORCH_DTYPES[spec["dtype"]])
    t = torch.empty(tuple(spec["shape"]), dtype=dtype, device=device)
    return t if index is None else t[index].contiguous()


class _SafeOpen:
    """`safetensors.safe_open(path, framework="pt", device=...)`: the file's header, tensors without data."""

    def __init__(self, filename: Any, framework: str = "pt", device: Any = "cpu") -> None:
        with open(filename, "rb") as f:
            self._header = _read_header(f.read(8), f)
        self._device = device

    def __enter__(self) -> "_SafeOpen":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def keys(self) -> list[str]:
        return sorted(k for k in self._header if k != "__metadata__")

    def offset_keys(self) -> list[str]:
        return sorted(self.keys(), key=lambda k: self._header[k]["data_offsets"][0])

    def metadata(self) -> dict | None:
        return self._header.get("__metadata__")

    def get_tensor(self, name: str) -> torch.Tensor:
        return _placeholder(self._spec(name), self._device)

    def get_slice(self, name: str) -> "_Slice":
        return _Slice(self._spec(name), self._device)

    def _spec(self, name: str) -> dict:
        if name not in self._header or name == "__metadata__":
            raise KeyError(f"File does not contain tensor {name}")
        return self._header[name]


class _Slice:
    def __init__(self, spec: dict, device: Any) -> None:
        self._spec, self._device = spec, device

    def get_shape(self) -> list[int]:
        return list(self._spec["shape"])

    def get_dtype(self) -> str:
        return self._spec["dtype"]

    def __getitem__(self, index: Any) -> torch.Tensor:
        return _placeholder(self._spec, self._device, index)
