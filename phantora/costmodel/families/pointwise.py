"""Elementwise ops (output shape and dtype inferred from the inputs, broadcasting, factories) and reductions
(scans, losses that reduce, `_foreach_norm`): memory-bound passes over their tensors.
"""

from __future__ import annotations

import math

from ..signature import Signature
from .common import (ELEMENTWISE, OTHER, REDUCTION, Work, _bytes_in, _first_tensor, _list_bytes, _list_count,
                     _list_numel, _other, _packet, _promote, _tensors, broadcast, itemsize, numel, touched)
from .optimizer import _mta_launches


# reductions that keep every element (scans)
_SCANS = frozenset({"cumsum", "cumprod", "logcumsumexp", "cummax", "cummin", "_cummax_helper", "_cummin_helper"})
# elementwise ops that read none of their inputs (fills, factories, random draws), and those with a bool result
_WRITE_ONLY = frozenset({"fill", "fill_", "zero", "zero_", "zeros_like", "ones_like", "full_like", "rand_like",
                         "randn_like", "randint_like", "bernoulli_", "uniform_", "normal_", "random_",
                         "exponential_", "geometric_", "cauchy_", "log_normal_", "zeros", "ones", "full",
                         "scalar_tensor", "arange", "linspace", "logspace", "rand", "randn", "randint",
                         "new_zeros", "new_ones", "new_full", "normal"})
_BOOL_OUT = frozenset("""eq ne lt le gt ge greater less equal not_equal greater_equal less_equal logical_and
logical_or logical_not logical_xor isnan isinf isfinite isposinf isneginf signbit""".split())


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
