"""The op interceptor: a TorchDispatchMode, entered above the global FakeTensorMode, that sees every aten op.

For each op it
- measures the framework CPU time since the previous op (`clock.METER`, thread CPU time read on entry and exit,
  so its own work and the fake-tensor computation it triggers are excluded) and puts it into `Op.cpu_delta`;
- runs the op under the fake mode (shapes, dtypes, devices; no data), after the checks the CUDA kernel makes and its
  meta kernel does not (cuda_checks.py);
- emits nothing for views and metadata ops and for ops on host tensors only; an op on large fake host tensors
  charges their memory traffic to the rank's CPU clock (host_compute.py);
- accounts the memory of new output storages (memtrack: OpKind.ALLOC / FREE, OOM as torch.OutOfMemoryError);
- emits the kernel (`OpKind.KERNEL`) on the current stream with the cost model's signature id, duration, FLOPs and
  bytes; copies across the host link become `OpKind.MEMCPY` (a blocking device-to-host copy waits);
- turns functional collectives (`_c10d_functional.*`, used by DTensor / tensor parallelism) into collective ops,
  and `wait_tensor` into the stream dependency on their completion;
- answers `.item()` and data-dependent ops from the value side table (values.py) or with placeholders;
- reports ops it cannot simulate with a clear message naming the op and the user's source line.

Tensor subclasses (DTensor): an op with a subclass argument is declined (NotImplemented), so the subclass runs it
and the ops it issues on its local tensors come back here with their real (per-rank) shapes; costing the op at the
subclass level would count global shapes. Inside `shadow()` (DTensor's sharding propagation) ops only run on fake
tensors. The meter subtracts `clock.METER.entry_cost` per op, the round trip into this mode measured at start-up.

SDPA: `aten::scaled_dot_product_attention` is overridden for the CUDA autograd key (cuda_sdpa.py) to call the
fused kernel CUDA's backend selection would pick; under inference mode it reaches this mode directly and is routed
the same way (`cuda_sdpa.plan_sdpa`).
"""

from __future__ import annotations

import contextlib
import math
import threading
import weakref
from dataclasses import replace
from typing import Any

import torch
from phantora.engine.ops import CostSource, Memcpy, Op, OpKind, generated_kernel_arg
from torch._subclasses.fake_tensor import (DataDependentOutputException, DynamicOutputShapeException, FakeTensor,
                                           UnsupportedOperatorException, _check_for_subclass, unset_fake_temporarily)
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.weak import WeakIdKeyDictionary

from . import (alltoall, comm, cuda_blas, cuda_checks, cuda_rng, cuda_scratch, cuda_sdpa, exchange, host_compute,
               syncbn_ops)
from .clock import METER
from .compiled import SILENT
from .clock import REAL as _REAL_CLOCKS
from .errors import UnsupportedOpError, user_location
from .routes import ROUTES
from .values import VALUES, placeholder_scalar, small_enough, storage_key

# op categories (cached per op overload)
VIEW, KERNEL, COPY, ITEM, DD_SCALAR, DD_SHAPE, FCOLL, FWAIT, PASS, SDPA, HOP, PIN, INDEX = range(13)

_METADATA = frozenset({"detach", "alias", "lift_fresh", "record_stream", "size", "stride", "storage_offset",
                       "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "is_same_size", "_version",
                       "_has_same_storage_numel", "set_", "_set_grad_enabled", "device", "layout",
                       "dtype", "_nested_tensor_size", "is_contiguous", "_assert_async", "_assert_scalar",
                       "_functional_assert_async", "_print", "sym_constrain_range", "sym_constrain_range_for_size"})
_COPIES = frozenset({"_to_copy", "copy_", "_copy_from", "_copy_from_and_resize"})
_CONDITIONAL_VIEWS = frozenset({"contiguous", "reshape", "flatten"})
"""Ops whose schema says view but that copy when the input is not in the layout asked for (cost model: movement.py)."""


def _copied(args: Any, out: Any) -> bool:
    """Whether a conditional view's result is a new tensor rather than a view of its input."""
    src = args[0] if args else None
    return (isinstance(src, torch.Tensor) and isinstance(out, torch.Tensor)
            and not torch._C._is_alias_of(out, src))
_DD_SCALAR = frozenset({"equal", "is_nonzero", "allclose"})
_DD_SHAPE = frozenset({"nonzero", "masked_select", "_unique2", "unique_consecutive", "unique_dim", "_unique"})
_INDEXING = frozenset({"index", "index_put", "index_put_", "_index_put_impl_"})
"""Advanced indexing, whose boolean (mask) indices make the shape of what they pick depend on values."""
_FCOLL_NS = frozenset({"_c10d_functional", "_c10d_functional_autograd", "c10d_functional"})
_FCOLL_NAMES = {
    "all_reduce": "all_reduce", "all_reduce_": "all_reduce", "all_reduce_coalesced": "all_reduce",
    "all_reduce_coalesced_": "all_reduce", "all_gather_into_tensor": "all_gather",
    "all_gather_into_tensor_out": "all_gather", "all_gather_into_tensor_coalesced": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter", "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "all_to_all_single": "all_to_all", "broadcast": "broadcast", "broadcast_": "broadcast",
}


_NO_DRAWS = contextlib.nullcontext()
_RANDOM: dict[Any, bool] = {}


def _random(func: Any) -> bool:
    """Whether an op draws random numbers (tagged nondeterministic_seeded: the distributions, dropout, randperm...)."""
    r = _RANDOM.get(func)
    if r is None:
        r = _RANDOM[func] = torch.Tag.nondeterministic_seeded in getattr(func, "tags", ())
    return r


def _process_group(group_name: Any) -> Any:
    """The simulated process group registered under `group_name` (c10d's registry), or None."""
    try:
        pg = torch.distributed.distributed_c10d._resolve_process_group(str(group_name))
    except (RuntimeError, AttributeError, ValueError):
        return None
    return pg if hasattr(pg, "_check_backend_device") else None


def _packet_name(func: Any) -> str:
    packet = getattr(func, "_overloadpacket", None)
    if packet is not None:
        return packet.__name__
    name = getattr(func, "__name__", None) or str(func)
    return name.split(".")[-1]


def _classify(func: Any) -> int:
    if not isinstance(func, torch._ops.OpOverload):
        return HOP
    ns = func.namespace
    name = _packet_name(func)
    if ns in _FCOLL_NS:
        return FWAIT if name == "wait_tensor" else FCOLL
    if ns == "c10d":
        return PASS            # c10d ops reach the phantora ProcessGroup, which emits the collective
    if ns == "prim" or name in _METADATA:
        return VIEW
    if ns == "aten":
        if name == "_local_scalar_dense" or name == "item":    # item reaches modes when a subclass redispatches
            return ITEM
        if name in _DD_SCALAR:
            return DD_SCALAR
        if name in _DD_SHAPE:
            return DD_SHAPE
        if name in _INDEXING:
            return INDEX
        if name in _COPIES:
            return COPY
        if name == "scaled_dot_product_attention":
            return SDPA
        if name in ("_pin_memory", "is_pinned"):
            return PIN
    if func.is_view:
        return VIEW
    return KERNEL


_RNG_WRAPPERS = frozenset({"graphsafe_run_with_rng_state", "run_with_rng_state"})
"""Higher-order ops that run one op under a given RNG state (torch._prims.rng_prims): the kernel is that op's."""


class _Shadow(threading.local):
    """Per-thread depth of `shadow()` blocks."""

    depth = 0


SHADOW = _Shadow()


@contextlib.contextmanager
def shadow():
    """Ops run inside are computed on fake tensors for their metadata only: no kernel, no memory, no values.

    For work a framework does on fake tensors to learn output shapes (DTensor's sharding propagation runs each
    new op once on global-shape fake tensors); on a real GPU no such work exists.
    """
    SHADOW.depth += 1
    try:
        yield
    finally:
        SHADOW.depth -= 1


def _has_wrapper_subclass(types: Any, args: Any, kwargs: Any) -> bool:
    """Whether an op argument is a tensor subclass other than FakeTensor (DTensor, a functional wrapper...)."""
    if not types or all(issubclass(t, FakeTensor) or t is torch.Tensor for t in types):
        return False
    return _check_for_subclass(pytree.tree_leaves((args, kwargs or {})))


def _tensors(tree: Any) -> list[torch.Tensor]:
    if isinstance(tree, torch.Tensor):
        return [tree]
    return [x for x in pytree.tree_leaves(tree) if isinstance(x, torch.Tensor)]


def _real_host_op(args: Any, kwargs: dict) -> bool:
    """Whether an op computes on real host tensors only (a real CPU tensor made in C++, where no mode sees it:
    `torch.get_rng_state()`, `torch.from_numpy`, a storage read), so it runs for real, as on a GPU machine.

    Under the fake mode such ops would return fake tensors, and their values would be placeholders: Megatron-core
    compares CPU RNG states at every RNG fork and warned each time that the state had changed."""
    first = args[0] if args else None
    if isinstance(first, FakeTensor) or (first is not None and not isinstance(first, (torch.Tensor, list, tuple))):
        return False
    device = kwargs.get("device")
    if device is not None and torch.device(device).type != "cpu":
        return False
    tensors = _tensors((args, kwargs))
    return bool(tensors) and all(type(t) is torch.Tensor and t.device.type == "cpu" for t in tensors)


def _cuda_index(tensors: list[torch.Tensor]) -> int | None:
    for t in tensors:
        d = t.device
        if d.type == "cuda":
            return d.index if d.index is not None else 0
    return None


class Interceptor(TorchDispatchMode):
    supports_higher_order_operators = True

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        """Dynamo compiles frames while this mode is active (it skips them beside a mode that says otherwise); what
        a compiled region runs comes back here through compiled.py."""
        return True

    def __init__(self, ctx):
        super().__init__()
        self.ctx = ctx
        self.rt = ctx.runtime
        self.dev = ctx.dev
        self.coster = ctx.coster
        self.mem = ctx.mem
        self.blas = cuda_blas.Workspaces(ctx.gpu.sm_version)     # the GEMM libraries' workspaces
        cuda_checks.SM_VERSION[0] = ctx.gpu.sm_version
        self._cats: dict[Any, int] = {}
        self._kernel_device: int | None = None      # the device of the process's first kernel
        self._pending: WeakIdKeyDictionary = WeakIdKeyDictionary()   # functional-collective output -> event
        self._pinned: WeakIdKeyDictionary = WeakIdKeyDictionary()    # tensors made by pin_memory()
        self._pinned_storages: dict[int, weakref.ref] = {}             # their storages -> the tensor

    # -- entry ---------------------------------------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if SHADOW.depth:
            # Metadata-only computation (DTensor sharding propagation on global shapes): no GPU work happens. The
            # fake-tensor work is host work a real run does too, so the meter goes on counting it.
            return func(*args, **(kwargs or {}))
        if SILENT.depth:
            return self._silent(func, args, kwargs or {})
        METER.enter(0)                 # first: what follows is the stubs' own work (model mode: the calls that
        try:                           # reached here are charged back per dispatch, see calibrate_dispatch_counts)
            METER.dispatch()           # one aten op through the dispatcher, as on a real run (host CPU model)
            if _has_wrapper_subclass(types, args, kwargs):
                # A tensor subclass (DTensor, ...) takes the op first; the ops it runs on its local tensors come
                # back here and are costed at their real (local) shapes, never at the subclass's global shape.
                return NotImplemented
            return self._dispatch(func, args, kwargs or {})
        finally:
            METER.exit()

    def _dispatch(self, func, args, kwargs):
        out = self._dispatch_op(func, args, kwargs)
        if kwargs.get("pin_memory") is True:         # a factory asked for pinned host memory (torch.empty(...,
            for t in _tensors(out):                    # pin_memory=True)): is_pinned() says so, as on a GPU host
                self._mark_pinned(t)
        return out

    def _dispatch_op(self, func, args, kwargs):
        if _current_fake_mode(_FAKE_KEY) is None:     # unset_fake_temporarily(): real tensors, real ops
            return func(*args, **kwargs)
        cat = self._cats.get(func)
        if cat is None:
            cat = self._cats[func] = _classify(func)
        gen = kwargs.get("generator")
        if gen is not None:
            cuda_checks.generator_device(_packet_name(func), gen, args, kwargs)
        if cat <= COPY and func is not _LIFT_FRESH and _real_host_op(args, kwargs):
            with unset_fake_temporarily():
                return func(*args, **kwargs)
        if cat == VIEW:
            out = self._run(func, args, kwargs)
            if _packet_name(func) in _CONDITIONAL_VIEWS and _copied(args, out):
                return self._conditional_copy(func, args, kwargs, out)
            if VALUES.watching() or func is _LIFT_FRESH:
                VALUES.after_op(func, _packet_name(func), args, kwargs, out)
            return out
        if cat == HOP and getattr(func, "__name__", "") in _RNG_WRAPPERS:
            # a compiled region's op run under a saved RNG state (activation checkpointing): the op is the kernel
            if func.__name__ == "run_with_rng_state":
                op, args = args[1], args[2:]
            else:
                op, args = args[0], args[1:]
            return self._dispatch(op, args, {k: v for k, v in kwargs.items() if k != "rng_state"})
        if cat == KERNEL or cat == HOP:
            return self._kernel(func, args, kwargs)
        if cat == COPY:
            return self._copy(func, args, kwargs)
        if cat == ITEM:
            return self._item(func, args, kwargs)
        if cat == FCOLL:
            return self._functional_collective(func, args, kwargs)
        if cat == FWAIT:
            return self._wait_tensor(func, args, kwargs)
        if cat == SDPA:
            return self._sdpa(args, kwargs)
        if cat == DD_SCALAR:
            return self._dd_scalar(func, args, kwargs)
        if cat == DD_SHAPE:
            return self._dd_shape(func, args, kwargs)
        if cat == PIN:
            return self._pin(func, args, kwargs)
        if cat == INDEX:
            return self._index(func, args, kwargs)
        return self._run(func, args, kwargs)     # PASS

    def _silent(self, func, args, kwargs):
        """An op of a compiled region whose work is part of a fused kernel (compiled.py): computed on fake tensors,
        its new storages tracked, no kernel and no dispatch of its own."""
        if _current_fake_mode(_FAKE_KEY) is None:
            return func(*args, **kwargs)
        out = self._run(func, args, kwargs)
        if SILENT.track and not func.is_view:
            self.mem.track(_tensors(out))
        return out

    def emit_fused(self, kind: str, name: str, numel: int, rnumel: int, nbytes: int, flops: int,
                   device: int, recipe: str | None = None) -> None:
        """One kernel Inductor generated for a compiled region (compiled.py; costed by the `fused` family). Its
        recipe (the fused ops, kernel_recipe.py), where it has one, is part of its signature: `phantora profile`
        rebuilds and times the kernel from it."""
        scalars = (("name", name), ("numel", int(numel)), ("rnumel", int(rnumel)), ("bytes", int(nbytes)),
                   ("flops", int(flops)))
        if recipe is not None:
            scalars += (("graph", recipe),)
        sig = self.coster.Signature(op=f"inductor.{kind}.default", scalars=scalars)
        c = self.coster.cost_signature(sig)
        prefix = "triton_red_" if kind == "reduction" else "triton_poi_"
        from .compiled import take_calls
        self.rt.submit(Op(OpKind.KERNEL, stream=self.dev.stream(device), name=prefix + name, sig=c.sig_id,
                          duration=c.duration, flops=c.flops, nbytes=int(c.nbytes), cpu_delta=METER.claim(),
                          source=c.source, mem=0, arg=generated_kernel_arg(take_calls())))

    # -- running under the fake mode ----------------------------------------------------------------------------
    def _run(self, func, args, kwargs):
        try:
            return func(*args, **kwargs)
        except (UnsupportedOperatorException, DynamicOutputShapeException, DataDependentOutputException,
                NotImplementedError) as exc:
            raise self._unsupported(func, exc) from None
        except RuntimeError as exc:
            text = str(exc).lower()
            if any(marker in text for marker in _NO_FAKE_IMPL):
                raise self._unsupported(func, UnsupportedOperatorException(str(func))) from None
            raise

    def _unsupported(self, func, exc: BaseException) -> UnsupportedOpError:
        if isinstance(exc, DynamicOutputShapeException):
            why = "its output shape depends on tensor values, which a simulation does not have"
        elif isinstance(exc, DataDependentOutputException):
            why = "its result depends on tensor values, which a simulation does not have"
        elif isinstance(exc, UnsupportedOperatorException):
            why = "it has no fake (meta) implementation, so its output shapes cannot be computed without data"
        else:
            why = f"the fake-tensor machinery cannot run it ({type(exc).__name__}: {exc})"
            if len(why) > 400:                 # a dispatch-key dump: its first line says it
                why = why[:400].rsplit(" ", 1)[0] + " ...)"
        hint = ("Register a fake implementation (torch.library.register_fake) for custom ops, or avoid the op in "
                "the simulated code path.")
        if "nested" in str(func):
            hint = ("Nested tensors are not simulated: nn.TransformerEncoder builds them in eval with a "
                    "src_key_padding_mask; construct it with enable_nested_tensor=False (the padded path computes "
                    "the same result), or avoid nested tensors in the simulated code path.")
        return UnsupportedOpError(f"phantora cannot simulate op {func} called at {user_location(2)}: {why}. {hint}")

    # -- kernels --------------------------------------------------------------------------------------------------
    def _emit_kernel(self, func, args, kwargs, device: int, mem: int) -> None:
        try:
            c = self.coster.cost(func, args, kwargs)
        except Exception as exc:  # noqa: BLE001 - the cost model cannot read this op: say which and where
            raise UnsupportedOpError(f"phantora cannot cost op {func} called at {user_location(2)}: "
                                     f"{type(exc).__name__}: {exc}") from None
        if c.is_view or c.family in ("view", "alloc"):
            return
        if device != self._kernel_device:
            self._another_device(device)
        self.rt.submit(Op(OpKind.KERNEL, stream=self.dev.stream(device), name=str(func), sig=c.sig_id,
                          duration=c.duration, flops=c.flops, nbytes=int(c.nbytes), cpu_delta=METER.claim(),
                          source=c.source, mem=mem))

    def _another_device(self, device: int) -> None:
        """A process's kernels on a second device (a model split over cuda:0 and cuda:1 in one process): simulated
        on one GPU's timeline and memory, which the user must be told (docs/stubs.md, "Streams")."""
        if self._kernel_device is None:
            self._kernel_device = device
            return
        from .errors import note_once
        note_once("devices", f"this process runs kernels on cuda:{self._kernel_device} and cuda:{device}: one process "
                  "driving several GPUs is simulated as one GPU (their kernels one after another, their memory in "
                  "one allocator, copies between them as copies within a GPU), so its times and memory are not "
                  "those of several GPUs; run one process per GPU (docs/stubs.md, \"Streams\")")

    def _conditional_copy(self, func, args, kwargs, out):
        """contiguous / reshape / flatten that copied (the input was not in the layout asked for): the copy kernel a
        GPU runs. These ops reach the mode whole, not as the clone they decompose into, where the Python
        dispatcher is on (inside a tensor subclass's __torch_dispatch__: torchao's Float8 matmuls lay out their
        operands so)."""
        outs = _tensors(out)
        device = _cuda_index(outs)
        if kwargs.get("memory_format") not in (None, torch.contiguous_format):
            # contiguous(memory_format=channels_last) of a row-major input: the cost model's view rule reads strides
            # against row-major only, so the copy is costed as the clone it is
            func, args, kwargs = torch.ops.aten.clone.default, args[:1], kwargs
        if device is not None:
            self._emit_kernel(func, args, kwargs, device, self.mem.track(outs))
        else:
            self._host_compute(func, _tensors(args[:1]), outs)
        VALUES.after_op(func, _packet_name(func), args, kwargs, out)
        return out

    def _kernel(self, func, args, kwargs):
        name = _packet_name(func)
        if name in cuda_checks.CHECKS and _cuda_index(_tensors(args)) is not None:
            cuda_checks.check(name, args, kwargs)      # what the CUDA kernel refuses, the simulation refuses
        out = self._run(func, args, kwargs)
        outs = _tensors(out)
        device = _cuda_index(outs)
        if device is None:
            device = _cuda_index(_tensors((args, kwargs)))
        draws = _NO_DRAWS
        if device is not None:
            mem = self.mem.track(outs)
            self.blas.take(name, device, self.mem)
            scratch = cuda_scratch.nbytes(name, args, kwargs)
            block = self.mem.scratch(scratch, device) if scratch else 0
            self._emit_kernel(func, args, kwargs, device, mem)
            if block:
                self.mem.free_scratch(block, scratch)
            if _random(func) and outs:         # the device's generator draws it, as on a GPU (cuda_rng.py)
                host = cuda_rng.draw_generator(kwargs.get("generator"), device, outs[0].numel())
                if kwargs.get("generator") is not None:
                    kwargs = {**kwargs, "generator": host}
                if all(small_enough(o) for o in outs):     # a value is drawn: an overload without a generator
                    draws = cuda_rng.host_draws(host)      # draws from the host's default one
        else:
            self._host_compute(func, _tensors((args, kwargs)), outs)
        with draws:
            VALUES.after_op(func, name, args, kwargs, out)
        if name in syncbn_ops.UPDATES_RUNNING_STATS:
            syncbn_ops.forget_running_stats(name, args, kwargs)   # written in place, undeclared by the schema
        return out

    def _host_compute(self, func, inputs: list[torch.Tensor], outputs: list[torch.Tensor],
                      kind: str | None = None) -> None:
        """An op on large fake host tensors: its memory traffic charged to the rank's CPU (host_compute.py)."""
        name = _packet_name(func)
        nbytes = host_compute.op_bytes(name, inputs, outputs)
        if nbytes >= host_compute.MIN_BYTES:
            self.rt.advance_cpu(host_compute.memory().seconds(nbytes, kind or host_compute.kind_of(name)))

    # -- copies -----------------------------------------------------------------------------------------------------
    def _copy(self, func, args, kwargs):
        out = self._run(func, args, kwargs)
        name = _packet_name(func)
        if name == "_to_copy":
            src, dst = args[0], out
        elif name == "_copy_from":          # _copy_from(self, dst): the source comes first
            src, dst = args[0], args[1]
        else:
            dst, src = args[0], args[1]
        sdev, ddev = src.device, dst.device
        if sdev.type != "cuda" and ddev.type != "cuda":
            self._host_compute(func, _tensors((args, kwargs)), _tensors(out),
                               host_compute.cast_kind(src.dtype, dst.dtype))
            VALUES.after_op(func, name, args, kwargs, out)
            return out
        mem = self.mem.track(_tensors(out))
        if sdev.type == "cuda" and ddev.type == "cuda" and sdev == ddev:
            self._emit_kernel(func, args, kwargs, ddev.index or 0, mem)
        else:
            if sdev.type != "cuda":
                direction, device = Memcpy.H2D, ddev.index or 0
            elif ddev.type != "cuda":
                direction, device = Memcpy.D2H, sdev.index or 0
            else:
                direction, device = Memcpy.D2D, sdev.index or 0
            nbytes = dst.numel() * dst.element_size()
            non_blocking = bool(kwargs.get("non_blocking", False) or (len(args) > 2 and args[2] is True))
            # A blocking copy between host and device that changes the dtype converts on the host (before an
            # upload, after a download) and moves the host side's dtype over the link; a non-blocking one converts
            # on the GPU (PyTorch's copy_kernel_cuda: the conversion device is the GPU when non_blocking) and moves
            # the GPU side's dtype.
            host_convert = src.dtype != dst.dtype and direction != Memcpy.D2D and not non_blocking
            if src.dtype != dst.dtype and direction == Memcpy.H2D and non_blocking:
                nbytes = dst.numel() * src.element_size()
            if host_convert:
                nbytes = dst.numel() * (dst.element_size() if direction == Memcpy.H2D else src.element_size())
                convert = dst.numel() * (src.element_size() + dst.element_size())
                cast = host_compute.cast_kind(src.dtype, dst.dtype)
                if direction == Memcpy.H2D and convert >= host_compute.MIN_BYTES:
                    self.rt.advance_cpu(host_compute.memory().seconds(convert, cast))
            if name == "_to_copy" and direction == Memcpy.D2H and non_blocking:
                self._mark_pinned(dst)          # PyTorch gives a non-blocking download pinned memory
            pageable = direction != Memcpy.D2D and not self._is_pinned(dst if direction == Memcpy.D2H else src)
            duration, sig, source = self._copy_cost(func, args, kwargs, pageable, non_blocking)
            arg = Memcpy.D2H_ASYNC if direction == Memcpy.D2H and non_blocking and not pageable else direction
            op = Op(OpKind.MEMCPY, stream=self.dev.stream(device), name=str(func), sig=sig, duration=duration,
                    nbytes=nbytes, arg=int(arg), cpu_delta=METER.claim(), source=source, mem=mem)
            # As CUDA and PyTorch do (phantora.probes.copyprobe): a blocking copy waits for its stream (PyTorch
            # synchronizes it after the copy); a non-blocking one to or from pinned memory returns at once; a
            # non-blocking download to pageable memory waits like a blocking one, and a non-blocking upload from
            # pageable memory holds the thread while the driver stages it, without waiting for the stream.
            if direction != Memcpy.D2D and (not non_blocking or (pageable and direction == Memcpy.D2H)):
                self.rt.wait(op)
                if direction == Memcpy.D2H and host_convert and convert >= host_compute.MIN_BYTES:
                    self.rt.advance_cpu(host_compute.memory().seconds(convert, cast))
            else:
                self.rt.submit(op)
                if pageable and direction == Memcpy.H2D:
                    self.rt.advance_cpu(duration)
        VALUES.after_op(func, name, args, kwargs, out)
        if name == "_to_copy" and ddev.type == "cpu" and out.dtype == torch.uint8:
            # a byte buffer downloaded with a known value (a generator's state, values.STATE_BYTES) arrives as a
            # real host tensor, which C++ can read: `Generator.set_state` of a state broadcast from rank 0
            known = VALUES.get(out)
            if known is not None:
                with unset_fake_temporarily():
                    return known.clone()
        return out

    def _copy_cost(self, func, args, kwargs, pageable: bool = False, non_blocking: bool = False
                   ) -> tuple[float, int, int]:
        try:
            sig = self.coster.signature_of(func, args, kwargs)
            if sig.scalar("xfer"):           # across the host link: what the link's rate depends on
                extra = (("non_blocking", True),) if non_blocking else ()
                sig = replace(sig, scalars=sig.scalars + extra + ((("pageable", True),) if pageable else ()))
            c = self.coster.cost_signature(sig)
            return c.duration, c.sig_id, c.source
        except Exception:  # noqa: BLE001 - fall back to the host link's nominal bandwidth
            return 0.0, -1, int(CostSource.NONE)

    # -- values the host reads ----------------------------------------------------------------------------------
    def _host_read(self, t: torch.Tensor, nbytes: int, whole: bool = False) -> None:
        """A small blocking device-to-host read of `nbytes` for `t` (what .item(), a bool test or a data-dependent
        op's count does on a CUDA tensor), costed as the copy it is: a scalar read (`aten._local_scalar_dense`), or
        with `whole` a download of all of `t` to pageable memory, like `.cpu()` (`tolist`, printing). It cost
        nothing until 2026-11-29."""
        if t.device.type != "cuda":
            return
        aten = torch.ops.aten
        if whole:
            func, args, kwargs = aten._to_copy.default, (t,), {"device": torch.device("cpu")}
        else:
            func, args, kwargs = aten._local_scalar_dense.default, (t,), {}     # costed by its dtype alone
        duration, sig, source = self._copy_cost(func, args, kwargs, pageable=True)
        self.rt.wait(Op(OpKind.MEMCPY, stream=self.dev.stream(t.device.index or 0),
                        name=str(func) if whole else "_local_scalar_dense", sig=sig, duration=duration,
                        source=source, nbytes=nbytes, arg=int(Memcpy.D2H), cpu_delta=METER.claim()))

    def _item(self, func, args, kwargs):
        t = args[0]
        self._host_read(t, t.element_size())
        return VALUES.item(t)

    def _dd_scalar(self, func, args, kwargs):
        name = _packet_name(func)
        tensors = _tensors((args, kwargs))
        device = _cuda_index(tensors)
        if device is not None:
            self._emit_kernel(func, args, kwargs, device, 0)
            self._host_read(tensors[0], 1)
        ra = VALUES.real_args(args, kwargs)
        if ra is not None:
            from torch._subclasses.fake_tensor import unset_fake_temporarily
            try:
                with unset_fake_temporarily():
                    return func(*ra[0], **ra[1])
            except Exception:  # noqa: BLE001 - fall through to the placeholder
                pass
        if name in ("equal", "allclose"):
            return True
        return bool(placeholder_scalar(tensors[0].dtype))

    def _dd_shape(self, func, args, kwargs):
        """Ops whose output shape depends on values: real shapes when the inputs are known, else an upper bound."""
        from torch._subclasses.fake_tensor import unset_fake_temporarily
        tensors = _tensors((args, kwargs))
        x = tensors[0]
        ra = VALUES.real_args(args, kwargs)
        real = None
        if ra is not None:
            try:
                with unset_fake_temporarily():
                    real = func(*ra[0], **ra[1])
            except Exception:  # noqa: BLE001
                real = None
        if real is not None:
            shapes = [(tuple(r.shape), r.dtype) for r in pytree.tree_leaves(real)]
        else:
            shapes = self._upper_bound_shapes(func, args, kwargs, x)
        outs = [torch.empty(s, dtype=d, device=x.device) for s, d in shapes]
        if real is not None:
            for f, r in zip(outs, pytree.tree_leaves(real)):
                VALUES.set(f, r)
        device = _cuda_index(tensors)
        if device is not None:
            mem = self.mem.track(outs)
            self._emit_kernel(func, args, kwargs, device, mem)
            self._host_read(x, 8)         # the kernel's output size is read back by the host
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _index(self, func, args, kwargs):
        """Advanced indexing. A boolean (or uint8) mask among the indices is what PyTorch turns it into: its
        `nonzero()` (a kernel, and the host reading back how many elements it found, as on a GPU), one index per
        dimension of the mask; the indexing then picks by those (`x[mask]`, `x[mask] = v`). The mask's value known,
        the real count; unknown, every element (the upper bound, as `nonzero` gives)."""
        indices = args[1] if len(args) > 1 else kwargs.get("indices")
        if not any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices or ()):
            return self._kernel(func, args, kwargs)
        fill = self._masked_fill(func, args, kwargs, indices)
        if fill is not None:
            return fill
        expanded = []
        for i in indices:
            if isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8):
                found = self._dispatch(torch.ops.aten.nonzero.default, (i,), {})
                expanded.extend(self._dispatch(torch.ops.aten.select.int, (found, 1, d), {}) for d in range(i.dim()))
            else:
                expanded.append(i)
        if len(args) > 1:
            args = (args[0], expanded, *args[2:])
        else:
            kwargs = {**kwargs, "indices": expanded}
        return self._kernel(func, args, kwargs)

    def _masked_fill(self, func, args, kwargs, indices):
        """`x[mask] = scalar` as ATen's index_put runs it (`canDispatchToMaskedFill`): one mask on `x`'s device, the
        other indices absent, a one-element value on the host, no accumulation: a `masked_fill_`, no `nonzero`
        and no read-back (the DTensor loss-parallel cross-entropy does it five times a step). None otherwise."""
        if _packet_name(func) == "index":
            return None
        names = ("self", "indices", "values", "accumulate")
        bound = dict(zip(names, args))
        bound.update({k: v for k, v in kwargs.items() if k in names})
        x, value = bound.get("self"), bound.get("values")
        if bound.get("accumulate", False) or not isinstance(value, torch.Tensor) or value.numel() != 1 \
                or value.device.type != "cpu":
            return None
        given = [(n, i) for n, i in enumerate(indices) if i is not None]
        if len(given) != 1:
            return None
        lead, mask = given[0]
        if mask.dtype not in (torch.bool, torch.uint8) or mask.device != x.device:
            return None
        trailing = x.dim() - lead - mask.dim()
        if trailing > 0:                                       # the mask covers leading dimensions: broadcast it
            mask = self._dispatch(torch.ops.aten.view.default, (mask, [*mask.shape, *([1] * trailing)]), {})
        if mask.dtype != torch.bool:
            mask = self._dispatch(torch.ops.aten._to_copy.default, (mask,), {"dtype": torch.bool})
        if _packet_name(func) == "index_put":                 # the functional form: a copy, then the fill
            x = self._dispatch(torch.ops.aten.clone.default, (x,), {})
        return self._dispatch(torch.ops.aten.masked_fill_.Tensor, (x, mask, value), {})

    def _upper_bound_shapes(self, func, args, kwargs, x) -> list[tuple[tuple[int, ...], torch.dtype]]:
        name = _packet_name(func)
        n = x.numel()
        if name == "nonzero":
            return [((n, x.dim()), torch.int64)]
        if name == "masked_select":
            mask = args[1]
            shape = torch.broadcast_shapes(x.shape, mask.shape)
            picks = ROUTES.picks(mask) if tuple(mask.shape) == tuple(shape) else None
            return [((math.prod(shape) if picks is None else picks,), x.dtype)]   # a routing map: its picks
        if name in ("_unique2", "_unique", "unique_consecutive"):
            return_inverse = bool(kwargs.get("return_inverse", args[2] if len(args) > 2 else False))
            return_counts = bool(kwargs.get("return_counts", args[3] if len(args) > 3 else False))
            if name == "_unique":
                return [((n,), x.dtype), ((tuple(x.shape) if return_inverse else (0,)), torch.int64)]
            if name == "unique_consecutive":
                return_inverse = bool(kwargs.get("return_inverse", args[1] if len(args) > 1 else False))
                return_counts = bool(kwargs.get("return_counts", args[2] if len(args) > 2 else False))
            return [((n,), x.dtype), ((tuple(x.shape) if return_inverse else (0,)), torch.int64),
                    (((n,) if return_counts else (0,)), torch.int64)]
        if name == "unique_dim":
            dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
            return [(tuple(x.shape), x.dtype), ((x.shape[dim],), torch.int64), ((x.shape[dim],), torch.int64)]
        raise self._unsupported(func, DynamicOutputShapeException(func))

    # -- pinned host memory ------------------------------------------------------------------------------------------
    def _pin(self, func, args, kwargs):
        """Pinned host memory is plain host memory here (page-locking costs are not modelled)."""
        x = args[0]
        if _packet_name(func) == "is_pinned":
            return self._is_pinned(x)
        out = torch.empty_strided(tuple(x.shape), tuple(x.stride()), dtype=x.dtype, device=x.device)
        value = VALUES.get(x)
        if value is not None:
            with unset_fake_temporarily():
                VALUES.set(out, value.clone())
        self._mark_pinned(out)
        return out

    def _mark_pinned(self, t: torch.Tensor) -> None:
        self._pinned[t] = True
        key = storage_key(t)
        if key:
            if len(self._pinned_storages) >= 4096:        # forget the storages of tensors that died
                self._pinned_storages = {k: r for k, r in self._pinned_storages.items() if r() is not None}
            self._pinned_storages[key] = weakref.ref(t)

    def _is_pinned(self, t: torch.Tensor) -> bool:
        """Whether `t` lies in pinned host memory: a tensor made pinned, or a view or `.data` of one (the same storage,
        as CUDA's pointer check answers), while that tensor lives."""
        if t in self._pinned:
            return True
        key = storage_key(t)
        ref = self._pinned_storages.get(key) if key else None
        owner = ref() if ref is not None else None
        return owner is not None and storage_key(owner) == key

    # -- functional collectives ---------------------------------------------------------------------------------
    def _functional_collective(self, func, args, kwargs):
        name = _packet_name(func)
        coll = _FCOLL_NAMES.get(name)
        if coll is None:
            raise self._unsupported(func, NotImplementedError("unknown functional collective"))
        group_name = kwargs.get("group_name")
        if group_name is None:
            pos = next((i for i, a in enumerate(func._schema.arguments) if a.name == "group_name"), None)
            if pos is not None and pos < len(args):
                group_name = args[pos]
        groups = self.ctx.groups
        info = groups.by_name(group_name) if groups is not None and group_name is not None else None
        if info is None:
            raise UnsupportedOpError(f"phantora: functional collective {func} at {user_location(2)} names process "
                                     f"group {group_name!r}, which was not created through the phantora backend")
        pg = _process_group(group_name)
        if pg is not None:            # c10d runs it through the group: a device it has no backend for is refused
            pg._check_backend_device(args[0] if args else [])
        out = self._run(func, args, kwargs)
        inputs = _tensors(args[0]) if args else []
        nbytes = sum(t.numel() * t.element_size() for t in inputs)
        root = -1
        if coll == "broadcast":
            root = int(args[1]) if len(args) > 1 and isinstance(args[1], int) else int(kwargs.get("src", 0))
        outs = _tensors(out)
        device = _cuda_index(outs) if outs else None
        if outs and device is None:     # collectives on host tensors still travel over the network
            device = self.dev.device()
        self.mem.track(outs)
        if coll == "all_to_all":
            event = self._all_to_all(args, kwargs, info, nbytes, out)
        else:
            event = comm.launch(self.ctx, OpKind.COLLECTIVE, coll, info, nbytes, root,
                                device=_cuda_index(outs) if getattr(pg, "_phantora_nccl", False) else None)
            if pg is not None:
                exchange.functional(name, info.gid, args, kwargs, out, pg._rank, info.size)
        for t in outs:
            self._pending[t] = event
        return out

    def _all_to_all(self, args, kwargs, info, nbytes: int, out) -> int:
        """`all_to_all_single(input, output_split_sizes, input_split_sizes, group_name)`: with split sizes, the
        NCCL group of transfers of alltoall.py; small inputs with known values carry them (the count exchange)."""
        inp = args[0]
        out_splits = alltoall.split_sizes(args[1] if len(args) > 1 else kwargs.get("output_split_sizes"))
        in_splits = alltoall.split_sizes(args[2] if len(args) > 2 else kwargs.get("input_split_sizes"))
        rows = (lambda t: t.shape[0] if t.dim() else 0)
        send = alltoall.split_bytes(nbytes, rows(inp), in_splits, info.size)
        recv = alltoall.split_bytes(out.numel() * out.element_size(), rows(out), out_splits, info.size)
        event, collective = alltoall.launch(self.ctx, info, nbytes, send, recv)
        me = info.ranks.index(self.ctx.config.rank)
        if collective:
            exchange.all_to_all_into(info.gid, out, inp, in_splits, me, event)
        else:
            exchange.all_to_all_uneven_into(info.gid, info.ranks, me, out, inp, in_splits, out_splits)
        return event

    def _wait_tensor(self, func, args, kwargs):
        t = args[0]
        event = self._pending.pop(t, None)
        if event is not None:
            comm.join(self.ctx, event)
        out = self._run(func, args, kwargs)
        value = VALUES.get(t) if isinstance(t, torch.Tensor) else None
        if value is not None and out is not t:         # the waited tensor keeps the value its collective carried
            VALUES.set(out, value)
        return out

    # -- attention --------------------------------------------------------------------------------------------------
    def _sdpa(self, args, kwargs):
        """aten.scaled_dot_product_attention reached the mode directly (inference mode): route it here."""
        func, fargs, fkwargs, pick = cuda_sdpa.plan_sdpa(*args, **kwargs)
        out = self._dispatch(func, fargs, fkwargs)
        return pick(out)


class _EntryProbe(TorchDispatchMode):
    """A dispatch mode whose entry and exit are the interceptor's, around an op it runs directly."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if SHADOW.depth:
            return func(*args, **(kwargs or {}))
        if _has_wrapper_subclass(types, args, kwargs):
            return NotImplemented
        METER.enter()
        try:
            return func(*args, **(kwargs or {}))
        finally:
            METER.exit()


def calibrate_entry_cost(trials: int = 7, n: int = 200) -> float:
    """Seconds of host CPU time that reaching the interceptor adds to each op, measured on this machine.

    A loop of a one-element in-place add is timed twice with no other mode active: plainly, and under a mode that
    enters and leaves like the interceptor (what the meter then counts between two ops). The difference of the
    medians is the Python dispatch-mode round trip a real run does not pay; slightly under-estimated, since the
    plain loop also includes the add itself. Never negative.
    """
    from torch.utils._python_dispatch import _disable_current_modes

    thread_time = REAL_THREAD_TIME
    plain: list[float] = []
    moded: list[float] = []
    with _disable_current_modes():
        x = torch.zeros(1)
        for _ in range(trials):
            t0 = thread_time()
            for _ in range(n):
                x.add_(1)
            plain.append((thread_time() - t0) / n)
            METER.reset()
            with _EntryProbe():
                for _ in range(n):
                    x.add_(1)
            moded.append(METER.claim() / n)
            METER.reset()
    plain.sort()
    moded.sort()
    return max(moded[len(moded) // 2] - plain[len(plain) // 2], 0.0)


class _CountProbe(Interceptor):
    """The interceptor's own entry (the same class machinery and `__torch_dispatch__`) around ops it runs directly."""

    def __init__(self):                # noqa: D107 - no context: `_dispatch` below needs none
        TorchDispatchMode.__init__(self)

    def _dispatch(self, func, args, kwargs):
        return func(*args, **kwargs)


def calibrate_dispatch_counts(n: int = 64) -> tuple[int, int, int]:
    """Python calls, built-in calls and Python lines that reaching the interceptor adds to each dispatched op (model
    mode).

    Between the C++ dispatcher and the interceptor's first statement, torch runs Python of its own for a dispatch
    mode (rule look-ups, the wrapper around `__torch_dispatch__`): work a real run, with no mode, never does. Counted
    on a loop of one-element in-place adds under a mode with the interceptor's entry, against the same loop with no
    mode, for n and 2n iterations (the difference cancels entering the mode), after one untimed loop (torch's first
    use fills caches, which is not per op). The counts are exact integers, the same on every machine; the meter
    charges them back per dispatch (`CpuMeter.dispatch_bias`).
    """
    from torch.utils._python_dispatch import _disable_current_modes

    def counted(loops: int, moded: bool) -> tuple[int, int, int]:
        x = torch.zeros(1)
        METER.reset()
        if moded:
            with _CountProbe():
                for _ in range(loops):
                    x.add_(1)
        else:
            for _ in range(loops):
                x.add_(1)
        METER.enter()
        try:
            METER.claim()
            c = METER.last_counts                    # Python calls, built-in calls, dispatches, lines
            return c[0], c[1], c[3]
        finally:
            METER.exit()
            METER.take()

    with _disable_current_modes():
        saved = METER.dispatch_bias
        METER.dispatch_bias = (0, 0, 0)
        try:
            counted(n, True)
            m1, m2 = counted(n, True), counted(2 * n, True)
            p1, p2 = counted(n, False), counted(2 * n, False)
        finally:
            METER.dispatch_bias = saved
    per = [((m2[i] - m1[i]) - (p2[i] - p1[i])) / n for i in range(3)]
    return tuple(max(round(v), 0) for v in per)


_NO_FAKE_IMPL = ("no fake impl", "no fake kernel", "no meta kernel", "no meta impl", "not implemented for 'meta'",
                 "could not run", "does not have a meta")
_LIFT_FRESH = torch.ops.aten.lift_fresh.default
REAL_THREAD_TIME = _REAL_CLOCKS["thread_time"]
_current_fake_mode = torch._C._get_dispatch_mode
_FAKE_KEY = torch._C._TorchDispatchModeKey.FAKE
