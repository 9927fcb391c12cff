"""Fused attention kernels (SDPA flash / efficient / cuDNN, flex attention), forward and backward: FLOPs of the
score and value products under a causal or block mask, and the bytes of q, k, v, output and statistics.
"""

from __future__ import annotations

from ..signature import Signature
from .common import ATTN_BWD, ATTN_FWD, Work, _bytes_in, _packet, itemsize, numel, peak_key


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
