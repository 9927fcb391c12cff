"""Ops that move or alias data without arithmetic: views (a copy when a conditional view is not contiguous),
allocation-only and collective ops (no kernel here), copies (host link transfers included) and concatenation.
"""

from __future__ import annotations

from ..signature import Signature
from .classification import _CONDITIONAL_VIEWS
from .common import (CAT, COPY, OTHER, VIEW, Work, _first_tensor, _list_bytes, _other, _packet, is_contiguous,
                     itemsize, numel, touched)


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
        if xfer:
            return _transfer(sig, xfer, numel(dst[0]), src[1] if src else dst[1], dst[1])
        read = touched(src[0], src[2]) * itemsize(src[1]) if src else 0
        return Work(COPY, 0.0, float(read + numel(dst[0]) * itemsize(dst[1])), xfer=xfer)
    x = _first_tensor(sig)
    if x is None:
        return _other(sig, OTHER)
    out_dt = sig.scalar("dtype") or x[2]
    if xfer:
        return _transfer(sig, xfer, numel(x[1]), x[2], out_dt)
    return Work(COPY, 0.0, float(touched(x[1], x[3]) * itemsize(x[2]) + numel(x[1]) * itemsize(out_dt)), xfer=xfer)


def _transfer(sig: Signature, xfer: str, elements: int, src_dtype: str, dst_dtype: str) -> Work:
    """A copy across the host link moves each element once, in the dtype of the side that converts it last: a
    non-blocking copy converts on the GPU (the host side's dtype crosses), a blocking one on the host (the GPU
    side's). Scalar `pageable` (the host side is not pinned memory) makes it a staged copy ('h2d-pageable')."""
    host_dt, gpu_dt = (src_dtype, dst_dtype) if xfer == "h2d" else (dst_dtype, src_dtype)
    size = itemsize(host_dt if sig.scalar("non_blocking") else gpu_dt)
    kind = f"{xfer}-pageable" if sig.scalar("pageable") else xfer
    return Work(COPY, 0.0, float(elements * size), xfer=kind)


def _cat(sig: Signature, family: str) -> Work:
    entries = sig.tensor_list(0)
    b = _list_bytes(entries)
    return Work(CAT, 0.0, 2.0 * b)
