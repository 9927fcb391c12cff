"""Fake tensors for the whole program, and the patches PyTorch needs to run on them.

`install(ctx)` enters one global `FakeTensorMode(allow_non_fake_inputs=True)` (with `avoid_device_init` forced on,
so `torch.tensor(x, device='cuda')` never attempts a real copy; on a CUDA build of torch an `aten.to` copy of a host
tensor to the device stops the rank with a message, `CUDA_BUILD_DTENSOR`) and the interceptor above it, on the main
thread, for the rest of the program. Then it applies:
- `torch.utils.swap_tensors` that tolerates fake tensors (their fake mode holds weak references to them), used by
  `nn.Module.to()` / `to_empty()`;
- `nn.UninitializedParameter` / `nn.UninitializedBuffer` (`nn.Lazy*` modules) made of a fake empty tensor, which
  moves with `.to()` and is materialised on its device by the first forward;
- `Tensor.data = new` carrying the device and the known value of `new` over to a fake tensor;
- DeviceMesh bookkeeping (a small CPU tensor of ranks, `nonzero`, `tolist`) with the fake mode unset;
- no-op Meta and CUDA kernels for `aten::record_stream`;
- `torch.compile` (and `nn.Module.compile`) compiled by Dynamo and Inductor, whose generated kernels are simulated
  (compiled.py, docs/compile.md);
- a `triton` stub package when triton is not installed (see triton_stub.py);
- `torch.nn.attention.flex_attention._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = True`, so eager flex attention runs as
  the `flex_attention` higher-order op the interceptor sees; the eager path's per-call Python (tracing the score and
  mask functions, which a compiled run does once) is kept out of the framework CPU time;
- DTensor's sharding propagation (global-shape fake computation done to learn output metadata) runs in the
  interceptor's shadow mode: no kernel, no memory;
- the meter: its per-op entry cost calibrated at start-up (`interceptor.calibrate_entry_cost`) with a measured
  host CPU, or the host-work counter with the modelled one (clock.py);
- `torch.distributed.set_timeout` when torch lacks it (a no-op);
- `Tensor.tolist()` / `Tensor.numpy()` answering from the value table (values.py), and `UntypedStorage.resize_`
  reporting size changes of fake CUDA storages to the memory tracker;
- with the modelled host CPU, the per-element price of the framework's conversions between Python data and tensors
  (`torch.tensor` of a list, `Tensor.tolist()`: conversions.py);
- an `OpKind.ITER_MARK` after every outermost optimizer step (global optimizer step pre/post hooks; an optimizer
  container stepping inner optimizers marks once);
- a fork handler: a forked child (DataLoader worker) leaves the fake mode and produces real tensors, reading the
  rank's fake ones as their known values or zeros (forked_children.py).
"""

from __future__ import annotations

import copyreg
import functools
import os
import sys
import warnings
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode, unset_fake_temporarily

from . import conversions, cuda_sdpa, forked_children, program_threads, saving, thread_waits, torch_profiler
from .clock import METER, unmetered
from .values import VALUES, small_buffer

_PATCHED: dict[str, Any] = {}


def _moves_host_tensor_to_device(func: Any, args: tuple, kwargs: dict) -> bool:
    """`aten.to.*` of a real (host) tensor to a device other than the CPU."""
    if getattr(func, "overloadpacket", None) is not torch.ops.aten.to:
        return False
    device = kwargs.get("device")
    if device is None and len(args) > 1 and isinstance(args[1], (torch.device, str)):
        device = args[1]                                     # aten.to.device(self, device, dtype, ...)
    if device is None or torch.device(device).type == "cpu":
        return False
    return any(type(a) is torch.Tensor for a in args)


CUDA_BUILD_DTENSOR = (
    "phantora: this rank's torch is a CUDA build ({version}), and {op} would copy a host tensor to the simulated "
    "device for real: the real CUDA allocator is not initialised in a simulated rank. DTensor's random-number "
    "tracker does this (FSDP2, tensor parallelism). With the copy kept fake such runs went on, but counted DTensor's "
    "sharding propagation of the optimizer's foreach ops every step (torch 2.11.0+cu130: the tiny model's two-GPU "
    "FSDP2 step 292.6 ms, against 22.3 ms on torch 2.13's CPU build), so they are refused. Install the CPU build: "
    "pip install torch==2.13.0 (docs/stubs.md, \"CUDA builds of torch\").")


def _no_real_device_copies(dispatch_impl: Any) -> Any:
    """The fake mode computes an op of real tensors for real ("constant propagation"). `aten._to_copy` to a device
    is kept out of it (`avoid_device_init`), but an `aten.to` overload that reaches the mode as itself (on torch
    2.11's CUDA build: DTensor's random-number tracker moving the generator state with `.to(device)`) is run. On a
    CPU-only torch the copy lands in the stand-in device's host memory; on a CUDA build (the only one this wraps)
    it would reach the real CUDA allocator, which the stand-in hooks never initialised: refused with a message
    instead of torch's internal assertion."""

    @functools.wraps(dispatch_impl)
    def _dispatch_impl(self: FakeTensorMode, func: Any, types: Any, args: tuple, kwargs: dict) -> Any:
        if _moves_host_tensor_to_device(func, args, kwargs):
            raise RuntimeError(CUDA_BUILD_DTENSOR.format(version=torch.__version__, op=func))
        return dispatch_impl(self, func, types, args, kwargs)

    _dispatch_impl.__wrapped_phantora__ = True           # type: ignore[attr-defined]
    return _dispatch_impl


def _no_constants_onto_devices(dispatch_impl: Any) -> Any:
    """The fake mode computes an op for real when every fake input holds a constant (a tensor of at most one element
    made from data: `torch.tensor(())`, `torch.tensor(1.0)`). An op that makes its result on the simulated device
    from such a tensor (`torch.tensor(()).new_empty(n, device="cuda")`, DeepSpeed's contiguous activation
    checkpointing; `zeros_like(..., device="cuda")`) cannot run for real on a CPU-only torch and failed. Torch keeps
    `_to_copy` out of that path (`avoid_device_init`); these go the fake way too, their inputs' constants hidden
    for the call and kept."""

    @functools.wraps(dispatch_impl)
    def _dispatch_impl(self: FakeTensorMode, func: Any, types: Any, args: tuple, kwargs: dict) -> Any:
        device = kwargs.get("device") if kwargs else None
        if device is None or torch.device(device).type == "cpu":
            return dispatch_impl(self, func, types, args, kwargs)
        held = [t for t in _tensors_of(args) if isinstance(t, FakeTensor) and t.constant is not None]
        kept = [t.constant for t in held]
        for t in held:
            t.constant = None
        try:
            return dispatch_impl(self, func, types, args, kwargs)
        finally:
            for t, constant in zip(held, kept):
                t.constant = constant

    _dispatch_impl.__phantora_devices__ = True           # type: ignore[attr-defined]
    return _dispatch_impl


def _tensors_of(args: Any) -> list:
    return [a for a in torch.utils._pytree.tree_leaves(args) if isinstance(a, torch.Tensor)]


def make_fake_mode(cuda_build: bool = False) -> FakeTensorMode:
    """The rank's fake mode; `cuda_build`: the rank's torch is a CUDA build (build.TorchInstall.cuda_build)."""
    import torch._subclasses.fake_tensor as fake_tensor

    FakeTensorMode.avoid_device_init = property(lambda self: True)   # type: ignore[assignment]
    if not getattr(FakeTensorMode._dispatch_impl, "__phantora_devices__", False):
        FakeTensorMode._dispatch_impl = _no_constants_onto_devices(  # type: ignore[method-assign]
            FakeTensorMode._dispatch_impl)
    if cuda_build and not getattr(FakeTensorMode._dispatch_impl, "__wrapped_phantora__", False):
        FakeTensorMode._dispatch_impl = _no_real_device_copies(  # type: ignore[method-assign]
            FakeTensorMode._dispatch_impl)
    # FakeTensor creation would allocate one real element on a CUDA build's GPU ("init_gpu_context"): skip it.
    fake_tensor.init_gpu_context = lambda device: None
    return FakeTensorMode(allow_non_fake_inputs=True)


# ---- swap_tensors --------------------------------------------------------------------------------------------------

def _swap_fake(t1: torch.Tensor, t2: torch.Tensor, keep_attributes: bool = False) -> None:
    """swap_tensors without the weak-reference check (fake tensors are weakly referenced by their fake mode).

    `keep_attributes`: `t1` keeps the Python attributes it had that `t2` lacks. `nn.Module._apply` (`.to()`,
    `.cuda()`, `.bfloat16()`) swaps fake parameters because they are fake; on a GPU machine it assigns `param.data`
    instead, and the parameter keeps the attributes a framework set on it (Megatron's `tensor_model_parallel`,
    `sequence_parallel`, `shared`, `allreduce`). Without them, one rank left every parameter out of its gradient
    norm."""
    slots1 = set(copyreg._slotnames(t1.__class__))   # type: ignore[attr-defined]
    slots2 = set(copyreg._slotnames(t2.__class__))   # type: ignore[attr-defined]
    if slots1 != slots2:
        raise RuntimeError("Cannot swap t1 and t2 if they have different slots")
    kept = dict(t1.__dict__) if keep_attributes else {}
    # `param.data = new` keeps the parameter's class as well, where that class is already a fake tensor's: an
    # uninitialised parameter of a lazy module moved with `.to()` stays uninitialised
    names = ("__dict__",) if keep_attributes and issubclass(type(t1), type(t2)) else ("__class__", "__dict__")
    for name in names:
        a, b = getattr(t1, name), getattr(t2, name)
        setattr(t1, name, b)
        setattr(t2, name, a)
    for key, value in kept.items():
        if key not in t1.__dict__:
            t1.__dict__[key] = value
    for slot in slots1:
        h1, h2 = hasattr(t1, slot), hasattr(t2, slot)
        a = getattr(t1, slot) if h1 else None
        b = getattr(t2, slot) if h2 else None
        if h2:
            setattr(t1, slot, b)
        elif h1:
            delattr(t1, slot)
        if h1:
            setattr(t2, slot, a)
        elif h2:
            delattr(t2, slot)
    torch._C._swap_tensor_impl(t1, t2)
    # the value table's bookkeeping, which a GPU run does not do, is not the framework's work: uncounted (its cost
    # depends on how many tensors the garbage collector has yet to free)
    METER.enter(1)
    try:
        VALUES.swap(t1, t2)
    finally:
        METER.exit()


_MODULE_APPLY_CODE = torch.nn.Module._apply.__code__


def _install_swap() -> None:
    original = torch.utils.swap_tensors
    if getattr(original, "__phantora__", False):
        return

    @functools.wraps(original)
    def swap_tensors(t1, t2):
        if isinstance(t1, FakeTensor) or isinstance(t2, FakeTensor):
            keep = (sys._getframe(1).f_code is _MODULE_APPLY_CODE
                    and not torch.__future__.get_swap_module_params_on_conversion())
            return _swap_fake(t1, t2, keep_attributes=keep)
        return original(t1, t2)

    swap_tensors.__phantora__ = True   # type: ignore[attr-defined]
    torch.utils.swap_tensors = swap_tensors


# ---- lazy modules ----------------------------------------------------------------------------------------------------

class _FakeUninitialized(FakeTensor):
    """Base of the fake stand-ins for `nn.UninitializedParameter` / `nn.UninitializedBuffer` (below): after the
    mixin's check of what may be called on an uninitialised tensor, a buffer's methods return uninitialised buffers,
    as `Tensor.__torch_function__` makes them on a GPU (`.cuda()`, `.half()`). A parameter's class stops at
    `Parameter`'s, which returns plain tensors, as on a GPU."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        with torch._C.DisableTorchFunctionSubclass():
            ret = func(*args, **(kwargs or {}))
        if func in torch.overrides.get_default_nowrap_functions():
            return ret
        return _as_fake_subclass(ret, cls)


def _as_fake_subclass(ret: Any, cls: type) -> Any:
    """`ret.as_subclass(cls)` for fake results (a fake tensor cannot be re-wrapped: its class is changed instead)."""
    if isinstance(ret, FakeTensor) and not isinstance(ret, cls):
        ret.__class__ = cls
    elif isinstance(ret, (tuple, list)):
        ret = type(ret)(_as_fake_subclass(r, cls) for r in ret)
    return ret


_FAKE_UNINITIALIZED: dict[type, type] = {}
_PROGRAM_MODES: list = []      # the interceptor: on the dispatch-mode stack while the program (not a dispatch) runs


def _program_runs() -> bool:
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
    return bool(_PROGRAM_MODES) and _PROGRAM_MODES[0] in _get_current_dispatch_mode_stack()


def _fake_uninitialized_class(cls: type) -> type:
    """The fake counterpart of an uninitialised tensor class: the class itself (its name, its checks, `materialize`)
    over a fake tensor, becoming a plain fake tensor when materialised (a parameter keeps `_is_param`, so it is a
    `Parameter` to `isinstance` like every fake parameter). Its `shape` raises the class's error to the program; the
    fake mode's dispatch of the ops allowed on it (`.to()`, `.data`) reads its size, which C++ reads on a GPU."""
    if issubclass(cls, FakeTensor):
        return cls
    fake = _FAKE_UNINITIALIZED.get(cls)
    if fake is None:
        program_shape = cls.shape.fget

        def shape(self):
            return program_shape(self) if _program_runs() else self.size()

        def __reduce_ex__(self, proto):
            return (cls, (self.requires_grad,))
        fake = type(cls)(cls.__name__, (cls, _FakeUninitialized),
                         {"cls_to_become": FakeTensor, "shape": property(shape), "__reduce_ex__": __reduce_ex__,
                          "__module__": cls.__module__, "__qualname__": cls.__qualname__})
        _FAKE_UNINITIALIZED[cls] = fake
    return fake


def _install_uninitialized() -> None:
    """`nn.Lazy*` modules hold `UninitializedParameter` / `UninitializedBuffer`s until their first forward. Their
    constructors wrap `torch.empty(0)` with `Tensor._make_subclass`, which refuses a fake tensor (it already is a
    `FakeTensor`). Under the fake mode they are made of the fake empty tensor instead, given the fake counterpart of
    the class: they move with `.to()` / `.cuda()`, and `materialize` (the first forward) gives them a fake tensor of
    the inferred shape on their device, as on a GPU."""
    from torch.nn.parameter import UninitializedBuffer, UninitializedParameter

    if "uninitialized" in _PATCHED:
        return
    _PATCHED["uninitialized"] = (UninitializedParameter.__new__, UninitializedBuffer.__new__)
    param_new, buffer_new = _PATCHED["uninitialized"]

    def parameter(cls, requires_grad=True, device=None, dtype=None):
        data = torch.empty(0, device=device, dtype=dtype)
        if not isinstance(data, FakeTensor):
            return param_new(cls, requires_grad, device, dtype)
        data.requires_grad_(requires_grad)
        data._is_param = True
        data.__class__ = _fake_uninitialized_class(cls)
        return data

    def buffer(cls, requires_grad=False, device=None, dtype=None, persistent=True):
        data = torch.empty(0, device=device, dtype=dtype)
        if not isinstance(data, FakeTensor):
            return buffer_new(cls, requires_grad, device, dtype, persistent)
        data.requires_grad_(requires_grad)
        data.__class__ = _fake_uninitialized_class(cls)
        data.persistent = persistent
        data._is_buffer = True
        return data

    UninitializedParameter.__new__ = parameter
    UninitializedBuffer.__new__ = buffer


# ---- DeviceMesh ------------------------------------------------------------------------------------------------------

def _real_args(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Fake tensors with a known value (a small rank tensor built under the fake mode) as real tensors."""
    def conv(x: Any) -> Any:
        if isinstance(x, FakeTensor):
            v = VALUES.get(x)
            return v if v is not None else x
        return x
    return tuple(conv(a) for a in args), {k: conv(v) for k, v in kwargs.items()}


def _unfaked(fn: Any) -> Any:
    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        args, kwargs = _real_args(args, kwargs)
        with unset_fake_temporarily():
            return fn(*args, **kwargs)
    wrapped.__phantora__ = True   # type: ignore[attr-defined]
    return wrapped


def patch_device_mesh(module: Any) -> None:
    """Run DeviceMesh bookkeeping with the fake mode unset: its rank tensors must be real CPU tensors."""
    cls = getattr(module, "DeviceMesh", None)
    if cls is None or getattr(cls.__init__, "__phantora__", False):
        return
    for name, attr in list(vars(cls).items()):
        if name.startswith("__") and name not in ("__init__", "__getitem__"):
            continue
        if isinstance(attr, property):
            setattr(cls, name, property(_unfaked(attr.fget) if attr.fget else None,
                                        _unfaked(attr.fset) if attr.fset else None, attr.fdel, attr.__doc__))
        elif isinstance(attr, staticmethod):
            setattr(cls, name, staticmethod(_unfaked(attr.__func__)))
        elif isinstance(attr, classmethod):
            setattr(cls, name, classmethod(_unfaked(attr.__func__)))
        elif callable(attr) and not isinstance(attr, type):
            setattr(cls, name, _unfaked(attr))
    fn = getattr(module, "init_device_mesh", None)
    if fn is not None and not getattr(fn, "__phantora__", False):
        module.init_device_mesh = _unfaked(fn)
    setup = getattr(cls, "_setup_world_group_and_device", None)
    if setup is not None and not getattr(setup, "__phantora_device__", False):
        cls._setup_world_group_and_device = _selecting_device(setup)


def _selecting_device(setup: Any) -> Any:
    """DeviceMesh's world setup sets the process's CUDA device when CUDA is not initialised yet (the program has not
    chosen one): `LOCAL_RANK`, else the global rank modulo the host's GPUs (torch/distributed/device_mesh.py). The
    simulated CUDA answers `is_initialized()` True from the start, so the choice is made here, on the same rule,
    where the program has neither set a device nor made a CUDA tensor (cuda_device.device_selected)."""
    @functools.wraps(setup)
    def _setup_world_group_and_device(self, *args: Any, **kwargs: Any) -> Any:
        from . import cuda_device
        if getattr(self, "_device_type", None) == "cuda" and not cuda_device.device_selected():
            if "LOCAL_RANK" in os.environ:
                cuda_device.set_device(int(os.environ["LOCAL_RANK"]))
            elif torch.distributed.is_initialized():
                cuda_device.set_device(torch.distributed.get_rank() % cuda_device.device_count())
        return setup(self, *args, **kwargs)
    _setup_world_group_and_device.__phantora_device__ = True      # type: ignore[attr-defined]
    return _setup_world_group_and_device


def patch_tensor_receiving(module: Any) -> None:
    """Tensors received from another process (`torch.multiprocessing`'s queues: a DataLoader worker's batches) are
    rebuilt with the fake mode unset: they arrive in shared memory holding real data, and rebuilt under the mode the
    empty fake tensor cannot take their real storage (PyTorch refuses to set a meta tensor's storage to a CPU one).
    They reach the rank as real CPU tensors, as when a pin-memory thread (where the mode is not active) receives them."""
    for name in ("rebuild_tensor", "rebuild_nested_tensor"):
        fn = getattr(module, name, None)
        if fn is not None and not getattr(fn, "__phantora__", False):
            setattr(module, name, _unfaked(fn))


# ---- record_stream ---------------------------------------------------------------------------------------------------

def _install_record_stream() -> None:
    """`record_stream` keeps a block from reuse until a stream's work is done: a metadata op to the interceptor (the
    allocator model does not track it). A no-op Meta kernel for fake tensors, and a no-op CUDA kernel for the calls
    made with the modes switched off (FSDP1 calls it under `no_dispatch()`), which reach the CUDA backend that a CPU
    build of torch lacks."""
    if "record_stream" in _PATCHED:
        return
    lib = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lib.impl("record_stream", lambda self, s: None, "Meta")
        lib.impl("record_stream", lambda self, s: None, "CUDA")
    _PATCHED["record_stream"] = lib


# ---- data pointers ---------------------------------------------------------------------------------------------------

def _install_data_pointers() -> None:
    """A fake tensor's storage is a meta storage, whose data pointer is 0: every tensor would seem to share memory with
    every other, and code that tells storages apart by their pointers (FSDP1's `_same_storage`, shared-weight
    detection by `untyped_storage().data_ptr()`, DeepSpeed's checks) would read that placeholder as data. A meta
    storage of some bytes answers a distinct address instead, 512-byte aligned as the CUDA caching allocator's blocks
    (its C++ object's address, shifted: unique among live storages), and a fake tensor its storage's address plus its
    offset, as on a GPU. Real storages answer as before."""
    if "data_ptr" in _PATCHED:
        return
    original = _PATCHED["data_ptr"] = torch.UntypedStorage.data_ptr

    def storage_data_ptr(self) -> int:
        METER.enter()                  # a C call in a real run: the stand-in's Python is not the framework's
        try:
            if self.device.type != "meta":
                return original(self)
            return self._cdata << 9 if self.nbytes() else 0
        finally:
            METER.exit()

    def tensor_data_ptr(self) -> int:
        METER.enter()
        try:
            base = storage_data_ptr(self.untyped_storage())
            return base + self.storage_offset() * self.element_size() if base else 0
        finally:
            METER.exit()

    torch.UntypedStorage.data_ptr = storage_data_ptr
    FakeTensor.data_ptr = tensor_data_ptr


def _install_data_setter() -> None:
    """`t.data = new` (`nn.Module` code, FSDP2's `_move_states_to_device`, accelerate, DeepSpeed) gives `t` the storage,
    shape and dtype of `new` in C++, but a fake tensor's device is a Python attribute (`fake_device`) and its known
    value a side table (values.py): a CPU parameter given a CUDA tensor's data still said `cpu` (FSDP2 then refused
    it), and kept the value it had before. Both now follow `new`, as on a GPU."""
    if "data" in _PATCHED:
        return
    base = _PATCHED["data"] = torch._C.TensorBase.data

    def set_data(self, new) -> None:
        METER.enter()                  # a C call in a real run
        try:
            base.__set__(self, new)
            if isinstance(new, FakeTensor):
                self.fake_device = new.fake_device
            value = VALUES.get(new) if isinstance(new, FakeTensor) else None
            if value is not None:
                VALUES.set(self, value, shared=True)
            else:
                VALUES.drop(self)
        finally:
            METER.exit()

    # the getter stays the C one: reading `t.data` runs no Python, as in a real run
    FakeTensor.data = property(base.__get__, set_data)


def _install_format() -> None:
    """`f"{loss:.4f}"` formats a 0-d tensor's value on a GPU (`Tensor.__format__` calls `item()` for an exact `Tensor`,
    which a fake tensor is not, and then `object.__format__` refuses the spec): a 0-d fake tensor formats what
    `item()` answers (its known value or the placeholder), with the host's read-back of a real run."""
    if "format" in _PATCHED:
        return
    base = _PATCHED["format"] = torch.Tensor.__format__

    def fake_format(self, format_spec):
        if type(self) is FakeTensor and self.dim() == 0 and not self.is_meta:
            return self.item().__format__(format_spec)
        return base(self, format_spec)

    FakeTensor.__format__ = fake_format


def _install_isfinite() -> None:
    """`torch.isfinite(x)` of a tensor whose value is unknown answers True, as `isnan` and `isinf` answer False: the
    placeholders assume no inf or NaN (values.py). It is a composite op (`x == x` and `abs(x) != inf`), whose parts'
    unknown bool results would read False: `if not torch.isfinite(loss)` would skip every step."""
    if "isfinite" in _PATCHED:
        return
    function = _PATCHED["isfinite"] = torch.isfinite
    method = torch.Tensor.isfinite

    def assume_finite(x, out):
        if isinstance(out, FakeTensor) and isinstance(x, FakeTensor) and not VALUES.has_value(x) \
                and out.device.type != "meta":
            if small_buffer(out):
                with unset_fake_temporarily():
                    VALUES.set(out, torch.ones(tuple(out.shape), dtype=torch.bool))
            else:               # too large for the table: all True, so `isfinite(grad).all()` reads True
                VALUES.set_uniform(out, True)
        return out

    def isfinite(input):
        out = function(input)          # the framework's ops (a C function in a real run): counted
        METER.enter()
        try:
            return assume_finite(input, out)
        finally:
            METER.exit()

    def tensor_isfinite(self):
        out = method(self)
        METER.enter()
        try:
            return assume_finite(self, out)
        finally:
            METER.exit()

    torch.isfinite = isfinite
    torch.Tensor.isfinite = tensor_isfinite


# ---- torch.compile ---------------------------------------------------------------------------------------------------

def _install_compile() -> None:
    """torch.compile runs Dynamo, AOTAutograd and Inductor's scheduler; the kernels are simulated (compiled.py).

    Inductor's hooks are installed at the first call of `torch.compile` (or `nn.Module.compile`, which calls it):
    importing Inductor takes seconds, which a program that never compiles should not wait for, and it happens inside
    the stubs (not the framework's host work)."""
    if "compile" in _PATCHED:
        return
    original = _PATCHED["compile"] = torch.compile

    @functools.wraps(original)
    def compile(*args: Any, **kwargs: Any) -> Any:
        from . import compiled
        if torch.compile is compile:
            METER.enter(2)
            try:
                compiled.install(original)
            finally:
                METER.exit()
        return torch.compile(*args, **kwargs)

    torch.compile = compile


# ---- flex attention, set_timeout -------------------------------------------------------------------------------------

def patch_flex_attention(module: Any) -> None:
    """Eager flex attention as the higher-order ops the interceptor sees, without the eager path's Python cost.

    `_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG` makes `flex_attention` call the `flex_attention` higher-order op
    directly instead of through `torch.compile` (unavailable here). That eager path traces `score_mod` and
    `mask_mod` into graphs on every call (milliseconds of Python per call, forward and backward), work a compiled
    run does once: `flex_attention`, `create_block_mask` and the higher-order op's backward are kept out of the
    framework CPU time. Inside a compiled region Dynamo traces them as usual (the higher-order ops become nodes of
    the graph, costed as extern kernels: compiled.py, docs/compile.md). Frameworks that bind them at import
    (`from ... import flex_attention`) get the wrapped functions, since this runs right after the module is imported.
    """
    module._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = True
    for name in ("flex_attention", "create_block_mask"):
        fn = getattr(module, name, None)
        if fn is not None:
            setattr(module, name, unmetered(fn))
    try:
        from torch._higher_order_ops import flex_attention as hop
    except ImportError:
        return
    op = getattr(hop, "FlexAttentionAutogradOp", None)
    if op is not None and "backward" in vars(op):
        op.backward = staticmethod(unmetered(vars(op)["backward"].__func__
                                               if isinstance(vars(op)["backward"], staticmethod)
                                               else vars(op)["backward"]))


def patch_sharding_propagation(module: Any) -> None:
    """DTensor's sharding propagator runs each new op on global-shape fake tensors to learn the output metadata:
    run that in the interceptor's shadow mode, so it is neither costed as a kernel nor counted as memory."""
    from .interceptor import shadow

    cls = getattr(module, "ShardingPropagator", None)
    fn = getattr(cls, "_propagate_tensor_meta_non_cached", None) if cls is not None else None
    if fn is None or getattr(fn, "__phantora__", False):
        return

    @functools.wraps(fn)
    def propagate(self, op_schema):
        with shadow():
            return fn(self, op_schema)

    propagate.__phantora__ = True   # type: ignore[attr-defined]
    cls._propagate_tensor_meta_non_cached = propagate


def patch_distributed(module: Any) -> None:
    if not hasattr(module, "set_timeout"):
        def set_timeout(timeout: Any, group: Any = None) -> None:
            """No-op stand-in (this torch has no torch.distributed.set_timeout)."""
            return None
        module.set_timeout = set_timeout


# ---- host reads: tolist / numpy, storage resize ----------------------------------------------------------------------

def _install_tensor_readers(ctx) -> None:
    if "tolist" in _PATCHED:
        return
    orig_tolist = torch.Tensor.tolist
    orig_numpy = torch.Tensor.numpy
    _PATCHED["tolist"] = orig_tolist
    _PATCHED["numpy"] = orig_numpy

    def _host_read(t: torch.Tensor) -> None:
        if t.device.type == "cuda" and ctx.interceptor is not None:
            ctx.interceptor._host_read(t, t.numel() * t.element_size(), whole=True)

    def tolist(self):
        if not isinstance(self, FakeTensor):
            out = orig_tolist(self)
            if conversions.active():
                METER.enter()
                try:
                    conversions.charge_to_list(self)
                finally:
                    METER.exit()
            return out
        METER.enter()
        try:
            _host_read(self)
            conversions.charge_to_list(self)      # model mode: its elements (conversions.py)
            real = VALUES.real_or_zeros(self)
            with unset_fake_temporarily():
                return orig_tolist(real)
        finally:
            METER.exit()

    def numpy(self, *, force: bool = False):
        if not isinstance(self, FakeTensor):
            return orig_numpy(self, force=force)
        METER.enter()
        try:
            if self.device.type == "cuda" and not force:
                raise TypeError(f"can't convert {self.device} device type tensor to numpy. Use Tensor.cpu() to "
                                "copy the tensor to host memory first.")
            if not force and torch.is_grad_enabled() and self.requires_grad:     # ATen's next check
                raise RuntimeError("Can't call numpy() on Tensor that requires grad. Use tensor.detach().numpy() "
                                   "instead.")
            _host_read(self)
            real = VALUES.real_or_zeros(self)
            with unset_fake_temporarily():
                return orig_numpy(real)
        finally:
            METER.exit()

    def fake_repr(self, *, tensor_contents=None):
        """`repr(t)` / `print(t)` as for a tensor on a GPU, `tensor([...], device='cuda:0', grad_fn=<...>)`: its
        known value or the placeholders (zeros), read back to the host as printing does."""
        if type(self) is not FakeTensor or tensor_contents is not None or self.device.type == "meta":
            return _PATCHED["repr"](self, tensor_contents=tensor_contents)
        METER.enter()
        try:
            from torch._tensor_str import _add_suffixes, _tensor_str
            summarize = self.numel() > torch._tensor_str.PRINT_OPTS.threshold
            _host_read(self if not summarize else self.reshape(-1)[:1])
            value = VALUES.get(self)
            with unset_fake_temporarily():
                proxy = value if value is not None else torch.zeros((), dtype=self.dtype).expand(tuple(self.shape))
                prefix = "tensor("
                suffixes = []
                if self.device.type != "cpu":
                    suffixes.append(f"device='{self.device}'")
                if self.numel() == 0:
                    if self.dim() != 1:
                        suffixes.append(f"size={tuple(self.shape)}")
                    if self.dtype != torch.get_default_dtype():
                        suffixes.append(f"dtype={self.dtype}")
                    contents = "[]"
                else:
                    if self.dtype not in (torch.get_default_dtype(), torch.cdouble, torch.long, torch.bool):
                        suffixes.append(f"dtype={self.dtype}")
                    contents = _tensor_str(proxy, len(prefix))
                if self.grad_fn is not None:
                    name = type(self.grad_fn).__name__
                    if name == "CppFunction":
                        name = self.grad_fn.name().rsplit("::", 1)[-1]
                    suffixes.append(f"grad_fn=<{name}>")
                elif self.requires_grad:
                    suffixes.append("requires_grad=True")
                return _add_suffixes(prefix + contents, suffixes, len(prefix), False)
        finally:
            METER.exit()

    torch.Tensor.tolist = tolist
    torch.Tensor.numpy = numpy
    _PATCHED["repr"] = FakeTensor.__repr__
    FakeTensor.__repr__ = fake_repr
    if "tolist" in FakeTensor.__dict__:
        # FakeTensor's own tolist reads element by element (`[elem.item() for elem in self]`): one host read and
        # two dispatches per element, where a real tolist is one copy to the host and one built-in call
        _PATCHED["fake_tolist"] = FakeTensor.__dict__["tolist"]
        FakeTensor.tolist = tolist

    orig_resize = torch.UntypedStorage.resize_
    _PATCHED["storage_resize"] = orig_resize

    def resize_(self, size):
        out = orig_resize(self, size)
        if self.device.type == "meta" and ctx.mem is not None:
            METER.enter()
            try:
                ctx.mem.storage_resized(self, None)
            finally:
                METER.exit()
        return out

    torch.UntypedStorage.resize_ = resize_


# ---- optimizers ------------------------------------------------------------------------------------------------------

def _install_foreach_types() -> None:
    """Parameters holding fake tensors are FakeTensors: let optimizers take their default foreach path as on CUDA."""
    import torch.optim.optimizer as optimizer
    from torch.utils import _foreach_utils

    for types_list in (optimizer._foreach_supported_types, _foreach_utils._foreach_supported_types):
        if FakeTensor not in types_list:
            types_list.append(FakeTensor)


# ---- iteration marks -------------------------------------------------------------------------------------------------

def _install_iteration_marks(ctx) -> None:
    """An OpKind.ITER_MARK after every outermost optimizer step (arg: the number of such steps so far).

    Frameworks wrap their optimizers in a container that is itself an Optimizer (TorchTitan's
    OptimizersContainer steps each inner optimizer from its own step()): only the outermost step of a nest
    marks an iteration.
    """
    if "iter_marks" in _PATCHED:
        return
    from phantora.engine.ops import Op, OpKind
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    steps = ITERATIONS
    depth = [0]

    def enter(optimizer, args, kwargs) -> None:
        depth[0] += 1

    import weakref

    stepped = weakref.WeakSet()       # optimizers that have stepped (a dead one cannot step again)
    last: list = [None]               # weak reference to the optimizer that stepped last

    def mark(optimizer, args, kwargs) -> None:
        depth[0] = max(depth[0] - 1, 0)
        if depth[0] or _UNMARKED[0]:
            return
        steps[0] += 1
        if optimizer is not None:
            previous = last[0]() if last[0] is not None else None
            # two optimizers taking turns (a GAN's): one steps again after another did. One optimizer replacing
            # another (a new phase, a re-created optimizer) marks one iteration per training step all the same.
            if previous is not None and previous is not optimizer and optimizer in stepped:
                from .errors import note_once
                note_once("optimizers", "two optimizers take turns stepping in this program (a GAN's, say): each "
                          "outermost optimizer step marks an iteration, so the summary's iteration figures are per "
                          "optimizer step, not per training step; the program's own step times are not affected "
                          "(docs/live-runs.md)")
            stepped.add(optimizer)
            last[0] = weakref.ref(optimizer)
        METER.enter()
        try:
            ctx.runtime.submit(Op(OpKind.ITER_MARK, arg=steps[0], cpu_delta=METER.claim()))
        finally:
            METER.exit()

    _PATCHED["iter_marks_pre"] = register_optimizer_step_pre_hook(enter)
    _PATCHED["iter_marks"] = register_optimizer_step_post_hook(mark)
    _ITERATION_STEP[:] = [enter, mark]


_ITERATION_STEP: list = []
_UNMARKED = [0]
"""Depth of framework set-up calls whose optimizer steps are no iteration (`without_iteration_marks`)."""


def without_iteration_marks(fn):
    """Wrap a framework's set-up that steps its optimizer to create the optimizer's state (DeepSpeed's
    `initialize_optimizer_states`): its steps mark no iteration."""
    import functools

    @functools.wraps(fn)
    def setup(*args, **kwargs):
        _UNMARKED[0] += 1
        try:
            return fn(*args, **kwargs)
        finally:
            _UNMARKED[0] -= 1
    setup._phantora = True
    return setup
ITERATIONS = [0]
"""Iteration marks this process has sent so far (outermost optimizer steps)."""


def iteration_step(fn):
    """Wrap a framework's optimizer step that is not a torch Optimizer (DeepSpeed's engine steps its ZeRO optimizer,
    which steps the inner optimizer once per parameter sub-group): the call is the outermost step of its nest, so it
    marks one iteration however many inner steps it takes."""
    import functools

    @functools.wraps(fn)
    def step(*args, **kwargs):
        if not _ITERATION_STEP:
            return fn(*args, **kwargs)
        enter, mark = _ITERATION_STEP
        enter(None, args, kwargs)
        try:
            return fn(*args, **kwargs)
        finally:
            mark(None, args, kwargs)
    step._phantora = True
    return step


# ---- fork ------------------------------------------------------------------------------------------------------------

def _leave_fake_in_child(ctx) -> None:
    """In a forked child (a DataLoader worker): leave the modes, so the child makes real CPU tensors."""
    try:
        if ctx.interceptor is not None:
            ctx.interceptor.__exit__(None, None, None)
        if ctx.fake_mode is not None:
            ctx.fake_mode.__exit__(None, None, None)
    except Exception:  # noqa: BLE001 - nothing sensible to do in a child
        pass
    ctx.extras["forked_child"] = True
    forked_children.enter_in_child()            # the rank's fake tensors read as their values (or zeros) there


def _install_scalar_read_kernel(ctx) -> None:
    """A CUDA kernel for `aten::_local_scalar_dense`: reads of a CUDA tensor's element that happen below the Python
    dispatcher, where no mode sees them.

    `torch.tensor([t0, t1, ...])` over 0-d CUDA tensors reads each element in C++ with the modes switched off
    (tensor_new.cpp), so the read reaches the CUDA backend, which a CPU build lacks (Megatron-core's multi-tensor
    L2 norm does this). As on a GPU, each read is a blocking device-to-host copy; its value comes from the value
    table (a placeholder when unknown), as `.item()` does."""
    if "scalar_read" in _PATCHED:
        return
    lib = torch.library.Library("aten", "IMPL")

    def local_scalar_dense(t):
        METER.enter()
        try:
            if ctx.interceptor is not None:
                ctx.interceptor._host_read(t, t.element_size())
            return VALUES.item(t)
        finally:
            METER.exit()

    lib.impl("_local_scalar_dense", local_scalar_dense, "CUDA")
    _PATCHED["scalar_read"] = lib


def _mark_cuda_initialized() -> None:
    """Have torch's C++ side record CUDA as initialized, as the first CUDA call of a real program does.

    `torch.tensor(data, device='cuda')` under a fake mode picks device 0 rather than the current device while torch
    believes CUDA uninitialized (tensor_new.cpp), and torch never initializes it under a fake mode: on a rank whose
    current device is 1 the tensor landed on cuda:0 (Megatron's loss scale then met the loss on cuda:1). A CUDA
    factory call outside the fake mode runs torch's lazy initialization (our `torch.cuda._lazy_init`, a no-op) and
    sets the flag; the allocation that follows fails on a CPU build, which is all it is asked for."""
    try:
        torch.zeros(0, device="cuda")
    except Exception:  # noqa: BLE001 - no CUDA allocator on a CPU build: the initialization flag is set already
        pass


# ---- installation ----------------------------------------------------------------------------------------------------

def install(ctx) -> None:
    """Patch torch and enter the global fake mode and the interceptor (idempotent)."""
    from . import interceptor, triton_stub

    if ctx.fake_mode is not None:
        return
    _install_swap()
    _install_uninitialized()
    _install_data_pointers()
    _install_data_setter()
    _install_format()
    _install_isfinite()
    saving.install()
    torch_profiler.install()
    _install_record_stream()
    _install_compile()
    triton_stub.install()
    _install_tensor_readers(ctx)
    _install_scalar_read_kernel(ctx)
    _install_foreach_types()
    _install_iteration_marks(ctx)
    cuda_sdpa.install()
    program_threads.install()
    from . import cuda_dispatch
    ctx.extras["fused_cuda_ops"] = cuda_dispatch.install(ctx.config.torch_cuda, ctx.gpu.sm_version, ctx.config.sdpa)
    if ctx.config.host_cpu == "measured":
        METER.entry_cost = interceptor.calibrate_entry_cost()
        ctx.extras["entry_cost_s"] = METER.entry_cost
    else:
        METER.use_model(ctx.config.host_costs)      # the framework's host work counted and priced (clock.py)
        conversions.install(ctx)                    # and its conversions between Python data and tensors
        thread_waits.install()                      # a wait for another thread is not counted (a race)
        METER.dispatch_bias = interceptor.calibrate_dispatch_counts()
        ctx.extras["dispatch_bias"] = METER.dispatch_bias
    from .bootstrap import when_imported
    when_imported("torch.distributed.tensor._sharding_prop", patch_sharding_propagation)
    when_imported("torch.multiprocessing.reductions", patch_tensor_receiving)
    when_imported("torch.multiprocessing.reductions", forked_children.patch_sending)
    _mark_cuda_initialized()
    mode = make_fake_mode(bool(ctx.extras.get("cuda_build")))
    ictp = interceptor.Interceptor(ctx)
    _PROGRAM_MODES[:] = [ictp]
    mode.__enter__()
    ictp.__enter__()
    ctx.fake_mode = mode
    ctx.interceptor = ictp
    from . import compiled
    compiled.bind(ctx)
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=lambda: _leave_fake_in_child(ctx))
