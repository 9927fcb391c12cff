"""Compare the same kernels in two in-situ timelines (`llama.py --kernel-profile` writes `timeline.json`).

    python groundtruth/insitu/compare_kernels.py BASE/timeline.json OTHER/timeline.json [--outside-nccl | --alone]

Kernel names do not carry shapes, so each name's durations are split into clusters (durations within 3% of the
previous one, at least 6 launches, at least 20 µs); a name whose two runs have the same number of clusters is
matched cluster by cluster, in order of duration. Prints the ratio OTHER / BASE of each matched cluster's median,
and the ratio over all matched clusters of a class, weighted by the base time of one launch of each: GEMMs and
attention (compute-bound on Hopper), other kernels (element-wise, copies, norms: HBM-bound). NCCL kernels are left
out. Both runs must use the same per-GPU shapes for the comparison to mean anything. With `--outside-nccl` only the
launches of OTHER that overlap no NCCL kernel count (the GPU was not shared with a collective at the time); with
`--alone` only those that overlap no kernel of another stream at all (no collective, no copy of FSDP's side streams).
"""

from __future__ import annotations

import bisect
import json
import statistics
import sys
from collections import defaultdict

GAP = 1.03
MIN_LAUNCHES = 6
MIN_US = 20.0


# GPU-side ranges of torch.profiler's record_function scopes (FSDP's, the optimizer's, NCCL's, a compiled graph's
# call): the timelines committed so far list them among the kernels, on the kernels' streams
# (workload_common.write_kernel_profile now leaves them out). They are not kernels: `Optimizer.step#AdamW.step`
# spans the whole optimizer step.
ANNOTATION_PREFIXES = ("FSDP::", "Optimizer.", "nccl:", "## ", "DistributedDataParallel.", "ProfilerStep#",
                       "record_param_comms", "Command Buffer Full")


def is_annotation(name: str) -> bool:
    return name.startswith(ANNOTATION_PREFIXES)


def kernels(data: dict) -> list:
    """The timeline's (name id, stream, start, duration) rows that are GPU activities, not annotations."""
    names = data["names"]
    return [k for k in data["kernels"] if not is_annotation(names[k[0]])]


def load(path: str, outside_nccl: bool = False, alone: bool = False) -> dict[str, list[float]]:
    data = json.loads(open(path).read())
    names = data["names"]
    data["kernels"] = kernels(data)
    nccl = _union(sorted((start, start + dur) for name, _s, start, dur in data["kernels"]
                         if "nccl" in names[name].lower()))
    per_stream: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for _name, stream, start, dur in data["kernels"]:
        per_stream[stream].append((start, start + dur))
    streams = {st: _union(sorted(iv)) for st, iv in per_stream.items()}
    durations: dict[str, list[float]] = defaultdict(list)
    for name, stream, start, dur in data["kernels"]:
        n = names[name]
        if "nccl" in n.lower() or dur <= 0:
            continue
        if outside_nccl and _overlaps(nccl, start, start + dur):
            continue
        if alone and any(_overlaps(iv, start, start + dur) for st, iv in streams.items() if st != stream):
            continue
        durations[n].append(dur)
    return durations


def _overlaps(busy: list[tuple[float, float]], start: float, end: float) -> bool:
    """Whether [start, end) meets one of the disjoint sorted intervals `busy`."""
    i = bisect.bisect_right([s for s, _ in busy], end) - 1        # the last interval starting before the end
    return i >= 0 and busy[i][1] > start


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Disjoint intervals covering sorted (start, end) intervals (NCCL kernels of two streams overlap)."""
    out: list[list[float]] = []
    for s, e in intervals:
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def clusters(durations: list[float]) -> list[tuple[float, int]]:
    xs = sorted(durations)
    groups, cur = [], [xs[0]]
    for x in xs[1:]:
        if x < cur[-1] * GAP:
            cur.append(x)
        else:
            groups.append(cur)
            cur = [x]
    groups.append(cur)
    return [(statistics.median(g), len(g)) for g in groups if len(g) >= MIN_LAUNCHES and statistics.median(g) >= MIN_US]


def compute_bound(name: str) -> bool:
    return name.startswith(("nvjet", "sm90_xmma", "cutlass")) or "gemm" in name.lower() or "sdpa" in name \
        or "flash" in name.lower()


def main(base_path: str, other_path: str, outside_nccl: bool = False, alone: bool = False) -> None:
    base, other = load(base_path), load(other_path, outside_nccl, alone)
    weighted = {True: [0.0, 0.0], False: [0.0, 0.0]}
    for name in sorted(set(base) & set(other)):
        a, b = clusters(base[name]), clusters(other[name])
        if not a or len(a) != len(b):
            continue
        for (ma, na), (mb, nb) in zip(a, b):
            cls = compute_bound(name)
            weighted[cls][0] += ma
            weighted[cls][1] += mb
            print(f"{mb / ma:6.3f}  {ma:9.1f} -> {mb:9.1f} us  ({na} / {nb} launches)  {name[:90]}")
    for cls, label in ((True, "GEMMs and attention"), (False, "other kernels (HBM-bound)")):
        a, b = weighted[cls]
        if a:
            print(f"# {label}: {b / a:.3f}")


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a not in ("--outside-nccl", "--alone")]
    if len(args) != 2:
        sys.exit(__doc__)
    main(args[0], args[1], "--outside-nccl" in sys.argv[1:], "--alone" in sys.argv[1:])
