"""Which family an op name belongs to: the op tables and `classify` ('aten.mm.default' -> 'matmul')."""

from __future__ import annotations

from functools import lru_cache

from .common import (ALLOC, ATTN_BWD, ATTN_FWD, CAT, COLLECTIVE, CONV, COPY, ELEMENTWISE, EMBEDDING, INDEX,
                     LOSS, MATMUL, NORM, OPTIMIZER, OTHER, REDUCTION, SOFTMAX, VIEW, _packet)


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
                       "cudnn_batch_norm_backward", "group_norm", "batch_norm",
                       # SyncBatchNorm's kernels (norm.py, _SYNC_BN)
                       "batch_norm_stats", "batch_norm_gather_stats", "batch_norm_gather_stats_with_counts",
                       "batch_norm_elemt", "batch_norm_backward_reduce", "batch_norm_backward_elemt",
                       "batch_norm_update_stats"})
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


@lru_cache(maxsize=None)
def classify(op: str) -> str:
    """The family of an op name ('aten.mm.default' -> 'matmul'). Conditional views classify as 'view' here;
    `work()` turns them into copies when the input is not contiguous."""
    ns, name, _ = _packet(op)
    if ns == "inductor":              # a kernel Inductor generated (torch.compile): families/fused.py
        return REDUCTION if name == "reduction" else ELEMENTWISE
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
