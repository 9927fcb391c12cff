"""Matmul interpolation: cost a GEMM absent from the profile from the nearest measured GEMMs of the same dtype.

Each GEMM is reduced to (M', N, K) with M' = batch x M and its work W = 2 M' N K. Neighbours are the profiled
GEMMs of the same arithmetic dtype (bf16, fp16, tf32, fp32, fp8) whose shape is closest in log space,
distance = || log(M', N, K) - log(M'_i, N_i, K_i) ||, within `MAX_LOG_DISTANCE` (a factor of 16 in one dimension,
or about 5 in each of three). What is interpolated is each neighbour's measured time relative to the roofline
model, q_i = log(t_i / roofline(n_i)): the roofline carries the scaling with FLOPs (and its size-dependent
efficiency), the neighbours correct it locally. Of the (up to) `NEIGHBOURS` nearest:

- with neighbours on both sides of W, q is interpolated linearly in log W between the nearest neighbour below and
  the nearest above (log-log interpolation over work of the measured/modelled ratio);
- with neighbours on one side only, the nearest neighbour's q is used.

The estimate is roofline(target) x exp(q). Outside the radius there is no estimate (None) and the cost model goes
on to its next source. Interpolating log t itself between neighbours 10-100x apart in work was tried first and
missed by up to 2x, because log t is convex in log W where small GEMMs saturate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import families as fam
from .signature import Signature

if TYPE_CHECKING:
    from .profiledb import ProfileDB
    from .roofline import RooflineModel

NEIGHBOURS = 6
MAX_LOG_DISTANCE = math.log(16.0)


@dataclass(frozen=True)
class GemmShape:
    m: int          # batch x rows
    n: int
    k: int
    dtype: str      # peak-table key of the arithmetic

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k


def gemm_shape(sig: Signature) -> GemmShape | None:
    """(batch*M, N, K, dtype) of a matmul signature, or None for anything else."""
    if fam.classify(sig.op) != fam.MATMUL:
        return None
    name = sig.name
    t = sig.tensor
    try:
        if name in ("mm", "_scaled_mm", "_int_mm"):
            (m, k), n = t(0)[0], t(1)[0][1]
        elif name == "bmm":
            (b, m, k), n = t(0)[0], t(1)[0][2]
            m *= b
        elif name in ("addmm", "addmm_", "_addmm_activation"):
            (m, k), n = t(1)[0], t(2)[0][1]
        elif name in ("baddbmm", "baddbmm_"):
            (b, m, k), n = t(1)[0], t(2)[0][2]
            m *= b
        elif name == "linear":
            x, w = t(0)[0], t(1)[0]
            k, n = x[-1], w[0]
            m = fam.numel(x) // max(k, 1)
        else:
            return None
    except (TypeError, IndexError, ValueError):
        return None
    w = fam.work(sig)
    if min(m, n, k) <= 0:
        return None
    return GemmShape(int(m), int(n), int(k), w.dtype)


@dataclass(frozen=True)
class _Entry:
    sig: Signature
    shape: GemmShape
    logs: tuple[float, float, float]
    t: float            # seconds


class MatmulInterpolator:
    """Interpolates GEMM durations over one profile database (its index is rebuilt when the database changes)."""

    def __init__(self, db: "ProfileDB"):
        self.db = db
        self._version = -1
        self._by_dtype: dict[str, list[_Entry]] = {}

    def _index(self) -> dict[str, list[_Entry]]:
        if self._version != self.db.version:
            by: dict[str, list[_Entry]] = {}
            for key, rec in self.db.items():
                sig = Signature.from_key(key)
                g = gemm_shape(sig)
                if g is None or rec.median_us <= 0:
                    continue
                by.setdefault(g.dtype, []).append(
                    _Entry(sig, g, (math.log(g.m), math.log(g.n), math.log(g.k)), rec.median_us * 1e-6))
            self._by_dtype = by
            self._version = self.db.version
        return self._by_dtype

    def estimate(self, sig: Signature, roofline: "RooflineModel") -> tuple[float, int] | None:
        """(seconds, neighbours used) for a matmul signature, or None when no profiled GEMM is near enough."""
        g = gemm_shape(sig)
        if g is None:
            return None
        entries = self._index().get(g.dtype)
        if not entries:
            return None
        lg = (math.log(g.m), math.log(g.n), math.log(g.k))
        scored = []
        for e in entries:
            d = math.sqrt(sum((a - b) ** 2 for a, b in zip(lg, e.logs)))
            if d <= MAX_LOG_DISTANCE:
                scored.append((d, e))
        if not scored:
            return None
        scored.sort(key=lambda x: x[0])
        near = [e for _, e in scored[:NEIGHBOURS]]
        w = g.flops
        below = [e for e in near if e.shape.flops <= w]
        above = [e for e in near if e.shape.flops >= w]

        def q(e: _Entry) -> float:
            return math.log(e.t / roofline.estimate(e.sig).duration_s)

        base = roofline.estimate(sig).duration_s
        if below and above:
            lo, hi = below[0], above[0]          # nearest in shape on each side
            l0, l1 = math.log(lo.shape.flops), math.log(hi.shape.flops)
            f = 0.5 if l1 - l0 < 1e-12 else (math.log(w) - l0) / (l1 - l0)
            return base * math.exp(q(lo) + f * (q(hi) - q(lo))), 2
        return base * math.exp(q(near[0])), 1
