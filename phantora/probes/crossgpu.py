"""How well one GPU's profile predicts another's: `python -m phantora.probes.crossgpu SRC.h5 DST.h5`.

For every signature measured on both GPUs, the destination GPU's cost model is given only the source's profile (the
cross-GPU fallback: the source's time scaled by the ratio of the two GPUs' roofline estimates) and its estimate is
compared with the destination's measurement. Kernels under 8 µs (launch floor) are left out. Prints the median and
90th-percentile absolute error per op family.
"""

from __future__ import annotations

import statistics
import sys
from collections import defaultdict

from ..costmodel.model import CostModel
from ..costmodel.profiledb import ProfileDB
from ..costmodel.signature import Signature
from ..engine.ops import CostSource
from ..gpus import load_gpu

MIN_US = 8.0


def cross_errors(src: ProfileDB, dst: ProfileDB) -> dict[str, list[float]]:
    """Relative errors (estimate / measured - 1) per op family."""
    model = CostModel(load_gpu(dst.gpu), fallback_gpu_db=src)
    errs: dict[str, list[float]] = defaultdict(list)
    for key, rec in dst.items():
        if rec.median_us < MIN_US:
            continue
        c = model.estimate(Signature.from_key(key))
        if c.source == CostSource.CROSS_GPU:
            # the estimate is a stream time: compare it with the destination's measurement as a stream time
            measured = rec.median_us - model.event_overhead_s * 1e6
            errs[c.family].append(c.duration_s * 1e6 / measured - 1.0)
    return errs


def report(src: ProfileDB, dst: ProfileDB) -> str:
    errs = cross_errors(src, dst)
    every = [abs(x) for v in errs.values() for x in v]
    if not every:
        return f"{src.gpu} -> {dst.gpu}: no signature measured on both"
    lines = [f"{src.gpu} -> {dst.gpu}: {len(every)} signatures, median |error| {100 * statistics.median(every):.1f}%",
             f"  {'family':<14} {'n':>5} {'median':>8} {'p90':>8}"]
    for fam, v in sorted(errs.items(), key=lambda kv: -len(kv[1])):
        a = sorted(abs(x) for x in v)
        lines.append(f"  {fam:<14} {len(a):>5} {100 * statistics.median(a):>7.1f}% {100 * a[int(0.9 * (len(a) - 1))]:>7.1f}%")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m phantora.probes.crossgpu SRC.h5 DST.h5", file=sys.stderr)
        return 2
    print(report(ProfileDB.open(args[0]), ProfileDB.open(args[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
