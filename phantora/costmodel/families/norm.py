"""Row normalisations: layer / RMS / batch / group norm (forward and backward) and softmax / log-softmax."""

from __future__ import annotations

from ..signature import Signature
from .common import NORM, OTHER, SOFTMAX, Work, _bytes_in, _first_tensor, _other, _packet, itemsize, numel


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
    # rows of at most 2048 elements and 8 KiB run as one warp-per-row pass (PyTorch's softmax_warp_forward, rows held
    # in registers); longer rows go through the block kernel's several passes, which the family's efficiency reflects
    row = shape[int(sig.scalar("dim", -1)) % len(shape)] if shape else 1
    warp = row <= 2048 and row * itemsize(dt) <= 8192
    return Work(SOFTMAX, float(5 * n), _bytes_in(sig) + n * itemsize(out_dt), op=name, variant="warp" if warp else "")
