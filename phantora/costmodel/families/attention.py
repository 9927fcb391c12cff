"""Fused attention kernels (SDPA flash / efficient / cuDNN, flex attention), forward and backward: FLOPs of the
score and value products under a causal or block mask, and the bytes of q, k, v, output and statistics.

An SDPA kernel's executed work is the plain kernel's (no mask or causal, no dropout, head dimension 128: what the
efficiency tables were fitted on) times the measured cost of its variant relative to it
(presets/profiles/attention/sdpa-variants.toml): a mask tensor, dropout and the head dimension change the time of
the same FLOPs by 0.9 to 6 times (docs/cost-model.md, "Attention").
"""

from __future__ import annotations

import math
from functools import lru_cache

from ...errors import PhantoraError
from ...paths import presets_dir
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
_SDPA_OPS = frozenset(k for k in _ATTN_LAYOUT if k.startswith("_scaled_dot_product"))
# schema position of the additive mask (attn_bias) per SDPA op; flash takes none
_BIAS_INDEX = {"_scaled_dot_product_efficient_attention": 3, "_scaled_dot_product_cudnn_attention": 3,
               "_scaled_dot_product_efficient_attention_backward": 4,
               "_scaled_dot_product_cudnn_attention_backward": 8}


def variants_path():
    return presets_dir() / "profiles" / "attention" / "sdpa-variants.toml"


@lru_cache(maxsize=1)
def variant_table() -> dict:
    """The measured variant table: {'head_dims': [...], 'forward': {kind: [ratio per head dim]}, 'backward': ...}."""
    from ...tomlconf import read_toml
    path = variants_path()
    if not path.exists():
        raise PhantoraError(f"the SDPA variant table {path} is missing (a Phantora tree needs its presets/)")
    t = read_toml(path)
    try:
        dims = [int(d) for d in t["head_dims"]]
        table = {"head_dims": dims}
        for direction in ("forward", "backward"):
            rows = {k: [float(x) for x in v] for k, v in t[direction].items()}
            for k, v in rows.items():
                if len(v) != len(dims) or not all(x > 0 for x in v):
                    raise ValueError(f"[{direction}] {k}: {len(dims)} positive ratios expected")
            table[direction] = rows
    except (KeyError, TypeError, ValueError) as e:
        raise PhantoraError(f"{path}: malformed SDPA variant table ({e})") from None
    if sorted(dims) != dims or len(dims) < 2:
        raise PhantoraError(f"{path}: head_dims must rise, at least two of them")
    return table


def mask_kind(sig: Signature, name: str) -> str:
    """'bias' (a mask over queries and keys), 'bias_keys' (one broadcast over the queries, a padding mask),
    'causal' or 'none'."""
    i = _BIAS_INDEX.get(name)
    bias = sig.tensor(i) if i is not None else None
    if bias is not None and bias[0] is not None and len(bias[0]) >= 2 and min(bias[0]) > 0:
        shape, stride = bias[0], bias[2]
        over_queries = shape[-2] > 1 and not (stride is not None and len(stride) == len(shape) and stride[-2] == 0)
        return "bias" if over_queries else "bias_keys"
    return "causal" if sig.scalar("is_causal", False) else "none"


def variant_ratio(direction: str, kind: str, dropout: bool, head_dim: int) -> float:
    """Measured time of the variant over the plain head-dim-128 kernel's at equal FLOPs, interpolated in log2 of
    the head dimension between the measured ones (the nearest outside them)."""
    t = variant_table()
    row = t[direction].get(kind + ("_dropout" if dropout else ""))
    if row is None:
        return 1.0
    dims = t["head_dims"]
    x = math.log2(max(dims[0], min(dims[-1], head_dim)))
    for j in range(len(dims) - 1):
        lo, hi = math.log2(dims[j]), math.log2(dims[j + 1])
        if x <= hi:
            w = (x - lo) / (hi - lo)
            return math.exp((1 - w) * math.log(row[j]) + w * math.log(row[j + 1]))
    return row[-1]


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
    exec_fwd = dense * exec_frac
    ratio = 1.0
    if name in _SDPA_OPS:
        kind = mask_kind(sig, name)
        if kind.startswith("bias"):                # a mask tensor: every tile is computed, and the mask added
            exec_fwd = dense
            fwd += bh * sq * sk * frac
        ratio = variant_ratio("forward" if family == ATTN_FWD else "backward", kind,
                              float(sig.scalar("dropout_p", 0.0) or 0.0) > 0.0, d)
    isz = itemsize(q[1])
    out_bytes = bh * sq * dv * isz
    lse_bytes = bh * sq * 4
    if family == ATTN_FWD:
        nbytes = _bytes_in(sig) + out_bytes + lse_bytes
        return Work(ATTN_FWD, fwd, nbytes, peak_key(q[1]), True, exec_flops=exec_fwd * ratio)
    # backward reads dO, q, k, v, o, lse (+ bias); writes dq, dk, dv
    grads = (numel(q[0]) + numel(k[0])) * isz + numel(v[0]) * itemsize(v[1])
    nbytes = _bytes_in(sig) + grads
    return Work(ATTN_BWD, BACKWARD_FLOP_RATIO * fwd, nbytes, peak_key(q[1]), True,
                exec_flops=BACKWARD_FLOP_RATIO * exec_fwd * ratio)
