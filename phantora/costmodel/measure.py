"""Live measurement of one kernel signature on a local CUDA GPU.

Inputs are built from the signature: each tensor gets its shape, dtype and strides (over a storage large enough for
them) with sane values: floats random normal x 0.5 (made positive, |x| + 0.5, for ops such as log, sqrt, div and
Adam), integer index tensors uniform within the bound of the dimension they index (embedding rows, gather/scatter
dim, advanced-index dims, nll_loss classes), bools random. Scalars dropped from the signature (values such as
alpha, eps, lr) get plausible placeholders. Attention backward ops run their forward op first, so that `out`,
`logsumexp` and the RNG state are the real ones. A kernel Inductor generated (`inductor.*`) is rebuilt from its
recipe and compiled by Inductor here (generated.py).

Timing (`measure_signature`): warm-up runs, then each timed run is
    L2 flush (zeroing a buffer of max(256 MiB, 3 x L2)) -> GPU spin (torch.cuda._sleep) -> start event -> op -> end event
The spin keeps the GPU busy while the host enqueues the op, so the events bracket the op's GPU time only, without
the host's dispatch time (the engine models that separately) and with a cold L2 (training working sets exceed it).
They also hold the events' own overhead (about 2.4 µs on Hopper), which the cost model subtracts (model.py).
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from ..errors import PhantoraError
from . import families as fam
from .signature import Signature

DEFAULT_REPEATS = 30
DEFAULT_WARMUP = 3
TIME_BUDGET_S = 0.5               # per signature: fewer repeats for long kernels
_POSITIVE_OPS = frozenset({"log", "log_", "log1p", "log2", "log10", "sqrt", "sqrt_", "rsqrt", "rsqrt_", "pow",
                           "pow_", "reciprocal", "reciprocal_", "div", "div_", "_fused_adam_", "_fused_adamw_",
                           "_foreach_sqrt", "_foreach_sqrt_", "_foreach_div", "_foreach_div_", "_foreach_addcdiv_",
                           "_foreach_addcdiv", "_foreach_reciprocal_", "_foreach_rsqrt_", "_foreach_log"})
_DTYPE_ARGS = frozenset({"dtype", "out_dtype", "input_dtype"})
_PSEUDO_SCALARS = frozenset({"tf32", "xfer", "density"})
_PLACEHOLDERS = {"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "weight_decay": 0.01, "eps": 1e-8, "momentum": 0.9,
                 "dampening": 0.0, "alpha": 1.0, "beta": 1.0, "p": 0.1, "value": 1.0, "other": 2.0,
                 "exponent": 2.0, "scalar": 1.0, "fill_value": 1.0, "min": -1.0, "max": 1.0, "negative_slope": 0.01,
                 "threshold": 0.0, "ord": 2, "weight": 0.5, "end": 1.0, "start": 0.0}


def cuda_available() -> bool:
    """True only with a real CUDA build of torch and a visible GPU (Phantora's fake CUDA does not count)."""
    import torch

    if torch.version.cuda is None:
        return False
    try:
        return bool(torch.cuda.is_available()) and torch.cuda.device_count() > 0
    except Exception:  # noqa: BLE001 - any failure of the CUDA runtime means no usable GPU
        return False


def require_cuda() -> None:
    import torch

    if not cuda_available():
        why = "torch is built without CUDA" if torch.version.cuda is None else "no CUDA GPU is visible"
        raise PhantoraError(f"live kernel measurement needs a CUDA GPU, and {why} (torch {torch.__version__}); "
                            "use a profile database or the roofline model instead")


def local_device_name() -> str:
    require_cuda()
    import torch

    return torch.cuda.get_device_name()


def resolve_op(name: str) -> Any:
    """The op object for a signature's op name ('aten.mm.default', 'higher_order.flex_attention')."""
    import torch

    parts = name.split(".")
    if parts[0] == "fsdp":
        # FSDP2's copy-in / chunk-cat ops are registered when its collectives module is imported
        import torch.distributed.fsdp._fully_shard._fsdp_collectives  # noqa: F401
    try:
        if parts[0] == "higher_order":
            return getattr(torch.ops.higher_order, parts[1])
        packet = getattr(getattr(torch.ops, parts[0]), parts[1])
        return getattr(packet, parts[2] if len(parts) > 2 else "default")
    except (AttributeError, IndexError, RuntimeError) as e:
        raise PhantoraError(f"unknown op '{name}' in this torch ({torch.__version__}): {e}") from None


# ---- inputs -------------------------------------------------------------------------------------------------------

def _storage_size(shape: tuple[int, ...], stride: tuple[int, ...]) -> int:
    if any(s == 0 for s in shape):
        return 0
    return 1 + sum((s - 1) * abs(st) for s, st in zip(shape, stride))


def _contiguous_stride(shape: tuple[int, ...]) -> tuple[int, ...]:
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(out))


def make_tensor(shape: tuple[int, ...], dtype: str, stride: tuple[int, ...] | None, device: str, *,
                bound: int | None = None, positive: bool = False, gen: Any = None) -> Any:
    """A tensor of this shape/dtype/stride with sane values (see module docstring)."""
    import torch

    dt = getattr(torch, dtype, None)
    if not isinstance(dt, torch.dtype):
        raise PhantoraError(f"unknown dtype '{dtype}'")
    stride = tuple(stride) if stride is not None else _contiguous_stride(shape)
    n = _storage_size(shape, stride)
    dev = torch.device(device)
    if gen is None or gen.device.type != dev.type:
        gen = torch.Generator(device=dev).manual_seed(0)
    if dt.is_floating_point:
        base = torch.randn(n, generator=gen, dtype=torch.float32, device=dev) * 0.5
        if positive:
            base = base.abs() + 0.5
        base = base.to(dt)
    elif dt == torch.bool:
        base = torch.randint(0, 2, (n,), generator=gen, device=dev).to(torch.bool)
    elif dt.is_complex:
        base = torch.randn(n, generator=gen, dtype=dt, device=dev)
    else:
        hi = max(1, bound if bound is not None else 2)
        base = torch.randint(0, hi, (n,), generator=gen, dtype=torch.int64, device=dev).to(dt)
    if n == 0:
        return torch.empty_strided(shape, stride, dtype=dt, device=device)
    return base.as_strided(shape, stride)


def _index_bounds(sig: Signature) -> dict[int, int]:
    """Upper bounds for integer tensor slots that index something, by schema position."""
    name = sig.name.rstrip("_")
    t = sig.tensor
    if name == "embedding" and t(0):
        return {1: t(0)[0][0]}
    if name == "embedding_dense_backward":
        return {1: int(sig.scalar("num_weights", 1))}
    if name in ("gather", "scatter", "scatter_add", "scatter_reduce", "index_add", "index_copy", "index_select",
                "index_fill") and t(0):
        shape = t(0)[0] or (1,)
        return {2: shape[int(sig.scalar("dim", 0)) % len(shape)]}
    if name in ("nll_loss_forward", "nll_loss2d_forward") and t(0):
        s = t(0)[0]
        return {1: s[1] if len(s) >= 2 else s[0]}
    if name in ("nll_loss_backward", "nll_loss2d_backward") and t(1):
        s = t(1)[0]
        return {2: s[1] if len(s) >= 2 else s[0]}
    return {}


def _list_tensors(sig: Signature, slot: int, entries, device: str, positive: bool, gen: Any) -> list:
    """Tensors of a compact tensor list; integer index lists get per-dimension bounds from `self` (slot 0)."""
    out: list = []
    base = sig.tensor(0)
    self_shape = base[0] if (base is not None and slot != 0) else None
    dim = 0
    for shape, dtype, count in entries:
        for _ in range(count):
            if shape is None:
                out.append(None)
                dim += 1
                continue
            bound = None
            if self_shape is not None and dtype not in ("bool",) and not dtype.startswith(("float", "bfloat")):
                bound = self_shape[dim] if dim < len(self_shape) else 1
            out.append(make_tensor(shape, dtype, None, device, bound=bound, positive=positive, gen=gen))
            dim += 1
    return out


def _in_split_order(tensors: list, scalars: dict) -> list:
    """A signature keeps a tensor list grouped by shape; ops that also take the members' sizes in order get the
    members back in that order: FSDP's `all_gather_copy_in` (`inp_split_sizes`, each member's numel) and
    `split_with_sizes_copy` (`all_gather_input_split_sizes`, each `out` member's size along `dim`)."""
    if "inp_split_sizes" in scalars:
        sizes, size_of = scalars["inp_split_sizes"], (lambda t: t.numel())
    elif "all_gather_input_split_sizes" in scalars:
        dim = int(scalars.get("dim", 0))
        sizes, size_of = scalars["all_gather_input_split_sizes"], (lambda t: t.shape[dim] if t.dim() > dim else -1)
    else:
        return tensors
    if not isinstance(sizes, (list, tuple)) or len(sizes) != len(tensors) or None in tensors:
        return tensors
    by_size: dict[int, list] = {}
    for t in tensors:
        by_size.setdefault(size_of(t), []).append(t)
    try:
        return [by_size[int(n)].pop() for n in sizes]
    except (KeyError, IndexError):
        return tensors


def _convert_scalar(name: str, v: Any, device: str) -> Any:
    import torch

    if isinstance(v, str):
        if name in _DTYPE_ARGS:
            return getattr(torch, v)
        if name == "memory_format" or name == "layout":
            return getattr(torch, v)
        if name == "device":
            return "cpu" if v == "cpu" else device
    if isinstance(v, tuple):
        return list(v)
    return v


def build_inputs(sig: Signature, device: str = "cuda", seed: int = 0) -> tuple[list, dict]:
    """Positional args and kwargs that reproduce `sig` for its op (on `device`)."""
    import torch

    if sig.name in ("flex_attention", "flex_attention_backward"):
        raise PhantoraError(f"live measurement of {sig.name} is not supported (it needs a compiled kernel); "
                            "it is costed from profiles or the roofline model")
    op = resolve_op(sig.op)
    schema = getattr(op, "_schema", None)
    if schema is None:
        raise PhantoraError(f"cannot build inputs for {sig.op}: it has no schema")
    gen = torch.Generator(device=torch.device(device)).manual_seed(seed)
    positive = sig.name in _POSITIVE_OPS
    bounds = _index_bounds(sig)
    lists = dict(sig.lists)
    scalars = {n: v for n, v in sig.scalars if n not in _PSEUDO_SCALARS}
    args: list = []
    kwargs: dict = {}
    pending: list = []                     # defaults skipped so far (filled only if a later positional is given)
    for i, a in enumerate(schema.arguments):
        t = sig.tensor(i)
        if t is not None:
            shape, dtype, stride = t
            v = make_tensor(shape, dtype, stride, device, bound=bounds.get(i), positive=positive, gen=gen)
            given = True
        elif i in lists:
            v = _in_split_order(_list_tensors(sig, i, lists[i], device, positive, gen), scalars)
            given = True
        elif a.name in scalars:
            v = _convert_scalar(a.name, scalars[a.name], device)
            given = True
        elif _is_tensor_list(a):
            v, given = [], not _has_default(a)
        elif a.name == "min" and sig.name in ("clamp", "clamp_") and not (sig.tensor(i + 1) or "max" in scalars):
            v, given = _PLACEHOLDERS["min"], True    # both bounds were numbers, dropped as values: one is kept
        elif a.default_value is not None or _has_default(a):
            v, given = a.default_value, False
        else:
            v, given = _placeholder(a), True
        if given and isinstance(v, (int, float)) and not isinstance(v, bool) and str(a.type).startswith("List"):
            # a scalar list recorded by one value, or dropped as values (`_foreach_*.ScalarList`): one per tensor
            # of the first tensor list
            n = next((len(x) for x in args if isinstance(x, list)), 1)
            v = [v] * n
        if a.kwarg_only:
            if given:
                kwargs[a.name] = v
        elif given:
            args.extend(pending)
            pending = []
            args.append(v)
        else:
            pending.append(v)
    if sig.name in ("_grouped_mm", "_scaled_grouped_mm"):
        _grouped_offsets(schema, args, kwargs)
    if sig.name == "repeat_interleave" and args and kwargs.get("output_size") is not None:
        _repeats_summing_to(args, int(kwargs["output_size"]))
    return args, kwargs


def _repeats_summing_to(args: list, total: int) -> None:
    """`repeat_interleave(repeats, output_size=N)`: repeats that add up to N (an even split), as the kernel requires
    (random counts stop it on a device-side assert)."""
    import torch

    r = args[0]
    if isinstance(r, torch.Tensor) and r.dim() == 1 and r.numel() and not r.dtype.is_floating_point:
        n = r.numel()
        args[0] = torch.tensor([(i + 1) * total // n - i * total // n for i in range(n)], dtype=r.dtype,
                               device=r.device)


def _grouped_offsets(schema: Any, args: list, kwargs: dict) -> None:
    """A grouped GEMM's `offs` (the groups' cumulative ends along its ragged dimension) as an even split: random
    integers there are not offsets, and the CUDA kernel stops on a device-side assert (which ends every later
    measurement of the process). A signature keeps the offsets' shape, not the counts: the ragged dimension's rows
    are split evenly over the groups. The ragged dimension: the rows of a 2-D `self` against a 3-D `mat2`, the
    shared dimension of two 2-D operands (the weight gradient), the columns of a 2-D `mat2` against a 3-D `self`."""
    import torch

    names = [a.name for a in schema.arguments]
    if "offs" not in names:
        return
    i = names.index("offs")
    offs = args[i] if i < len(args) else kwargs.get("offs")
    if not isinstance(offs, torch.Tensor) or offs.dim() != 1 or not len(args) >= 2:
        return
    x, w = args[0], args[1]
    if x.dim() == 2 and w.dim() == 3:
        total = x.shape[0]
    elif x.dim() == 2 and w.dim() == 2:
        total = x.shape[1]
    else:
        total = w.shape[-1]
    groups = offs.numel()
    even = torch.tensor([(g + 1) * total // groups for g in range(groups)], dtype=offs.dtype, device=offs.device)
    if i < len(args):
        args[i] = even
    else:
        kwargs["offs"] = even


def _is_tensor_list(a: Any) -> bool:
    return "Tensor" in str(a.type) and "List" in str(a.type)


def _has_default(a: Any) -> bool:
    try:
        return bool(a.has_default_value())
    except AttributeError:
        return a.default_value is not None


def _placeholder(a: Any) -> Any:
    kind = str(a.type)
    if "Tensor" in kind:
        if "List" in kind:
            return []
        if "Optional" in kind:              # a required Optional[Tensor] the signature recorded as absent
            return None
        # a Tensor argument the signature has no tensor for was a Python number (a wrapped scalar: `x + 1e-6`)
        return float(_PLACEHOLDERS.get(a.name, 0.5))
    if a.name in _PLACEHOLDERS:
        v = _PLACEHOLDERS[a.name]
        return int(v) if kind in ("int", "SymInt") else v
    if "Optional" in kind:
        return None
    if "bool" in kind:
        return False
    if "int" in kind.lower():
        return 0
    if "float" in kind or "number" in kind or "Scalar" in kind:
        return 0.5
    raise PhantoraError(f"no placeholder for required argument '{a.name}' of type {kind}")


_ATTN_BWD_FWD = {
    "_scaled_dot_product_flash_attention_backward": "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention_backward": "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention_backward": "_scaled_dot_product_cudnn_attention",
}


def _attention_backward_inputs(sig: Signature, device: str, seed: int) -> tuple[Any, list, dict]:
    """Run the forward op on the signature's q/k/v, then assemble the backward call from its real outputs."""
    import torch

    gen = torch.Generator(device=torch.device(device)).manual_seed(seed)
    name = sig.name
    q, k, v = (make_tensor(*sig.tensor(i), device, gen=gen) for i in (1, 2, 3))
    causal = bool(sig.scalar("is_causal", False))
    dropout = float(sig.scalar("dropout_p", 0.0) or 0.0)
    fwd = getattr(torch.ops.aten, _ATTN_BWD_FWD[name]).default
    bwd = resolve_op(sig.op)
    if name == "_scaled_dot_product_flash_attention_backward":
        o, lse, csq, csk, mq, mk, seed_t, off_t, _ = fwd(q, k, v, dropout, causal, False)
        dout = torch.randn_like(o) * 0.5
        return bwd, [dout, q, k, v, o, lse, csq, csk, mq, mk, dropout, causal, seed_t, off_t], {}
    if name == "_scaled_dot_product_efficient_attention_backward":
        bias = make_tensor(*sig.tensor(4), device, gen=gen) if sig.tensor(4) else None
        o, lse, seed_t, off_t = fwd(q, k, v, bias, True, dropout, causal)
        dout = torch.randn_like(o) * 0.5
        mask = list(sig.scalar("grad_input_mask", (True, True, True, bias is not None)))
        return bwd, [dout, q, k, v, bias, o, lse, seed_t, off_t, dropout, mask, causal], {}
    bias = make_tensor(*sig.tensor(8), device, gen=gen) if sig.tensor(8) else None
    o, lse, csq, csk, mq, mk, seed_t, off_t, _ = fwd(q, k, v, bias, True, dropout, causal, False)
    dout = torch.randn_like(o) * 0.5
    return bwd, [dout, q, k, v, o, lse, seed_t, off_t, bias, csq, csk, mq, mk, dropout, causal], {}


def _generated_kernel(sig: Signature, device: str, seed: int) -> tuple[Any, list, dict]:
    """A kernel Inductor generated, compiled here from its recipe (generated.py)."""
    import torch

    from .generated import rebuild

    recipe = sig.scalar("graph")
    if not recipe:
        raise PhantoraError(f"{sig.op} {sig.scalar('name')} has no recipe (a graph compiled for dynamic shapes, or "
                            "an op that cannot be rebuilt): it is costed from its bytes")
    kernel, inputs = rebuild(recipe, device, seed)
    torch._dynamo.reset()                      # each recipe is its own graph: no cache limit across recipes
    return torch.compile(kernel, fullgraph=True, dynamic=False), inputs, {}


@contextlib.contextmanager
def _real_mode():
    """Run with Phantora's fake tensor / dispatch modes (if any) switched off."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.utils._python_dispatch import _disable_current_modes

    with unset_fake_temporarily(), _disable_current_modes():
        yield


@contextlib.contextmanager
def _matmul_precision(sig: Signature):
    import torch

    tf32 = sig.scalar("tf32")
    if tf32 is None:
        yield
        return
    old_mm, old_cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = bool(tf32)
    torch.backends.cudnn.allow_tf32 = bool(tf32)
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old_mm, old_cudnn


# ---- timing -------------------------------------------------------------------------------------------------------

_FLUSH: dict[int, Any] = {}
_SPIN_CYCLES_PER_US = 2000         # ~2 GHz SM clock; over-spinning only costs wall time


def _flush_buffer(device_index: int) -> Any:
    import torch

    buf = _FLUSH.get(device_index)
    if buf is None:
        props = torch.cuda.get_device_properties(device_index)
        l2 = int(getattr(props, "L2_cache_size", 0) or 0)
        buf = _FLUSH[device_index] = torch.empty(max(256 << 20, 3 * l2), dtype=torch.int8,
                                                 device=f"cuda:{device_index}")
    return buf


def time_on_gpu(fn: Any, dev: Any, repeats: int = DEFAULT_REPEATS, *, warmup: int = DEFAULT_WARMUP,
                flush_l2: bool = True) -> list[float]:
    """GPU time of `fn()` in microseconds, once per timed run, as the profile times a kernel (module docstring):
    CUDA events around one call, the L2 flushed and the GPU kept busy by a spin while the host enqueues it."""
    import torch

    for _ in range(max(1, warmup)):
        fn()
    torch.cuda.synchronize(dev)
    h0 = time.perf_counter()
    fn()
    torch.cuda.synchronize(dev)
    one = time.perf_counter() - h0
    n = max(3, min(repeats, int(TIME_BUDGET_S / max(one, 1e-6))))
    h0 = time.perf_counter()
    fn()                                           # host dispatch time, GPU not awaited
    host_us = (time.perf_counter() - h0) * 1e6
    torch.cuda.synchronize(dev)
    spin = int(_SPIN_CYCLES_PER_US * (2.0 * host_us + 50.0))
    flush = _flush_buffer(dev.index) if flush_l2 else None
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    for i in range(n):
        if flush is not None:
            flush.zero_()
        torch.cuda._sleep(spin)
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize(dev)
    return [s.elapsed_time(e) * 1000.0 for s, e in zip(starts, ends)]


def measure_signature(sig: Signature, repeats: int = DEFAULT_REPEATS, *, warmup: int = DEFAULT_WARMUP,
                      flush_l2: bool = True, device: str = "cuda", seed: int = 0) -> list[float]:
    """GPU time of one call of the signature's op, in microseconds, once per timed run (see module docstring)."""
    require_cuda()
    import torch

    w = fam.work(sig)
    if w.is_view or w.family in fam.NO_KERNEL:
        raise PhantoraError(f"{sig.op} launches no kernel; there is nothing to measure")
    dev = torch.device(device)
    if dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    with _real_mode(), torch.no_grad(), _matmul_precision(sig), torch.cuda.device(dev):
        try:
            if sig.op.startswith("inductor."):
                op, args, kwargs = _generated_kernel(sig, str(dev), seed)
            elif sig.name in _ATTN_BWD_FWD:
                op, args, kwargs = _attention_backward_inputs(sig, str(dev), seed)
            else:
                op = resolve_op(sig.op)
                args, kwargs = build_inputs(sig, str(dev), seed)

            def fn() -> None:
                op(*args, **kwargs)

            return time_on_gpu(fn, dev, repeats, warmup=warmup, flush_l2=flush_l2)
        except PhantoraError:
            raise
        except Exception as e:  # noqa: BLE001 - an op that fails on this GPU/torch is reported, not fatal
            raise PhantoraError(f"cannot measure {sig.op}: {type(e).__name__}: {e}") from None
