"""Row normalisations: layer / RMS / batch / group norm (forward and backward), SyncBatchNorm's statistics kernels,
and softmax / log-softmax."""

from __future__ import annotations

from ..signature import Signature
from .common import (NORM, OTHER, SOFTMAX, Work, _bytes_in, _first_tensor, _other, _packet, itemsize, numel,
                     touched)


# Norm ops: (input slot, flops per element, extra output per row in fp32 words, grad-of-input written)
_NORM_RULES = {
    "native_layer_norm": (0, 8, 2), "layer_norm": (0, 8, 0),
    "_fused_rms_norm": (0, 4, 1), "rms_norm": (0, 4, 0),
    "native_layer_norm_backward": (1, 12, 0), "_fused_rms_norm_backward": (1, 8, 0),
}


def _norm(sig: Signature, family: str) -> Work:
    _, name, _ = _packet(sig.op)
    if name in _SYNC_BN:
        return _sync_bn(sig, name)
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


# SyncBatchNorm's CUDA kernels (aten/src/ATen/native/cuda/Normalization.cu{,h}), costed as memory-bound kernels:
# FLOPs per element of the input (or per gathered statistic) and the bytes each must read and write. The statistics
# are the input's accumulate type (fp32 for half inputs); the channel dimension is dim 1.
_SYNC_BN = frozenset({"batch_norm_stats", "batch_norm_update_stats", "batch_norm_gather_stats",
                      "batch_norm_gather_stats_with_counts", "batch_norm_elemt", "batch_norm_backward_reduce",
                      "batch_norm_backward_elemt"})


def _acc(dtype: str) -> str:
    return "float32" if dtype in ("float16", "bfloat16") else dtype


def _stored(sig: Signature, slot: int) -> float:
    """Bytes argument `slot` holds (0 where it is no tensor, an absent optional)."""
    x = sig.tensor(slot)
    return float(touched(x[0], x[2]) * itemsize(x[1])) if x is not None else 0.0


def _threads(n: int) -> int:
    """CUDA's `getNumThreads` (Normalization.cuh): threads along a row of `n` elements."""
    for t in (32, 64, 128, 256):
        if n <= t:
            return t
    return 512


def _per_channel_blocks(x: tuple) -> dict:
    """The launch of an NCHW per-channel reduction (Normalization.cuh: `batch_norm_collect_statistics_kernel`,
    `batch_norm_backward_reduce_kernel`): one block per channel of `getNumThreads(HW)` x 512 / that threads, each
    thread stepping through its share of the batch and of the spatial elements. Inputs that CUDA's channels-last
    kernels take (`batch_norm_use_channels_last_kernels`: channels-last, or a channel stride of 1, as a 2-D input
    has) spread the work over many blocks instead: no bound."""
    shape, _, strides = x
    if len(shape) < 3:
        return {}
    contiguous = []
    acc = 1
    for d in reversed(shape):
        contiguous.append(acc)
        acc *= d
    if strides is not None and tuple(strides) != tuple(reversed(contiguous)):
        return {}
    n, c = shape[0], shape[1]
    hw = numel(shape[2:])
    tx = _threads(hw)
    ty = max(1, 512 // tx)
    return {"blocks": c, "block_steps": float(-(-n // ty) * -(-hw // tx)), "block_threads": tx * ty}


def _sync_bn(sig: Signature, name: str) -> Work:
    if name in ("batch_norm_gather_stats", "batch_norm_gather_stats_with_counts"):
        # (input, mean [W, C], invstd [W, C], running_mean?, running_var?, momentum, eps, counts [W] | count): the
        # input only picks the dtypes (not read); the W gathered statistics read, C global ones written (fp32 for
        # half statistics), the running statistics read and written in place
        mshape, mdt, _ = sig.tensor(1)
        w, c = mshape[0], mshape[1]
        nbytes = _stored(sig, 1) + _stored(sig, 2) + 2 * (_stored(sig, 3) + _stored(sig, 4)) \
            + 2 * c * itemsize(_acc(mdt))
        launches = 1
        if name == "batch_norm_gather_stats_with_counts":
            nbytes += _stored(sig, 7)
        else:          # the per-rank counts are made on the GPU first: an int64 tensor cast to the statistics' dtype
            rm = sig.tensor(3)
            nbytes += w * (8 + itemsize(rm[1] if rm is not None else sig.tensor(0)[1]))
            launches = 2
        return Work(NORM, float(10 * w * c), nbytes, launches=launches)
    x = sig.tensor(1 if name in ("batch_norm_backward_reduce", "batch_norm_backward_elemt") else 0)
    shape, dt, _ = x
    n, c = numel(shape), shape[1]
    if name in ("batch_norm_stats", "batch_norm_update_stats"):
        # one Welford pass over the input; mean and invstd (or var) of the accumulate type written per channel;
        # update_stats: a second kernel reads and writes the running statistics
        nbytes = _stored(sig, 0) + 2 * c * itemsize(_acc(dt))
        launches = 1
        if name == "batch_norm_update_stats" and sig.tensor(1) is not None:
            nbytes += 2 * (_stored(sig, 1) + _stored(sig, 2))
            launches = 2
        return Work(NORM, float(5 * n), nbytes, launches=launches, **_per_channel_blocks(x))
    if name == "batch_norm_elemt":
        # (x - mean) * invstd * weight + bias: every input read once, y like x written
        return Work(NORM, float(4 * n), _bytes_in(sig) + n * itemsize(dt))
    if name == "batch_norm_backward_reduce":
        # (grad_out, input, mean, invstd, weight?, input_g, weight_g, bias_g): dy and x read, per channel
        # sum(dy) and sum(dy * (x - mean)) (like mean) and the weight / bias gradients (like weight) written
        mdt = sig.tensor(2)[1]
        w = sig.tensor(4)
        wdt = w[1] if w is not None else mdt
        out = 0
        if sig.scalar("input_g", True):
            out += 2 * c * itemsize(mdt)
        out += c * itemsize(wdt) * sum(1 for k in ("weight_g", "bias_g") if sig.scalar(k, True))
        return Work(NORM, float(4 * n), _bytes_in(sig) + out, **_per_channel_blocks(x))
    # batch_norm_backward_elemt(grad_out, input, mean, invstd, weight?, sum_dy, sum_dy_xmu, count): dy and x read
    # with the per-channel terms and the per-rank counts, dx like x written
    return Work(NORM, float(5 * n), _bytes_in(sig) + n * itemsize(dt))


def _softmax(sig: Signature, family: str) -> Work:
    _, name, _ = _packet(sig.op)
    x = _first_tensor(sig)
    shape, dt = x[1], x[2]
    n = numel(shape)
    if name.endswith("_backward_data"):
        out_dt = sig.scalar("input_dtype") or dt
        return Work(SOFTMAX, float(3 * n), _bytes_in(sig) + n * itemsize(out_dt))
    out_dt = "float32" if sig.scalar("half_to_float", False) else (sig.scalar("dtype") or dt)
    # rows of at most 2048 elements and 8 KiB run as one warp-per-row pass (PyTorch's softmax_warp_forward, rows held
    # in registers); longer rows go through the block kernel's several passes, which the family's efficiency reflects
    row = shape[int(sig.scalar("dim", -1)) % len(shape)] if shape else 1
    warp = row <= 2048 and row * itemsize(dt) <= 8192
    return Work(SOFTMAX, float(5 * n), _bytes_in(sig) + n * itemsize(out_dt), op=name, variant="warp" if warp else "")
