"""How much slower a kernel runs while NCCL's kernels share its GPU, fitted on in-situ timelines of real steps.

    python groundtruth/insitu/sharing_fit.py ONE_GPU/timeline.json TWO_GPU/timeline.json [...more pairs]

Each pair is the same per-GPU step on one GPU and with FSDP over two (`llama.py --kernel-profile`, the same host).
Each kernel launch of the two-GPU run is matched to the one-GPU median of its name's nearest duration cluster
(compare_kernels.py); `f` is the share of the launch's time that overlaps a NCCL kernel of its rank. Per class
(GEMMs and attention; other, HBM-bound kernels) it fits, weighted by the one-GPU time, ratio = a (1 + (s - 1) f):
`a` is the two-GPU run's slowdown where no collective runs beside the kernel, `s` the factor while one does. The
engine has no `a`: it slows a kernel only for the time a collective overlaps it, by its factor less one. Its factors
(`[nccl] sharing_compute` and `sharing_memory`, docs/network-model.md) are the ones that give the two-GPU steps
their whole extra kernel time: 1 + (the class's two-GPU time less its one-GPU time) / (its time overlapped by NCCL),
the `engine` column. Prints one line per pair and class and the fits over all pairs.

    python groundtruth/insitu/sharing_fit.py --copies ONE_GPU/timeline.json TWO_GPU/timeline.json [...] [-- TIMELINE...]

With `--copies`, the same launches fitted with a third term: ratio = a (1 + (s - 1) f + (c - 1) g), where `g` is the
share of the launch's time that overlaps a kernel of another stream of its rank that is not NCCL's (FSDP's copy-in
and copy-out on its side streams), `c` the factor while one does. Timelines after `--` (no one-GPU pair needed) are
summed per stream and class: kernel time, and the time of it beside another stream's kernels and beside NCCL's.

    python groundtruth/insitu/sharing_fit.py --engine SIM1.h5 SIM2.h5 ... ONE_GPU/timeline.json TWO_GPU/... [...]

With `--engine`, one simulated trace per pair (the same two-GPU step under `phantora run`, replayed with the sharing
off: `phantora replay T --recost --set nccl.sharing_compute=1 --set nccl.sharing_memory=1 --set
nccl.sharing_collective=1 --out SIM.h5`) gives the overlap in the engine's own terms: its collectives are shorter
than the real NCCL kernels (which hold each rank's wait for the other), so they overlap less compute. The factors
then give the measured extra time over the engine's overlapped time: 1 + sum over pairs of (two-GPU time less
one-GPU time) / sum of (the simulated overlapped share x the one-GPU time), per class (`[nccl] sharing_compute`
and `sharing_memory`; the `engine` column is the same over the real NCCL kernels' overlap).
"""

from __future__ import annotations

import bisect
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare_kernels import _union, clusters, compute_bound, kernels, load  # noqa: E402


def overlap_with(busy: list[tuple[float, float]]):
    """A function (start, end) -> the time of [start, end) inside the disjoint sorted intervals `busy`."""
    starts = [s for s, _ in busy]

    def overlap(s: float, e: float) -> float:
        i, t = max(bisect.bisect_right(starts, s) - 1, 0), 0.0
        while i < len(busy) and busy[i][0] < e:
            t += max(0.0, min(e, busy[i][1]) - max(s, busy[i][0]))
            i += 1
        return t
    return overlap


def samples(base_path: str, other_path: str) -> dict[bool, list[tuple[float, float, float]]]:
    """(f, two-GPU duration, one-GPU duration) per matched launch, by class (True: GEMMs and attention)."""
    base = {n: clusters(d) for n, d in load(base_path).items()}
    data = json.loads(Path(other_path).read_text())
    names = data["names"]
    data["kernels"] = kernels(data)
    overlap = overlap_with(_union(sorted((s, s + d) for n, _st, s, d in data["kernels"]
                                         if "nccl" in names[n].lower())))

    out: dict[bool, list] = {True: [], False: []}
    for n, _stream, s, d in data["kernels"]:
        name = names[n]
        if "nccl" in name.lower() or d <= 0 or not base.get(name):
            continue
        ref = min(base[name], key=lambda c: abs(c[0] - d))[0]
        if abs(d / ref - 1) > 0.5:                  # another shape of the same kernel
            continue
        out[compute_bound(name)].append((overlap(s, s + d) / d, d, ref))
    return out


def fit(rows: list[tuple[float, float, float]]) -> tuple[float, float, float]:
    """(a, s, time-weighted mean f) of ratio = a + a (s - 1) f, weighted by the one-GPU time."""
    f = np.array([r[0] for r in rows])
    y = np.array([r[1] / r[2] for r in rows])
    w = np.sqrt(np.array([r[2] for r in rows]))
    a, b = np.linalg.lstsq(np.vstack([np.ones_like(f), f]).T * w[:, None], y * w, rcond=None)[0]
    return a, 1 + b / a, float((f * w * w).sum() / (w * w).sum())


def samples_copies(base_path: str, other_path: str) -> dict[bool, list[tuple[float, float, float, float]]]:
    """(f, g, two-GPU duration, one-GPU duration) per matched launch, by class: f beside NCCL, g beside another
    stream's kernels that are not NCCL's (`--copies` in the module docstring)."""
    base = {n: clusters(d) for n, d in load(base_path).items()}
    data = json.loads(Path(other_path).read_text())
    names = data["names"]
    rows = kernels(data)
    nccl = overlap_with(_union(sorted((s, s + d) for n, _st, s, d in rows if "nccl" in names[n].lower())))
    side = side_streams(rows, names)
    out: dict[bool, list] = {True: [], False: []}
    for n, stream, s, d in rows:
        name = names[n]
        if "nccl" in name.lower() or d <= 0 or not base.get(name):
            continue
        ref = min(base[name], key=lambda c: abs(c[0] - d))[0]
        if abs(d / ref - 1) > 0.5:
            continue
        g = sum(o(s, s + d) for sid, o in side.items() if sid != stream) / d
        out[compute_bound(name)].append((nccl(s, s + d) / d, min(g, 1.0), d, ref))
    return out


def side_streams(rows: list, names: list) -> dict:
    """Per stream, the overlap function of its kernels that are not NCCL's."""
    per: dict[int, list] = {}
    for n, stream, s, d in rows:
        if "nccl" not in names[n].lower():
            per.setdefault(stream, []).append((s, s + d))
    return {sid: overlap_with(_union(sorted(iv))) for sid, iv in per.items()}


def fit_copies(rows: list[tuple[float, float, float, float]]) -> tuple[float, float, float]:
    """(a, s, c) of ratio = a (1 + (s - 1) f + (c - 1) g), weighted by the one-GPU time."""
    f = np.array([r[0] for r in rows])
    g = np.array([r[1] for r in rows])
    y = np.array([r[2] / r[3] for r in rows])
    w = np.sqrt(np.array([r[3] for r in rows]))
    a, b, c = np.linalg.lstsq(np.vstack([np.ones_like(f), f, g]).T * w[:, None], y * w, rcond=None)[0]
    return a, 1 + b / a, 1 + c / a


def beside(path: str) -> None:
    """Print, per stream and class, the kernel time and the part of it beside another stream's kernels (not NCCL's)
    and beside NCCL's kernels."""
    data = json.loads(Path(path).read_text())
    names = data["names"]
    rows = kernels(data)
    nccl = overlap_with(_union(sorted((s, s + d) for n, _st, s, d in rows if "nccl" in names[n].lower())))
    side = side_streams(rows, names)
    sums: dict[tuple[int, bool], list[float]] = {}
    for n, stream, s, d in rows:
        if "nccl" in names[n].lower():
            continue
        t = sums.setdefault((stream, compute_bound(names[n])), [0.0, 0.0, 0.0])
        t[0] += d
        t[1] += sum(o(s, s + d) for sid, o in side.items() if sid != stream)
        t[2] += nccl(s, s + d)
    print(path)
    for (stream, cls), (t, other, by_nccl) in sorted(sums.items()):
        print(f"  stream {stream:3d} {'GEMMs and attention' if cls else 'other kernels':20s} {t / 1e3:9.1f} ms, "
              f"beside another stream's kernels {other / 1e3:8.1f} ms, beside NCCL {by_nccl / 1e3:8.1f} ms")


def copies_main(paths: list[str]) -> None:
    extra = []
    if "--" in paths:
        i = paths.index("--")
        paths, extra = paths[:i], paths[i + 1:]
    if len(paths) % 2:
        sys.exit(__doc__)
    pooled: dict[bool, list] = {True: [], False: []}
    for base, other in zip(paths[::2], paths[1::2]):
        got = samples_copies(base, other)
        for cls, label in ((True, "GEMMs and attention"), (False, "other kernels")):
            pooled[cls] += got[cls]
            a, s, c = fit_copies(got[cls])
            print(f"{Path(other).parent.name:28s} {label:20s} alone x{a:.3f}  beside NCCL x{s:.3f}  "
                  f"beside copies x{c:.3f}  ({len(got[cls])} launches)")
    for cls, label in ((True, "GEMMs and attention"), (False, "other kernels")):
        if pooled[cls]:
            a, s, c = fit_copies(pooled[cls])
            print(f"{'all pairs':28s} {label:20s} alone x{a:.3f}  beside NCCL x{s:.3f}  beside copies x{c:.3f}")
    for path in extra:
        beside(path)


def engine_factor(rows: list[tuple[float, float, float]]) -> float:
    """The engine's factor: 1 + extra time / overlapped time, both in one-GPU time (see the module docstring)."""
    extra = sum(two - one for _f, two, one in rows)
    overlapped = sum(f * one for f, _two, one in rows)
    return 1.0 + extra / overlapped if overlapped > 0 else 1.0


def simulated_overlap(trace: str) -> dict[bool, float]:
    """Per class (True: compute-bound, at least 32 FLOPs per DRAM byte as the engine classes them), the share of
    the kernel time of rank 0's steps after the first that a collective of that rank overlaps."""
    from phantora.costmodel.families import work
    from phantora.costmodel.signature import Signature
    from phantora.engine.ops import OpKind
    from phantora.trace.reader import TraceReader

    with TraceReader(trace) as r:
        ops, sigs = r.ops(0), r.signatures
        marks = r.iterations(0, ops)
    ops = ops[(ops["start"] >= marks[1]) & (ops["end"] <= marks[-1])]
    overlap = overlap_with(_union(sorted((float(o["start"]), float(o["end"]))
                                         for o in ops[ops["kind"] == int(OpKind.COLLECTIVE)])))

    total, over, bound = {True: 0.0, False: 0.0}, {True: 0.0, False: 0.0}, {}
    for k in ops[(ops["kind"] == int(OpKind.KERNEL)) & (ops["sig"] >= 0)]:
        sid = int(k["sig"])
        if sid not in bound:
            w = work(Signature.from_key(sigs[sid]))
            bound[sid] = w.flops >= 32 * max(w.nbytes, 1)
        s, e = float(k["start"]), float(k["end"])
        total[bound[sid]] += e - s
        over[bound[sid]] += overlap(s, e)
    return {c: over[c] / total[c] if total[c] > 0 else 0.0 for c in total}


def engine_terms_factor(pairs: list[tuple[list, float]]) -> float:
    """1 + measured extra time / the engine's overlapped time, over pairs of (matched launches, simulated share)."""
    extra = sum(two - one for rows, _ in pairs for _f, two, one in rows)
    overlapped = sum(share * sum(one for _f, _two, one in rows) for rows, share in pairs)
    return 1.0 + extra / overlapped if overlapped > 0 else 1.0


def main(paths: list[str]) -> None:
    if paths and paths[0] == "--copies":
        return copies_main(paths[1:])
    sims: list[str] = []
    if paths and paths[0] == "--engine":
        n = (len(paths) - 1) // 3
        sims, paths = paths[1:1 + n], paths[1 + n:]
        if len(paths) != 2 * n:
            sys.exit(__doc__)
    if len(paths) < 2 or len(paths) % 2:
        sys.exit(__doc__)
    pooled: dict[bool, list] = {True: [], False: []}
    engine_pairs: dict[bool, list] = {True: [], False: []}
    for i, (base, other) in enumerate(zip(paths[::2], paths[1::2])):
        got = samples(base, other)
        if sims:
            share = simulated_overlap(sims[i])
            for cls in (True, False):
                engine_pairs[cls].append((got[cls], share[cls]))
        for cls, label in ((True, "GEMMs and attention"), (False, "other kernels")):
            a, s, mf = fit(got[cls])
            pooled[cls] += got[cls]
            print(f"{Path(other).parent.name:28s} {label:20s} alone x{a:.3f}  beside NCCL x{s:.3f}  "
                  f"engine x{engine_factor(got[cls]):.3f}  (mean overlap {mf:.2f}, {len(got[cls])} launches)")
    for cls, label in ((True, "GEMMs and attention"), (False, "other kernels")):
        a, s, _ = fit(pooled[cls])
        print(f"{'all pairs':28s} {label:20s} alone x{a:.3f}  beside NCCL x{s:.3f}  "
              f"engine x{engine_factor(pooled[cls]):.3f}")
    for cls, label in ((True, "GEMMs and attention"), (False, "other kernels")):
        if sims:
            shares = ", ".join(f"{share:.3f}" for _rows, share in engine_pairs[cls])
            print(f"{'engine terms':28s} {label:20s} simulated overlap {shares}  "
                  f"factor x{engine_terms_factor(engine_pairs[cls]):.3f}")


if __name__ == "__main__":
    main(sys.argv[1:])
