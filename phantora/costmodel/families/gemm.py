"""GEMM-shaped ops on tensor cores: matrix products (and the memory-bound matrix-vector ones on CUDA cores) and
convolutions counted as implicit GEMMs.
"""

from __future__ import annotations

from ..signature import Signature
from .common import (CONV, MATMUL, OTHER, Work, _bytes_in, _other, _packet, _tensors, broadcast, itemsize, numel,
                     peak_key, touched)


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
        extra = touched(c[0], c[2]) * itemsize(c[1]) * (2 if name == "addmm_" else 1) * _reads_c(sig)
    elif name in ("baddbmm", "baddbmm_", "addbmm", "addbmm_"):
        (bt, m, k), a_dt, _ = t(1)
        n = t(2)[0][2]
        c = t(0)
        flops = 2.0 * bt * m * n * k + (bt if name.startswith("baddbmm") else 1) * m * n * _reads_c(sig)
        a, b = t(1), t(2)
        extra = touched(c[0], c[2]) * itemsize(c[1]) * _reads_c(sig)
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


NARROW_CHANNELS = 8
"""A convolution with fewer channels per group than this on either side (an RGB stem, a latent of 4 channels) cannot
fill the tensor cores' tiles and has its own efficiencies (roofline.py)."""


def conv_variant(x, w, groups: int, transposed: bool) -> str:
    """'depthwise' (one input channel per group), 'narrow' (fewer than NARROW_CHANNELS channels per group on a
    side) or '' (an ordinary convolution), each followed by '.channels_last' when the input is stored so."""
    cin_g = (w[0][0] // max(1, groups) if transposed else w[0][1]) if len(w[0]) > 1 else 1
    cout_g = (w[0][1] if transposed else w[0][0] // max(1, groups)) if len(w[0]) > 1 else 1
    if groups > 1 and cin_g == 1:
        kind = "depthwise"
    elif min(cin_g, cout_g) < NARROW_CHANNELS:
        kind = "narrow"
    else:
        kind = ""
    shape, stride = x[0], x[2]
    cl = (stride is not None and len(shape) >= 3 and len(stride) == len(shape) and shape[1] > 1
          and stride[1] == 1 and stride[-1] == shape[1])
    if not cl:
        return kind
    return f"{kind}.channels_last" if kind else "channels_last"


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
        return Work(CONV, flops, nbytes, _tc_dtype(sig, x[1]), True,
                    variant=conv_variant(x, w, groups, transposed))
    x, w = t(0), t(1)
    if x is None or w is None:
        return _other(sig, OTHER)
    if len(x[0]) == len(w[0]) - 1:                 # unbatched input
        x = ((1,) + tuple(x[0]), x[1], None)
    out_spatial = _conv_out(x[0][2:], w[0][2:], stride, padding, dilation, transposed, output_padding)
    cout = w[0][1] * groups if transposed else w[0][0]
    out_numel = x[0][0] * cout * numel(tuple(out_spatial))
    flops = _conv_flops(x[0], w[0], out_spatial, transposed, groups)
    return Work(CONV, flops, _bytes_in(sig) + out_numel * itemsize(x[1]), _tc_dtype(sig, x[1]), True,
                variant=conv_variant(x, w, groups, transposed))


def _reads_c(sig: Signature) -> int:
    """1 when an addmm / baddbmm reads its C input, 0 when beta is 0 (recorded in the signature as ("beta", 0.0))."""
    return 0 if sig.scalar("beta", 1.0) == 0 else 1
