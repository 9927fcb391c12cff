"""Op families and the work of one kernel (FLOPs, DRAM bytes), computed from a `Signature` alone.

Nothing here touches tensors: replay re-costs a trace from its signature table. A Signature holds inputs only, so the
output of every op is inferred per family from its inputs (shapes, dtypes and the kept scalars); docs/cost-model.md
lists the rules. Bytes are the DRAM traffic of an ideal kernel: each input read once, each output written once.
An input broadcast with stride 0 along some dims is counted by the elements it really stores ("touched" elements).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Callable

from .signature import Signature

# ---- families -----------------------------------------------------------------------------------------------------

VIEW = "view"                  # views and metadata: no kernel
ALLOC = "alloc"                # empty/empty_strided/resize_: allocation only, no kernel
COLLECTIVE = "collective"      # costed by the network model, not here
MATMUL = "matmul"
CONV = "conv"
ATTN_FWD = "attention_fwd"
ATTN_BWD = "attention_bwd"
ELEMENTWISE = "elementwise"
REDUCTION = "reduction"
NORM = "norm"
SOFTMAX = "softmax"
EMBEDDING = "embedding"
LOSS = "loss"
OPTIMIZER = "optimizer"        # _foreach_* and _fused_adam(w)_
COPY = "copy"
INDEX = "index"
CAT = "cat"
OTHER = "other"

FAMILIES = (VIEW, ALLOC, COLLECTIVE, MATMUL, CONV, ATTN_FWD, ATTN_BWD, ELEMENTWISE, REDUCTION, NORM, SOFTMAX,
            EMBEDDING, LOSS, OPTIMIZER, COPY, INDEX, CAT, OTHER)
NO_KERNEL = frozenset({VIEW, ALLOC, COLLECTIVE})
TENSOR_CORE_FAMILIES = frozenset({MATMUL, CONV, ATTN_FWD, ATTN_BWD})


@dataclass(frozen=True, slots=True)
class Work:
    """What one kernel (one aten op) must do, independent of the GPU."""

    family: str
    flops: float = 0.0
    nbytes: float = 0.0
    dtype: str = "fp32"        # peak-table key of the arithmetic: bf16 | fp16 | tf32 | fp32 | fp8 | int8 | fp64
    tensor_core: bool = False  # FLOPs run on tensor cores (peak of `dtype`) rather than CUDA cores (fp32 peak)
    is_view: bool = False      # no kernel at all: zero cost
    launches: int = 1          # kernels the op launches (multi-tensor-apply ops launch several)
    xfer: str = ""             # "h2d" / "d2h": a copy across the host link
    op: str = ""               # op packet name ("mm", "_softmax"): efficiency tables may refine a family per op
    variant: str = ""          # sub-case with its own efficiency, e.g. "broadcast" for elementwise ops
    exec_flops: float = -1.0   # FLOPs the kernel really executes when more than `flops` (-1: same)

    @property
    def kernel_flops(self) -> float:
        return self.exec_flops if self.exec_flops >= 0 else self.flops


ITEMSIZE: dict[str, int] = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "complex64": 8, "complex128": 16, "complex32": 4,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "uint16": 2, "uint32": 4, "uint64": 8, "bool": 1,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1, "float8_e8m0fnu": 1,
    "float4_e2m1fn_x2": 1, "qint8": 1, "quint8": 1, "qint32": 4,
}


def itemsize(dtype: str | None) -> int:
    return ITEMSIZE.get(dtype or "float32", 4)


def peak_key(dtype: str | None, tf32: bool = False) -> str:
    """Key of GPUSpec.peak_tflops for arithmetic on `dtype` (a torch dtype name)."""
    if dtype == "bfloat16":
        return "bf16"
    if dtype == "float16":
        return "fp16"
    if dtype is not None and dtype.startswith(("float8", "float4")):
        return "fp8"
    if dtype in ("int8", "uint8"):
        return "int8"
    if dtype in ("float64", "complex128"):
        return "fp64"
    return "tf32" if tf32 else "fp32"


# ---- shape helpers ------------------------------------------------------------------------------------------------

def numel(shape: tuple[int, ...] | None) -> int:
    if shape is None:
        return 0
    n = 1
    for s in shape:
        n *= s
    return n


def touched(shape: tuple[int, ...], stride: tuple[int, ...] | None) -> int:
    """Elements a tensor really stores: dims broadcast with stride 0 do not multiply the memory read."""
    if stride is None or len(stride) != len(shape):
        return numel(shape)
    n = 1
    for s, st in zip(shape, stride):
        if st != 0:
            n *= s
    return n if numel(shape) else 0


def is_contiguous(shape: tuple[int, ...], stride: tuple[int, ...] | None) -> bool:
    if stride is None:
        return True
    expected = 1
    for s, st in zip(reversed(shape), reversed(stride)):
        if s != 1 and st != expected:
            return False
        expected *= s
    return True


def broadcast(shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
    nd = max((len(s) for s in shapes), default=0)
    out = [1] * nd
    for s in shapes:
        for i, d in enumerate(s):
            j = nd - len(s) + i
            if d != 1:
                out[j] = d if out[j] == 1 else max(out[j], d)
    return tuple(out)


def _tensors(sig: Signature) -> list[tuple[int, tuple[int, ...], str, tuple[int, ...] | None]]:
    """(slot, shape, dtype, stride) of every single-tensor argument."""
    out = []
    for i, s in enumerate(sig.shapes):
        if s is not None:
            out.append((i, s, sig.dtypes[i], sig.strides[i] if i < len(sig.strides) else None))
    return out


def _bytes_in(sig: Signature, skip: tuple[int, ...] = (), lists: bool = True) -> float:
    """Bytes of the inputs read once (tensor lists too unless `lists` is False), skipping slots in `skip`."""
    b = 0.0
    for i, s, d, st in _tensors(sig):
        if i not in skip:
            b += touched(s, st) * itemsize(d)
    if lists:
        for slot, entries in sig.lists:
            if slot not in skip:
                b += _list_bytes(entries)
    return b


def _list_bytes(entries) -> float:
    return float(sum(numel(s) * itemsize(d) * n for s, d, n in entries if s is not None))


def _list_numel(entries) -> int:
    return sum(numel(s) * n for s, _, n in entries if s is not None)


def _list_count(entries) -> int:
    return sum(n for s, _, n in entries if s is not None)


def _promote(dtypes: list[str]) -> str:
    """Result dtype of mixed inputs (a simplification of torch's promotion: widest float, else widest int)."""
    floats = [d for d in dtypes if d and (d.startswith(("float", "bfloat", "complex")))]
    pool = floats or [d for d in dtypes if d]
    if not pool:
        return "float32"
    if "bfloat16" in pool and "float16" in pool:
        return "float32"
    return max(pool, key=itemsize)


# ---- classification -----------------------------------------------------------------------------------------------

_VIEW_OPS = frozenset("""
view _unsafe_view _reshape_alias transpose transpose_ t t_ permute expand expand_as slice select as_strided
as_strided_ detach detach_ alias unsqueeze unsqueeze_ squeeze squeeze_ split split_with_sizes unbind chunk
tensor_split narrow view_as unfold diagonal movedim moveaxis swapaxes swapdims unflatten numpy_T mT mH adjoint
_conj conj _neg_view real imag view_as_real view_as_complex lift lift_fresh indices values crow_indices
col_indices ccol_indices row_indices _indices _values sym_size sym_stride sym_numel sym_storage_offset size stride
numel dim is_contiguous is_same_size record_stream set_ _version _fw_primal _make_dual _unpack_dual
_nested_view_from_buffer _functionalize_sync retain_grad requires_grad_ _propagate_xla_data
""".split())
_CONDITIONAL_VIEWS = frozenset({"reshape", "flatten", "contiguous"})     # a view when the input is contiguous
_ALLOC_OPS = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "resize_",
                        "_resize_output_", "empty_permuted", "_empty_affine_quantized"})
_COLLECTIVE_NS = frozenset({"_c10d_functional", "c10d", "c10d_functional", "_dtensor", "_c10d_functional_autograd"})

_MATMUL_OPS = frozenset({"mm", "bmm", "addmm", "addmm_", "baddbmm", "baddbmm_", "addbmm", "addbmm_", "linear",
                         "matmul", "_scaled_mm", "_grouped_mm", "_scaled_grouped_mm", "mv", "addmv", "addmv_",
                         "dot", "vdot", "outer", "ger", "_int_mm", "_addmm_activation"})
_CONV_OPS = frozenset({"convolution", "_convolution", "convolution_backward", "cudnn_convolution",
                       "cudnn_convolution_transpose", "conv1d", "conv2d", "conv3d"})
_ATTN_FWD = frozenset({"_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                       "_scaled_dot_product_cudnn_attention", "flex_attention"})
_ATTN_BWD = frozenset({"_scaled_dot_product_flash_attention_backward",
                       "_scaled_dot_product_efficient_attention_backward",
                       "_scaled_dot_product_cudnn_attention_backward", "flex_attention_backward"})
_NORM_OPS = frozenset({"native_layer_norm", "native_layer_norm_backward", "_fused_rms_norm",
                       "_fused_rms_norm_backward", "rms_norm", "layer_norm", "native_batch_norm",
                       "native_batch_norm_backward", "_native_batch_norm_legit",
                       "_native_batch_norm_legit_functional", "_native_batch_norm_legit_no_training",
                       "native_group_norm", "native_group_norm_backward", "cudnn_batch_norm",
                       "cudnn_batch_norm_backward", "group_norm", "batch_norm"})
_SOFTMAX_OPS = frozenset({"_softmax", "_log_softmax", "_softmax_backward_data", "_log_softmax_backward_data",
                          "softmax", "log_softmax", "_safe_softmax"})
_EMBEDDING_OPS = frozenset({"embedding", "embedding_dense_backward", "embedding_backward", "_embedding_bag",
                            "embedding_bag"})
_LOSS_OPS = frozenset({"nll_loss_forward", "nll_loss_backward", "nll_loss2d_forward", "nll_loss2d_backward",
                       "nll_loss", "nll_loss_nd", "cross_entropy_loss"})
_OPTIM_OPS = frozenset({"_fused_adamw_", "_fused_adam_", "_fused_adamw", "_fused_adam", "_fused_sgd_",
                        "_fused_sgd", "_fused_adagrad_"})
_COPY_OPS = frozenset({"_to_copy", "copy_", "clone", "_copy_from", "_copy_from_and_resize", "lift_fresh_copy",
                       "_local_scalar_dense", "to", "_reshape_copy", "copy", "_unsafe_view_copy", "detach_copy",
                       "view_copy", "permute_copy", "transpose_copy", "t_copy", "expand_copy", "slice_copy",
                       "select_copy", "as_strided_copy", "unsqueeze_copy", "squeeze_copy", "alias_copy"})
_INDEX_OPS = frozenset({"index", "_unsafe_index", "index_put", "index_put_", "_index_put_impl_", "_unsafe_index_put",
                        "gather", "scatter", "scatter_", "scatter_add", "scatter_add_", "scatter_reduce",
                        "scatter_reduce_", "index_select", "index_add", "index_add_", "index_copy",
                        "index_copy_", "index_fill", "index_fill_", "take", "masked_select", "masked_scatter",
                        "masked_scatter_"})
_CAT_OPS = frozenset({"cat", "stack", "hstack", "vstack", "_cat", "concat", "concatenate"})
_REDUCTION_OPS = frozenset({"sum", "mean", "amax", "amin", "max", "min", "argmax", "argmin", "prod", "norm",
                            "linalg_vector_norm", "std", "var", "var_mean", "std_mean", "any", "all", "logsumexp",
                            "count_nonzero", "aminmax", "nansum", "nanmean", "_foreach_norm", "mse_loss",
                            "l1_loss", "smooth_l1_loss", "huber_loss", "binary_cross_entropy",
                            "binary_cross_entropy_with_logits", "cumsum", "cumprod", "logcumsumexp", "cummax",
                            "cummin", "_cummax_helper", "_cummin_helper"})
_SCANS = frozenset({"cumsum", "cumprod", "logcumsumexp", "cummax", "cummin", "_cummax_helper", "_cummin_helper"})
# Elementwise ops (packet names, with or without a trailing "_" for the in-place form).
_ELEMENTWISE_BASE = frozenset("""
abs neg negative exp exp2 expm1 log log1p log2 log10 sqrt rsqrt reciprocal sin cos tan asin acos atan sinh cosh
tanh asinh acosh atanh sigmoid logit relu relu6 gelu silu mish hardswish hardsigmoid hardtanh elu selu celu
leaky_relu softplus softshrink hardshrink threshold erf erfc erfinv sign sgn signbit floor ceil round trunc frac
clamp clamp_min clamp_max clip pow float_power add sub subtract rsub mul multiply div divide true_divide
floor_divide remainder fmod maximum minimum fmax fmin eq ne lt le gt ge greater less equal not_equal greater_equal
less_equal logical_and logical_or logical_not logical_xor bitwise_and bitwise_or bitwise_not bitwise_xor
bitwise_left_shift bitwise_right_shift __and__ __or__ __xor__ __lshift__ __rshift__ where lerp addcmul addcdiv
masked_fill fill zero zeros_like ones_like full_like rand_like randn_like randint_like isnan isinf isfinite
isposinf isneginf nan_to_num square hypot atan2 xlogy copysign heaviside polar angle sigmoid_backward
tanh_backward silu_backward gelu_backward threshold_backward hardswish_backward hardsigmoid_backward
leaky_relu_backward elu_backward softplus_backward mish_backward hardtanh_backward logit_backward
native_dropout native_dropout_backward dropout bernoulli uniform normal random exponential geometric cauchy
log_normal triu tril _masked_scale masked_scale zeros ones full scalar_tensor arange linspace logspace rand randn
randint new_zeros new_ones new_full lift_fresh_copy_ _assert_async _functional_assert_async
_scaled_dot_product_attention_math_dropout fused_dropout _fused_dropout deg2rad rad2deg i0 lgamma digamma polygamma
mvlgamma sinc logaddexp logaddexp2 nextafter ldexp positive conj_physical _conj_physical
""".split())
_WRITE_ONLY = frozenset({"fill", "fill_", "zero", "zero_", "zeros_like", "ones_like", "full_like", "rand_like",
                         "randn_like", "randint_like", "bernoulli_", "uniform_", "normal_", "random_",
                         "exponential_", "geometric_", "cauchy_", "log_normal_", "zeros", "ones", "full",
                         "scalar_tensor", "arange", "linspace", "logspace", "rand", "randn", "randint",
                         "new_zeros", "new_ones", "new_full", "normal"})
_BOOL_OUT = frozenset("""eq ne lt le gt ge greater less equal not_equal greater_equal less_equal logical_and
logical_or logical_not logical_xor isnan isinf isfinite isposinf isneginf signbit""".split())


def _packet(op: str) -> tuple[str, str, str]:
    parts = op.split(".")
    if len(parts) >= 3:
        return parts[0], parts[1], ".".join(parts[2:])
    if len(parts) == 2:
        return parts[0], parts[1], ""
    return "", op, ""


@lru_cache(maxsize=None)
def classify(op: str) -> str:
    """The family of an op name ('aten.mm.default' -> 'matmul'). Conditional views classify as 'view' here;
    `work()` turns them into copies when the input is not contiguous."""
    ns, name, _ = _packet(op)
    if ns in _COLLECTIVE_NS:
        return COLLECTIVE
    if name in _VIEW_OPS or name in _CONDITIONAL_VIEWS:
        return VIEW
    if name in _ALLOC_OPS:
        return ALLOC
    if name in _MATMUL_OPS:
        return MATMUL
    if name in _CONV_OPS:
        return CONV
    if name in _ATTN_FWD:
        return ATTN_FWD
    if name in _ATTN_BWD:
        return ATTN_BWD
    if name in _NORM_OPS:
        return NORM
    if name in _SOFTMAX_OPS:
        return SOFTMAX
    if name in _EMBEDDING_OPS:
        return EMBEDDING
    if name in _LOSS_OPS:
        return LOSS
    if name in _OPTIM_OPS or name.startswith("_foreach_"):
        return OPTIMIZER
    if name in _COPY_OPS:
        return COPY
    if name in _INDEX_OPS:
        return INDEX
    if name in _CAT_OPS:
        return CAT
    if name in _REDUCTION_OPS:
        return REDUCTION
    if name in _ELEMENTWISE_BASE or name.rstrip("_") in _ELEMENTWISE_BASE:
        return ELEMENTWISE
    if name.endswith("_backward") and name[: -len("_backward")] in _ELEMENTWISE_BASE:
        return ELEMENTWISE
    return _view_by_schema(ns, name)


def _view_by_schema(ns: str, name: str) -> str:
    """Ops not in the tables: a view if torch (already imported) says its schema returns an alias."""
    import sys

    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            packet = getattr(getattr(torch.ops, ns), name)
            if any(getattr(packet, o).is_view for o in packet.overloads()):
                return VIEW
        except Exception:  # noqa: BLE001 - unknown namespace/op: not a view as far as we know
            pass
    return OTHER


# ---- work per family ----------------------------------------------------------------------------------------------

def work(sig: Signature) -> Work:
    """FLOPs, bytes, arithmetic dtype and launch count of one kernel with this signature."""
    family = classify(sig.op)
    fn = _COUNTERS.get(family, _other)
    try:
        w = fn(sig, family)
    except (IndexError, TypeError, ValueError, ZeroDivisionError):
        # A signature the family's rule cannot read (unexpected arity): cost it with the generic rule.
        w = _other(sig, OTHER)
    return replace(w, op=_packet(sig.op)[1])


def _first_tensor(sig: Signature):
    ts = _tensors(sig)
    return ts[0] if ts else None


def _view(sig: Signature, family: str) -> Work:
    _, name, _ = _packet(sig.op)
    if name in _CONDITIONAL_VIEWS:
        t = _first_tensor(sig)
        if t is not None and not is_contiguous(t[1], t[3]):
            n = numel(t[1]) * itemsize(t[2])
            return Work(COPY, 0.0, 2.0 * n)
    return Work(VIEW, is_view=True)


def _no_kernel(sig: Signature, family: str) -> Work:
    return Work(family, is_view=True)


def _tc_dtype(sig: Signature, dtype: str | None) -> str:
    return peak_key(dtype, bool(sig.scalar("tf32", False)))


def _matmul(sig: Signature, family: str) -> Work:
    _, name, _ = _packet(sig.op)
    t = sig.tensor
    out_dtype = sig.scalar("out_dtype")
    if name in ("mm", "_int_mm"):
        (m, k), a_dt, _ = t(0)
        (_, n), _, _ = t(1)
        flops, extra, batch = 2.0 * m * n * k, 0, 1
        a, b = t(0), t(1)
    elif name == "bmm":
        (bt, m, k), a_dt, _ = t(0)
        n = t(1)[0][2]
        flops, extra, batch = 2.0 * bt * m * n * k, 0, bt
        a, b = t(0), t(1)
    elif name in ("addmm", "addmm_", "_addmm_activation"):
        (m, k), a_dt, _ = t(1)
        n = t(2)[0][1]
        c = t(0)
        flops, batch = 2.0 * m * n * k + m * n, 1
        a, b = t(1), t(2)
        extra = touched(c[0], c[2]) * itemsize(c[1]) * (2 if name == "addmm_" else 1)
    elif name in ("baddbmm", "baddbmm_", "addbmm", "addbmm_"):
        (bt, m, k), a_dt, _ = t(1)
        n = t(2)[0][2]
        c = t(0)
        flops = 2.0 * bt * m * n * k + (bt if name.startswith("baddbmm") else 1) * m * n
        a, b = t(1), t(2)
        extra = touched(c[0], c[2]) * itemsize(c[1])
        batch = bt if name.startswith("baddbmm") else 1
    elif name == "linear":
        x, w = t(0), t(1)
        k = x[0][-1]
        m = numel(x[0]) // max(k, 1)
        n = w[0][0]
        a_dt, a, b, batch = x[1], x, w, 1
        bias = t(2)
        flops = 2.0 * m * n * k + (m * n if bias else 0)
        extra = touched(bias[0], bias[2]) * itemsize(bias[1]) if bias else 0
    elif name == "matmul":
        x, w = t(0), t(1)
        k = x[0][-1]
        bshape = broadcast([x[0][:-2], w[0][:-2]]) if len(x[0]) > 2 and len(w[0]) > 2 else \
            (x[0][:-2] if len(x[0]) > 2 else w[0][:-2])
        batch = numel(bshape)
        m = x[0][-2] if len(x[0]) >= 2 else 1
        n = w[0][-1] if len(w[0]) >= 2 else 1
        a_dt, a, b, extra = x[1], x, w, 0
        flops = 2.0 * batch * m * n * k
    elif name == "_scaled_mm":
        (m, k), a_dt, _ = t(0)
        n = t(1)[0][1]
        a, b, batch = t(0), t(1), 1
        flops = 2.0 * m * n * k
        extra = _bytes_in(sig, skip=(0, 1))
        out_dtype = out_dtype or "bfloat16"
    elif name in ("_grouped_mm", "_scaled_grouped_mm"):
        a, b = t(0), t(1)
        sa, sb = a[0], b[0]
        a_dt = a[1]
        if len(sa) == 2 and len(sb) == 3:          # tokens (T, K) routed through G experts (G, K, N)
            m, k, n, batch = sa[0], sa[1], sb[2], 1
            out_shape = (sa[0], sb[2])
        elif len(sa) == 3 and len(sb) == 3:
            batch, m, k, n = sa[0], sa[1], sa[2], sb[2]
            out_shape = (sa[0], sa[1], sb[2])
        elif len(sa) == 2 and len(sb) == 2:        # groups split K: one (M, N) output per group
            m, k, n = sa[0], sa[1], sb[1]
            groups = t(2)[0][0] if t(2) else 1
            batch, out_shape = 1, (groups, m, n)
        else:                                      # (G, M, K) x (K, N): groups split N
            batch, m, k, n = sa[0], sa[1], sa[2], sb[1] // max(sa[0], 1)
            out_shape = (sa[0], sa[1], n)
        flops = 2.0 * batch * m * n * k
        extra = _bytes_in(sig, skip=(0, 1))
        odt = out_dtype or ("bfloat16" if itemsize(a_dt) == 1 else a_dt)
        nbytes = touched(sa, a[2]) * itemsize(a_dt) + touched(sb, b[2]) * itemsize(b[1]) + extra + \
            numel(out_shape) * itemsize(odt)
        return Work(MATMUL, flops, nbytes, _tc_dtype(sig, a_dt), True)
    elif name in ("mv", "addmv", "addmv_", "dot", "vdot", "outer", "ger"):
        return _vector_matmul(sig, name)
    else:
        return _other(sig, OTHER)
    odt = out_dtype or a_dt
    nbytes = touched(a[0], a[2]) * itemsize(a[1]) + touched(b[0], b[2]) * itemsize(b[1]) + extra + \
        batch * m * n * itemsize(odt)
    return Work(MATMUL, flops, float(nbytes), _tc_dtype(sig, a_dt), True)


def _vector_matmul(sig: Signature, name: str) -> Work:
    """Matrix-vector products are memory bound: 2 FLOPs per matrix element, on CUDA cores."""
    ts = _tensors(sig)
    if name in ("outer", "ger"):
        n1, n2 = numel(ts[0][1]), numel(ts[1][1])
        return Work(MATMUL, float(n1 * n2), _bytes_in(sig) + n1 * n2 * itemsize(ts[0][2]), "fp32", False)
    big = max(ts, key=lambda x: numel(x[1]))
    flops = 2.0 * numel(big[1])
    out = big[1][0] if name != "dot" and name != "vdot" else 1
    return Work(MATMUL, flops, _bytes_in(sig) + out * itemsize(big[2]), "fp32", False)


def _conv_out(spatial, kernel, stride, padding, dilation, transposed, output_padding):
    out = []
    for i, x in enumerate(spatial):
        s = stride[i] if i < len(stride) else stride[-1]
        p = padding[i] if i < len(padding) else padding[-1]
        d = dilation[i] if i < len(dilation) else dilation[-1]
        k = kernel[i]
        if transposed:
            op = output_padding[i] if output_padding and i < len(output_padding) else 0
            out.append((x - 1) * s - 2 * p + d * (k - 1) + op + 1)
        else:
            out.append((x + 2 * p - d * (k - 1) - 1) // s + 1)
    return out


def _conv_flops(x_shape, w_shape, out_spatial, transposed, groups) -> float:
    n = x_shape[0]
    ksize = numel(tuple(w_shape[2:]))
    if transposed:              # weight (Cin, Cout/g, k...): every input pixel scatters into Cout/g x k outputs
        return 2.0 * n * x_shape[1] * numel(tuple(x_shape[2:])) * w_shape[1] * ksize
    return 2.0 * n * w_shape[0] * numel(tuple(out_spatial)) * w_shape[1] * ksize


def _conv(sig: Signature, family: str) -> Work:
    _, name, _ = _packet(sig.op)
    t = sig.tensor
    g = sig.scalar
    stride, padding, dilation = g("stride", (1,)), g("padding", (0,)), g("dilation", (1,))
    transposed, output_padding, groups = bool(g("transposed", False)), g("output_padding", ()), g("groups", 1) or 1
    if name == "convolution_backward":
        dy, x, w = t(0), t(1), t(2)
        out_spatial = dy[0][2:]
        f = _conv_flops(x[0], w[0], out_spatial, transposed, groups)
        mask = g("output_mask", (True, True, True))
        flops = f * (int(bool(mask[0])) + int(bool(mask[1]))) + (numel(dy[0]) if len(mask) > 2 and mask[2] else 0)
        nbytes = _bytes_in(sig) + (numel(x[0]) * itemsize(x[1]) if mask[0] else 0) + \
            (numel(w[0]) * itemsize(w[1]) if mask[1] else 0)
        return Work(CONV, flops, nbytes, _tc_dtype(sig, x[1]), True)
    x, w = t(0), t(1)
    if x is None or w is None:
        return _other(sig, OTHER)
    if len(x[0]) == len(w[0]) - 1:                 # unbatched input
        x = ((1,) + tuple(x[0]), x[1], None)
    out_spatial = _conv_out(x[0][2:], w[0][2:], stride, padding, dilation, transposed, output_padding)
    cout = w[0][1] * groups if transposed else w[0][0]
    out_numel = x[0][0] * cout * numel(tuple(out_spatial))
    flops = _conv_flops(x[0], w[0], out_spatial, transposed, groups)
    return Work(CONV, flops, _bytes_in(sig) + out_numel * itemsize(x[1]), _tc_dtype(sig, x[1]), True)


# Attention: schema positions of (query, key, value) and of the extra tensors read, per op.
_ATTN_LAYOUT = {
    "_scaled_dot_product_flash_attention": (0, 1, 2),
    "_scaled_dot_product_efficient_attention": (0, 1, 2),
    "_scaled_dot_product_cudnn_attention": (0, 1, 2),
    "flex_attention": (0, 1, 2),
    "_scaled_dot_product_flash_attention_backward": (1, 2, 3),
    "_scaled_dot_product_efficient_attention_backward": (1, 2, 3),
    "_scaled_dot_product_cudnn_attention_backward": (1, 2, 3),
    "flex_attention_backward": (0, 1, 2),
}
BACKWARD_FLOP_RATIO = 2.5          # FlashAttention-2's count: backward = 2.5 x forward (5 matmuls vs 2)
CAUSAL_FRACTION = 0.5              # FlashAttention's convention for a causal mask
# A masked kernel computes whole tiles along the diagonal and its last wave is unbalanced: it executes about
# (fraction + MASK_OVERHEAD_KEYS / Sk) of the dense work. Fitted to PyTorch's flash attention (causal vs dense,
# S = 1k..8k, D = 64/128) on an H200: measured ratios 0.93, 0.79, 0.64, 0.56 vs 1.0, 0.75, 0.63, 0.56 modelled.
MASK_OVERHEAD_KEYS = 512


def attention_fraction(sig: Signature) -> float:
    """Fraction of the score matrix computed: 0.5 when causal, the block mask's density for flex, else 1."""
    if sig.scalar("is_causal", False):
        return CAUSAL_FRACTION
    d = sig.scalar("density")
    return float(d) if d is not None else 1.0


def _attention(sig: Signature, family: str) -> Work:
    _, name, _ = _packet(sig.op)
    qi, ki, vi = _ATTN_LAYOUT[name]
    q, k, v = sig.tensor(qi), sig.tensor(ki), sig.tensor(vi)
    *qb, sq, d = q[0]
    sk = k[0][-2]
    dv = v[0][-1]
    bh = numel(tuple(qb))                      # batch x query heads (GQA: key/value heads may be fewer)
    frac = attention_fraction(sig)
    dense = 2.0 * bh * sq * sk * (d + dv)
    fwd = dense * frac
    exec_frac = min(1.0, frac + MASK_OVERHEAD_KEYS / sk) if frac < 1.0 else 1.0
    bias_i = {"_scaled_dot_product_efficient_attention": 3, "_scaled_dot_product_cudnn_attention": 3,
              "_scaled_dot_product_efficient_attention_backward": 4,
              "_scaled_dot_product_cudnn_attention_backward": 8}.get(name)
    bias = sig.tensor(bias_i) if bias_i is not None else None
    extra = bh * sq * sk if bias is not None else 0.0
    exec_fwd = dense * exec_frac + extra
    fwd += extra * frac
    isz = itemsize(q[1])
    out_bytes = bh * sq * dv * isz
    lse_bytes = bh * sq * 4
    if family == ATTN_FWD:
        nbytes = _bytes_in(sig) + out_bytes + lse_bytes
        return Work(ATTN_FWD, fwd, nbytes, peak_key(q[1]), True, exec_flops=exec_fwd)
    # backward reads dO, q, k, v, o, lse (+ bias); writes dq, dk, dv
    grads = (numel(q[0]) + numel(k[0])) * isz + numel(v[0]) * itemsize(v[1])
    nbytes = _bytes_in(sig) + grads
    return Work(ATTN_BWD, BACKWARD_FLOP_RATIO * fwd, nbytes, peak_key(q[1]), True,
                exec_flops=BACKWARD_FLOP_RATIO * exec_fwd)


def _is_out_overload(overload: str) -> bool:
    return overload == "out" or overload.endswith("_out") or overload in ("grad_input", "output", "values")


def _elementwise(sig: Signature, family: str) -> Work:
    _, name, overload = _packet(sig.op)
    ts = _tensors(sig)
    inplace = name.endswith("_") and not name.startswith("_")
    out_slot = None
    if _is_out_overload(overload) and ts:
        out_slot = ts[-1][0]
    elif inplace and ts:
        out_slot = ts[0][0]
    ins = [x for x in ts if x[0] != out_slot or inplace]
    if name in _WRITE_ONLY or (name.rstrip("_") in _WRITE_ONLY):
        ins = []
    if out_slot is not None:
        o = next(x for x in ts if x[0] == out_slot)
        out_shape, out_dt = o[1], o[2]
    else:
        out_shape = _factory_shape(sig, name, ts)
        dt = sig.scalar("dtype")
        if dt is None:
            if name in _BOOL_OUT:
                dt = "bool"
            elif ts:
                dt = _promote([x[2] for x in ts if x[1] is not None and (name != "where" or x[0] != 0)])
            else:
                dt = "float32"
        out_dt = dt
    out_n = numel(out_shape)
    n_read = sum(touched(s, st) * itemsize(d) for _, s, d, st in ins)
    n_inputs = max(1, len(ins))
    nbytes = n_read + out_n * itemsize(out_dt)
    if name in ("native_dropout",):                # writes the mask too
        nbytes += out_n
    flops = float(out_n * max(1, n_inputs - 1))
    # an input broadcast along some dims (not a 1-element scalar) takes TensorIterator's slower strided path
    bcast = any(1 < touched(s, st) < out_n for _, s, _, st in ins)
    return Work(ELEMENTWISE, flops, float(nbytes), "fp32", False, variant="broadcast" if bcast else "")


def _factory_shape(sig: Signature, name: str, ts) -> tuple[int, ...]:
    size = sig.scalar("size")
    if size is not None:
        return tuple(size)
    if name.startswith("arange"):
        start, end, step = sig.scalar("start", 0), sig.scalar("end"), sig.scalar("step", 1)
        if end is None:
            end, start = start, 0
        return (max(0, math.ceil((float(end) - float(start)) / float(step or 1))),)
    if name.startswith(("linspace", "logspace")):
        return (int(sig.scalar("steps", 0)),)
    shapes = [x[1] for x in ts]
    return broadcast(shapes) if shapes else ()


def _reduced_numel(shape: tuple[int, ...], dims) -> int:
    if dims is None or dims == () or dims == []:
        return 1
    if isinstance(dims, int):
        dims = (dims,)
    nd = len(shape)
    red = 1
    for d in dims:
        red *= shape[d % nd] if nd else 1
    return numel(shape) // max(red, 1)


def _reduction(sig: Signature, family: str) -> Work:
    _, name, _ = _packet(sig.op)
    if name == "_foreach_norm":
        entries = sig.tensor_list(0)
        return Work(REDUCTION, float(2 * _list_numel(entries)), _list_bytes(entries) + 4 * _list_count(entries),
                    launches=_mta_launches(entries, 1))
    x = _first_tensor(sig)
    if x is None:
        return _other(sig, OTHER)
    _, shape, dt, st = x
    n = numel(shape)
    if name in _SCANS:
        out_n = n
    elif name in ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "binary_cross_entropy",
                  "binary_cross_entropy_with_logits"):
        out_n = n if sig.scalar("reduction", 1) == 0 else 1
    else:
        dims = sig.scalar("dim")
        out_n = _reduced_numel(shape, dims)
    out_dt = sig.scalar("dtype") or ("int64" if name.startswith("arg") else "bool" if name in ("any", "all") else dt)
    out_bytes = out_n * itemsize(out_dt)
    if name in ("max", "min", "cummax", "cummin") and sig.scalar("dim") is not None:
        out_bytes += out_n * 8                     # values and indices
    flops = float(n * (2 if name in ("norm", "linalg_vector_norm", "std", "var", "var_mean", "std_mean") else 1))
    return Work(REDUCTION, flops, _bytes_in(sig) + out_bytes)


# Norm ops: (input slot, flops per element, extra output per row in fp32 words, grad-of-input written)
_NORM_RULES = {
    "native_layer_norm": (0, 8, 2), "layer_norm": (0, 8, 0),
    "_fused_rms_norm": (0, 4, 1), "rms_norm": (0, 4, 0),
    "native_layer_norm_backward": (1, 12, 0), "_fused_rms_norm_backward": (1, 8, 0),
}


def _norm(sig: Signature, family: str) -> Work:
    _, name, _ = _packet(sig.op)
    slot, fpe, per_row = _NORM_RULES.get(name, (0, 8, 2))
    x = sig.tensor(slot)
    if x is None:
        return _other(sig, OTHER)
    shape, dt, _ = x
    n = numel(shape)
    norm_shape = sig.scalar("normalized_shape")
    rows = n // max(numel(tuple(norm_shape)), 1) if norm_shape else (shape[0] if shape else 1)
    out = n * itemsize(dt) + rows * per_row * 4
    if name.endswith("_backward"):
        mask = sig.scalar("output_mask", (True, True, True))
        out = (n * itemsize(dt) if mask[0] else 0)
        # weight/bias gradients: one row each (partial sums are reduced in a second small pass)
        w_n = numel(tuple(norm_shape)) if norm_shape else 0
        out += w_n * 4 * sum(1 for m in mask[1:] if m)
    return Work(NORM, float(fpe * n), _bytes_in(sig) + out)


def _softmax(sig: Signature, family: str) -> Work:
    _, name, _ = _packet(sig.op)
    x = _first_tensor(sig)
    shape, dt = x[1], x[2]
    n = numel(shape)
    if name.endswith("_backward_data"):
        out_dt = sig.scalar("input_dtype") or dt
        return Work(SOFTMAX, float(3 * n), _bytes_in(sig) + n * itemsize(out_dt))
    out_dt = "float32" if sig.scalar("half_to_float", False) else (sig.scalar("dtype") or dt)
    return Work(SOFTMAX, float(5 * n), _bytes_in(sig) + n * itemsize(out_dt))


def _embedding(sig: Signature, family: str) -> Work:
    _, name, _ = _packet(sig.op)
    if name == "embedding_dense_backward" or name == "embedding_backward":
        g, idx = sig.tensor(0), sig.tensor(1)
        d = g[0][-1]
        n_idx = numel(idx[0])
        nw = int(sig.scalar("num_weights", 0))
        out = nw * d * itemsize(g[1])
        # read grad rows and indices (sorted in a pre-pass: 2 more passes over them), zero-fill and
        # read-modify-write the weight gradient
        nbytes = n_idx * d * itemsize(g[1]) + 3 * n_idx * itemsize(idx[1]) + out + 2 * n_idx * d * itemsize(g[1])
        return Work(EMBEDDING, float(n_idx * d), float(nbytes))
    w, idx = sig.tensor(0), sig.tensor(1)
    if w is None or idx is None:
        return _other(sig, OTHER)
    d = w[0][-1]
    out_n = numel(idx[0]) * d
    return Work(EMBEDDING, 0.0, float(numel(idx[0]) * itemsize(idx[1]) + 2 * out_n * itemsize(w[1])))


def _loss(sig: Signature, family: str) -> Work:
    _, name, _ = _packet(sig.op)
    if name.endswith("_backward"):
        x, target = sig.tensor(1), sig.tensor(2)
        n = numel(x[0])
        # zero-fill grad_input, then scatter one value per row
        nbytes = n * itemsize(x[1]) + numel(target[0]) * (itemsize(target[1]) + itemsize(x[1]))
        return Work(LOSS, float(numel(target[0])), float(nbytes))
    x, target = sig.tensor(0), sig.tensor(1)
    if x is None or target is None:
        return _other(sig, OTHER)
    rows = numel(target[0])
    nbytes = rows * (itemsize(target[1]) + itemsize(x[1])) + (rows if sig.scalar("reduction", 1) == 0 else 1) * \
        itemsize(x[1]) + 4
    return Work(LOSS, float(rows), float(nbytes))


# PyTorch's multi_tensor_apply (ATen/native/cuda/MultiTensorApply.cuh): chunks of 65536 elements, at most 320
# blocks and depth_to_max_tensors[depth-1] tensors per launch.
_MTA_CHUNK = 65536
_MTA_BLOCKS = 320
_MTA_MAX_TENSORS = (110, 64, 48, 36, 30)


def _mta_launches(entries, depth: int) -> int:
    count = _list_count(entries)
    if count == 0:
        return 1
    chunks = sum(-(-numel(s) // _MTA_CHUNK) * n for s, _, n in entries if s is not None)
    max_t = _MTA_MAX_TENSORS[min(max(depth, 1), 5) - 1]
    return max(1, -(-chunks // _MTA_BLOCKS), -(-count // max_t))


_ADAM_FLOPS_PER_ELEMENT = 18       # weight decay 2, two moment updates 7, bias corrections, sqrt, divide, update


def _optimizer(sig: Signature, family: str) -> Work:
    _, name, _ = _packet(sig.op)
    lists = dict(sig.lists)
    if name.startswith(("_fused_adam", "_fused_adamw")):
        amsgrad = bool(sig.scalar("amsgrad", False))
        states = [0, 2, 3] + ([4] if amsgrad else [])
        read = sum(_list_bytes(lists.get(s, ())) for s in states + [1]) + _list_bytes(lists.get(5, ()))
        write = sum(_list_bytes(lists.get(s, ())) for s in states)
        params = lists.get(0, ())
        return Work(OPTIMIZER, float(_ADAM_FLOPS_PER_ELEMENT * _list_numel(params)), read + write,
                    launches=_mta_launches(params, 5 if amsgrad else 4))
    if name.startswith("_fused_"):
        params = lists.get(0, ())
        read = sum(_list_bytes(e) for e in lists.values())
        return Work(OPTIMIZER, float(4 * _list_numel(params)), read + 2 * _list_bytes(params),
                    launches=_mta_launches(params, len(lists)))
    # _foreach_*: first list is self; in-place forms write it back, out-of-place ones write a new list like it
    first = lists.get(min(lists)) if lists else ()
    n_lists = len(lists)
    base = name.rstrip("_")
    inplace = name.endswith("_")
    write_only = base in ("_foreach_zero",)
    read = 0.0 if write_only else sum(_list_bytes(e) for s, e in lists.items()
                                      if not (base == "_foreach_copy" and s == min(lists)))
    read += _bytes_in(sig, lists=False)            # single tensors (e.g. a tensor alpha)
    if base in ("_foreach_norm", "_foreach_max"):
        write = 4.0 * _list_count(first)
    else:
        write = _list_bytes(first)
    flops = float(_list_numel(first) * max(1, n_lists - (1 if inplace else 0)))
    return Work(OPTIMIZER, flops, read + write, launches=_mta_launches(first, n_lists + (0 if inplace else 1)))


def _copy(sig: Signature, family: str) -> Work:
    _, name, _ = _packet(sig.op)
    xfer = sig.scalar("xfer") or ""
    if name == "_local_scalar_dense":
        x = _first_tensor(sig)
        return Work(COPY, 0.0, float(itemsize(x[2]) if x else 8), xfer="d2h")
    if name == "copy_":
        dst, src = sig.tensor(0), sig.tensor(1)
        if dst is None:
            return _other(sig, OTHER)
        read = touched(src[0], src[2]) * itemsize(src[1]) if src else 0
        return Work(COPY, 0.0, float(read + numel(dst[0]) * itemsize(dst[1])), xfer=xfer)
    x = _first_tensor(sig)
    if x is None:
        return _other(sig, OTHER)
    out_dt = sig.scalar("dtype") or x[2]
    return Work(COPY, 0.0, float(touched(x[1], x[3]) * itemsize(x[2]) + numel(x[1]) * itemsize(out_dt)), xfer=xfer)


def _index(sig: Signature, family: str) -> Work:
    _, name, _ = _packet(sig.op)
    t = sig.tensor
    base = name.rstrip("_")
    if base in ("index", "_unsafe_index"):
        self_ = t(0)
        out_n = _advanced_index_numel(self_[0], sig.tensor_list(1))
        idx_bytes = _list_bytes(sig.tensor_list(1))
        return Work(INDEX, 0.0, float(idx_bytes + 2 * out_n * itemsize(self_[1])))
    if base in ("index_put", "_index_put_impl", "_unsafe_index_put"):
        self_, values = t(0), t(2)
        n = numel(values[0]) if values else 0
        idx_entries = sig.tensor_list(1)
        idx_n = max((numel(s) for s, _, _ in idx_entries if s is not None), default=0)
        # the values broadcast over the indexed positions: the written elements are the larger of the two
        written = max(n, idx_n * (numel(self_[0]) // max(self_[0][0], 1) if self_[0] else 1)) if idx_n else n
        accumulate = bool(sig.scalar("accumulate", False))
        nbytes = _list_bytes(idx_entries) + n * itemsize(values[1]) + written * itemsize(self_[1]) * \
            (2 if accumulate else 1)
        if not name.endswith("_"):                 # functional form copies self first
            nbytes += 2 * numel(self_[0]) * itemsize(self_[1])
        return Work(INDEX, float(written if accumulate else 0), float(nbytes))
    if base == "gather":
        self_, idx = t(0), t(2)
        out_n = numel(idx[0])
        return Work(INDEX, 0.0, float(out_n * itemsize(idx[1]) + 2 * out_n * itemsize(self_[1])))
    if base == "index_select":
        self_, idx = t(0), t(2)
        dim = int(sig.scalar("dim", 0))
        shape = list(self_[0]) or [1]
        shape[dim % len(shape)] = numel(idx[0])
        out_n = numel(tuple(shape))
        return Work(INDEX, 0.0, float(numel(idx[0]) * itemsize(idx[1]) + 2 * out_n * itemsize(self_[1])))
    if base in ("scatter", "scatter_add", "scatter_reduce", "index_add", "index_copy"):
        self_, idx, src = t(0), t(2), t(3)
        m = numel(src[0]) if src else numel(idx[0])
        nbytes = numel(idx[0]) * itemsize(idx[1]) + m * itemsize(self_[1]) * (3 if src else 2)
        if not name.endswith("_"):
            nbytes += 2 * numel(self_[0]) * itemsize(self_[1])
        return Work(INDEX, float(m if base in ("scatter_add", "scatter_reduce", "index_add") else 0), float(nbytes))
    return _other(sig, OTHER)


def _advanced_index_numel(shape: tuple[int, ...], entries) -> int:
    """Output elements of x[indices]: broadcast index shape times the dims not indexed.

    Index entries are taken in the recorded order (None = a full slice of that dim); a bool mask is assumed all
    true (an upper bound: its true count is data)."""
    idx_shapes = []
    kept = 1
    dim = 0
    for s, d, n in entries:
        for _ in range(n):
            if s is None:
                kept *= shape[dim] if dim < len(shape) else 1
                dim += 1
            elif d in ("bool", "uint8"):
                idx_shapes.append((numel(s),))
                dim += len(s)
            else:
                idx_shapes.append(s)
                dim += 1
    for rest in shape[dim:]:
        kept *= rest
    return numel(broadcast(idx_shapes)) * kept if idx_shapes else numel(shape)


def _cat(sig: Signature, family: str) -> Work:
    entries = sig.tensor_list(0)
    b = _list_bytes(entries)
    return Work(CAT, 0.0, 2.0 * b)


def _other(sig: Signature, family: str) -> Work:
    """Generic fallback: every input read once, one output like the largest input written once, 1 FLOP/element."""
    ts = _tensors(sig)
    biggest = max(ts, key=lambda x: numel(x[1]), default=None)
    list_biggest = max((numel(s) * itemsize(d) for _, e in sig.lists for s, d, _ in e if s is not None), default=0)
    out_bytes = max(numel(biggest[1]) * itemsize(biggest[2]) if biggest else 0, list_biggest)
    out_n = max(numel(biggest[1]) if biggest else 0,
                max((numel(s) for _, e in sig.lists for s, _, _ in e if s is not None), default=0))
    return Work(OTHER, float(out_n), _bytes_in(sig) + out_bytes)


_COUNTERS: dict[str, Callable[[Signature, str], Work]] = {
    VIEW: _view, ALLOC: _no_kernel, COLLECTIVE: _no_kernel, MATMUL: _matmul, CONV: _conv, ATTN_FWD: _attention,
    ATTN_BWD: _attention, ELEMENTWISE: _elementwise, REDUCTION: _reduction, NORM: _norm, SOFTMAX: _softmax,
    EMBEDDING: _embedding, LOSS: _loss, OPTIMIZER: _optimizer, COPY: _copy, INDEX: _index, CAT: _cat,
    OTHER: _other,
}
