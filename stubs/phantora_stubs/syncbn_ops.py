"""The CUDA-only statistics kernels of `torch.nn.SyncBatchNorm`, made runnable on fake tensors.

SyncBatchNorm's autograd function (torch/nn/modules/_functions.py) calls ATen ops that only a CUDA build has kernels
for: `batch_norm_stats` (per-channel mean and inverse std of the local batch), `batch_norm_gather_stats_with_counts`
(the global statistics from every rank's, all-gathered; it also updates the running statistics), `batch_norm_elemt`
(the normalisation), and backward `batch_norm_backward_reduce` (per-channel sums of dy and dy·(x - mean), the weight
and bias gradients) and `batch_norm_backward_elemt` (the input gradient from the all-reduced sums). A CPU-only torch
has no meta kernel for them either, so the fake mode could not run them (UnsupportedOpError). `install()` registers
Meta kernels that give each op the outputs CUDA's kernels return (aten/src/ATen/native/cuda/Normalization.cu and
Normalization.cuh): their shapes, dtypes and layouts, and the checks those kernels make on their arguments. The
statistics are of the input's accumulate type (float32 for half and bfloat16 inputs), the channel dimension is dim 1.
`batch_norm_gather_stats` (a count for every rank instead of a tensor) and `batch_norm_update_stats` get the same
treatment. Only ops without a Meta kernel of their own are registered (a later torch may bring its own).

The kernels are costed by the cost model (`phantora.costmodel.families.norm`: the bytes each moves over HBM, family
`norm`), as every other kernel the interceptor emits.

`batch_norm_gather_stats(_with_counts)` and `batch_norm_update_stats` write the running statistics in place, which
their schemas do not declare: `forget_running_stats` drops the known values (values.py) the running statistics had,
so that a later read does not see the stale initial zeros and ones as data.
"""

from __future__ import annotations

import torch

_HALF = (torch.float16, torch.bfloat16)
_FLOATING = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_INT32_MAX = 2 ** 31 - 1

UPDATES_RUNNING_STATS: dict[str, tuple[tuple[int, str], ...]] = {
    "batch_norm_gather_stats": ((3, "running_mean"), (4, "running_var")),
    "batch_norm_gather_stats_with_counts": ((3, "running_mean"), (4, "running_var")),
    "batch_norm_update_stats": ((1, "running_mean"), (2, "running_var")),
}
"""Ops that update their running-statistics arguments in place (argument position and name), undeclared."""


def _acc(dtype: torch.dtype) -> torch.dtype:
    """at::toAccumulateType(dtype, is_cuda=true) for the dtypes these kernels dispatch on."""
    return torch.float32 if dtype in _HALF else dtype


def _dispatch_check(kernel: str, t: torch.Tensor) -> None:
    """AT_DISPATCH_FLOATING_TYPES_AND2(Half, BFloat16, ...): other dtypes are refused as CUDA refuses them."""
    if t.dtype not in _FLOATING:
        raise RuntimeError(f'"{kernel}" not implemented for \'{_type_name(t.dtype)}\'')


def _type_name(dtype: torch.dtype) -> str:
    names = {torch.float16: "Half", torch.bfloat16: "BFloat16", torch.float32: "Float", torch.float64: "Double",
             torch.int64: "Long", torch.int32: "Int", torch.int16: "Short", torch.int8: "Char", torch.uint8: "Byte",
             torch.bool: "Bool"}
    return names.get(dtype, str(dtype).replace("torch.", ""))


def _channels(t: torch.Tensor) -> int:
    return t.size(1)


def _channels_last_kernels(t: torch.Tensor) -> bool:
    """batch_norm_use_channels_last_kernels: NHWC, or contiguous with the channels innermost ([N, C])."""
    return t.is_contiguous(memory_format=torch.channels_last) or (t.is_contiguous() and t.stride(1) == 1)


def _suggested(t: torch.Tensor) -> torch.memory_format:
    from torch._prims_common import suggest_memory_format
    return suggest_memory_format(t)


def _stats_pair(like: torch.Tensor, c: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    return like.new_empty((c,), dtype=dtype), like.new_empty((c,), dtype=dtype)


# ---- the Meta kernels ---------------------------------------------------------------------------------------------

def batch_norm_stats(input, eps):
    """Per-channel mean and inverse standard deviation of the local batch: two [C] tensors of the accumulate type."""
    _dispatch_check("batch_norm_stats_cuda", input)
    return _stats_pair(input, _channels(input), _acc(input.dtype))


def _gathered(kernel: str, input, mean, invstd, running_mean, running_var) -> tuple[torch.Tensor, torch.Tensor]:
    scalar = running_mean if running_mean is not None else input
    _dispatch_check(kernel, scalar)
    if mean.dim() != 2 or invstd.dim() != 2:
        raise RuntimeError(f"{kernel}: mean and invstd must be [world, C] (got {list(mean.shape)}, "
                           f"{list(invstd.shape)})")
    out = torch.float32 if mean.dtype in _HALF else mean.dtype
    return _stats_pair(mean, mean.size(1), out)


def batch_norm_gather_stats_with_counts(input, mean, invstd, running_mean, running_var, momentum, eps, counts):
    """The global mean and inverse std from every rank's ([world, C] each) and their element counts ([world]):
    two [C] tensors, float32 where the gathered statistics are half or bfloat16, else of their dtype."""
    return _gathered("batch_norm_update_stats_cuda", input, mean, invstd, running_mean, running_var)


def batch_norm_gather_stats(input, mean, invstd, running_mean, running_var, momentum, eps, count):
    """As batch_norm_gather_stats_with_counts, every rank with the same count."""
    return _gathered("batch_norm_update_stats_cuda", input, mean, invstd, running_mean, running_var)


def batch_norm_elemt(input, weight, bias, mean, invstd, eps):
    """(x - mean) * invstd * weight + bias: like the input, in its suggested memory format (NHWC stays NHWC)."""
    _dispatch_check("batch_norm_elementwise_cuda", input)
    return torch.empty_like(input, memory_format=_suggested(input))


def batch_norm_backward_reduce(grad_out, input, mean, invstd, weight, input_g, weight_g, bias_g):
    """sum(dy), sum(dy * (x - mean)) per channel (like mean) and the weight and bias gradients (like weight).

    The channels-last kernel always returns all four (the gradients [0] of mean's dtype without a weight); the
    general one only those asked for (None for the others, an undefined tensor in C++)."""
    c = _channels(input)
    if (input.numel() <= _INT32_MAX and _channels_last_kernels(grad_out) and _channels_last_kernels(input)
            and (weight is None or weight.is_contiguous()) and mean.is_contiguous() and invstd.is_contiguous()):
        sum_dy, sum_dy_xmu = _stats_pair(mean, c, mean.dtype)
        if weight is not None:
            return sum_dy, sum_dy_xmu, weight.new_empty((c,)), weight.new_empty((c,))
        return sum_dy, sum_dy_xmu, mean.new_empty((0,)), mean.new_empty((0,))
    _dispatch_check("batch_norm_backward_reduce", grad_out)
    if mean.dtype != invstd.dtype:
        raise RuntimeError("mean and invstd need to have the same data types")
    wdtype = weight.dtype if weight is not None else mean.dtype
    sum_dy = torch.empty_like(mean, memory_format=torch.contiguous_format) if input_g else None
    sum_dy_xmu = torch.empty_like(mean, memory_format=torch.contiguous_format) if input_g else None
    grad_weight = mean.new_empty((c,), dtype=wdtype) if weight_g else None
    grad_bias = mean.new_empty((c,), dtype=wdtype) if bias_g else None
    return sum_dy, sum_dy_xmu, grad_weight, grad_bias


def batch_norm_backward_elemt(grad_out, input, mean, invstd, weight, sum_dy, sum_dy_xmu, count):
    """The input gradient: like the input (NHWC where the channels-last kernel runs, else contiguous). The kernel
    reads the per-rank counts as int32 (SyncBatchNorm passes them so)."""
    if count.dtype != torch.int32:
        raise RuntimeError(f"expected scalar type Int but found {_type_name(count.dtype)}")
    if grad_out.numel() <= _INT32_MAX and _channels_last_kernels(grad_out):
        return torch.empty_like(input, memory_format=_suggested(input))
    _dispatch_check("batch_norm_backward_elemt", grad_out)
    if mean.dtype != invstd.dtype:
        raise RuntimeError("mean and invstd need to have the same data types")
    return input.new_empty(tuple(input.shape))


def batch_norm_update_stats(input, running_mean, running_var, momentum):
    """The batch's per-channel mean and (biased) variance, of the accumulate type; the running statistics updated."""
    _dispatch_check("batch_norm_stats_cuda", input)
    return _stats_pair(input, _channels(input), _acc(input.dtype))


KERNELS = {
    "batch_norm_stats": batch_norm_stats,
    "batch_norm_gather_stats": batch_norm_gather_stats,
    "batch_norm_gather_stats_with_counts": batch_norm_gather_stats_with_counts,
    "batch_norm_elemt": batch_norm_elemt,
    "batch_norm_backward_reduce": batch_norm_backward_reduce,
    "batch_norm_backward_elemt": batch_norm_backward_elemt,
    "batch_norm_update_stats": batch_norm_update_stats,
}
"""Op (its default overload) -> Meta kernel."""

_LIB = None


def install() -> list[str]:
    """Register the Meta kernels of KERNELS' ops that have none, once per process. Returns the ops registered."""
    global _LIB
    if _LIB is not None:
        return []
    _LIB = torch.library.Library("aten", "IMPL")
    registered = []
    for name, kernel in KERNELS.items():
        if not hasattr(torch.ops.aten, name):
            continue
        if torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{name}", "Meta"):
            continue
        _LIB.impl(name, kernel, "Meta")
        registered.append(name)
    return registered


def forget_running_stats(name: str, args: tuple, kwargs: dict) -> None:
    """After an op of UPDATES_RUNNING_STATS: its running statistics no longer hold their known values."""
    from .values import VALUES

    for pos, arg in UPDATES_RUNNING_STATS[name]:
        t = args[pos] if pos < len(args) else kwargs.get(arg)
        if isinstance(t, torch.Tensor):
            VALUES.drop(t)
