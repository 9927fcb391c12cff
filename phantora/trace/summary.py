"""What `phantora inspect` prints: per-rank op counts, stream busy time, compute vs communication, exposed
communication, iteration times, peak memory and the kernels that take the most time.

Busy times are measures of unions of [start, end) intervals, so overlapping ops count once. Exposed communication
is the time a rank communicates (collectives, sends, receives) while none of its streams runs a kernel:
|communication ∪ compute| - |compute|. GPU idle is the time none of its streams runs anything (kernel, copy,
collective, send or receive): the GPU waits for the host, a host-bound stretch of the step.

Compute, copy, communication, exposed and overlapped communication are given per iteration wherever a rank has two
or more iteration marks: those of its median iteration (`median_iteration`: the span between consecutive marks of
median length; intervals clipped to it, so set-up, a slow first step or a recompilation never count): one typical
iteration, whose figures add up with the median iteration time where the count of iterations is odd. A rank with
fewer marks gets them over its whole trace. `time_basis` says which ("per iteration" or "whole trace"); `totals`
always holds the whole-trace figures. Live-run summaries and replay report the same per-iteration figures
(`per_iteration`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from phantora.engine.ops import OpKind
from phantora.routing import describe as describe_routing, skewed
from phantora.trace import schema as S
from phantora.trace.deps import check_dependencies
from phantora.trace.reader import TraceReader

DEFAULT_TOP = 10


def interval_union(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Disjoint, sorted intervals covering the same time as the [start, end) intervals given (empty ones dropped)."""
    starts = np.asarray(starts, np.float64)
    ends = np.asarray(ends, np.float64)
    keep = ends > starts
    starts, ends = starts[keep], ends[keep]
    if not len(starts):
        return starts, ends
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    reach = np.maximum.accumulate(ends)
    # A new merged interval begins where an interval starts after everything before it has ended.
    new = np.empty(len(starts), bool)
    new[0] = True
    new[1:] = starts[1:] > reach[:-1]
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, len(starts) - 1)
    return starts[first], reach[last]


def union_length(starts: np.ndarray, ends: np.ndarray) -> float:
    """Total time covered by the union of [start, end) intervals."""
    s, e = interval_union(starts, ends)
    return float(np.sum(e - s))


def kernel_time_by_source(ops: np.ndarray) -> dict[int, float]:
    """Kernel time of one rank's op rows per cost source (engine.ops.CostSource value -> seconds)."""
    kern = ops[ops["kind"] == int(OpKind.KERNEL)]
    if not len(kern):
        return {}
    sums = np.bincount(kern["source"].astype(np.int64), weights=kern["duration"].astype(np.float64))
    return {src: float(t) for src, t in enumerate(sums) if t > 0}


PER_ITERATION = "per iteration"
WHOLE_TRACE = "whole trace"
TIME_KEYS = ("compute", "copy", "communication", "exposed_communication", "overlapped_communication", "gpu_idle")
"""The busy-time figures that are per iteration where iterations exist (see the module docstring)."""


def busy_times(ops: np.ndarray, window: tuple[float, float] | None = None) -> dict[str, float]:
    """Compute, copy, communication, exposed and overlapped communication seconds of one rank's op rows, and the
    seconds its GPU runs nothing, over `window` (intervals clipped to it) or the whole rows (from the first op's
    issue to the last op's end)."""
    kind = ops["kind"]
    start, end = ops["start"].astype(np.float64), ops["end"].astype(np.float64)
    if window is not None:
        start, end = np.clip(start, *window), np.clip(end, *window)
        span = window[1] - window[0]
    else:
        span = float(max(end.max(), ops["issue"].max()) - ops["issue"].min()) if len(ops) else 0.0
    comp = kind == int(OpKind.KERNEL)
    comm = np.isin(kind, [int(k) for k in S.COMM_KINDS])
    copy = kind == int(OpKind.MEMCPY)
    compute = union_length(start[comp], end[comp])
    communication = union_length(start[comm], end[comm])
    both = comp | comm
    exposed = max(0.0, union_length(start[both], end[both]) - compute)
    gpu = both | copy
    return {"compute": compute, "copy": union_length(start[copy], end[copy]), "communication": communication,
            "exposed_communication": exposed, "overlapped_communication": communication - exposed,
            "gpu_idle": max(0.0, span - union_length(start[gpu], end[gpu]))}


def flops_in(ops: np.ndarray, window: tuple[float, float]) -> float:
    """FLOPs the rank's kernels did on the GPU between `window[0]` and `window[1]`: each kernel's FLOPs times the
    share of its GPU time inside the window (one of no duration counts where it starts). By GPU time, not by when
    the host issued the kernels: a host that runs iterations ahead has issued them before the window opens."""
    k = ops[ops["kind"] == int(OpKind.KERNEL)]
    if not len(k):
        return 0.0
    lo, hi = window
    start, end = k["start"].astype(np.float64), k["end"].astype(np.float64)
    length = end - start
    inside = np.clip(np.minimum(end, hi) - np.maximum(start, lo), 0.0, None)
    share = np.where(length > 0, inside / np.where(length > 0, length, 1.0), (start >= lo) & (start < hi))
    return float(np.sum(k["flops"].astype(np.float64) * share))


def idle_shares(ops: np.ndarray, iterations) -> list[float]:
    """For each iteration between consecutive marks (of positive length), the share of it during which the rank's
    GPU runs nothing (no kernel, copy, collective, send or receive)."""
    marks = np.asarray(iterations, np.float64)
    if len(marks) < 2:
        return []
    gpu = np.isin(ops["kind"], [int(k) for k in S.GPU_KINDS])
    us, ue = interval_union(ops["start"][gpu], ops["end"][gpu])
    covered = np.concatenate([[0.0], np.cumsum(ue - us)])

    def busy_until(t: np.ndarray) -> np.ndarray:      # GPU time covered before each t
        i = np.searchsorted(us, t, side="right")        # intervals starting at or before t
        part = np.where(i > 0, np.minimum(ue[i - 1], t) - us[i - 1], 0.0) if len(us) else np.zeros(len(t))
        return covered[np.maximum(i - 1, 0)] * (i > 0) + np.maximum(part, 0.0)

    busy = np.diff(busy_until(marks))
    length = np.diff(marks)
    return [float(1.0 - b / n) for b, n in zip(busy, length) if n > 0]


def median_iteration(iterations) -> tuple[float, float] | None:
    """The window of the rank's median iteration: of the spans between consecutive marks of positive length, the
    one of median length (with an even count, the shorter of the two middle ones; among equal lengths, the first).
    None with fewer than two marks that advance."""
    marks = np.asarray(iterations, np.float64)
    if len(marks) < 2:
        return None
    lengths = np.diff(marks)
    spans = np.flatnonzero(lengths > 0)
    if not len(spans):
        return None
    order = spans[np.argsort(lengths[spans], kind="stable")]
    k = int(order[(len(order) - 1) // 2])
    return float(marks[k]), float(marks[k + 1])


def per_iteration(ops: np.ndarray, iterations) -> dict[str, float] | None:
    """`busy_times` of the rank's median iteration (`median_iteration`), one typical iteration beside the median
    iteration time the reports give: a slow first step, a recompilation or a checkpoint save does not leak into them
    (None with fewer than two marks that advance)."""
    window = median_iteration(iterations)
    return None if window is None else busy_times(ops, window)


def summarize_ops(ops: np.ndarray, names: list[str], iterations: np.ndarray | None = None,
                  top: int = DEFAULT_TOP) -> dict[str, Any]:
    """Summary of one rank's op rows (schema.OP_DTYPE); `iterations` defaults to its ITER_MARK end times.
    The TIME_KEYS figures are per iteration where there are two or more marks (`time_basis`; module docstring)."""
    kind = ops["kind"]
    gpu = np.isin(kind, [int(k) for k in S.GPU_KINDS])
    comp = kind == int(OpKind.KERNEL)
    start, end = ops["start"], ops["end"]

    counts = np.bincount(kind, minlength=len(OpKind))
    by_kind = {S.KIND_NAMES.get(k, str(k)): int(c) for k, c in enumerate(counts) if c}
    streams = {}
    for s in np.unique(ops["stream"][gpu]).tolist():
        sel = gpu & (ops["stream"] == s)
        streams[int(s)] = union_length(start[sel], end[sel])
    if iterations is None:
        iterations = ops["end"][kind == int(OpKind.ITER_MARK)]
    iterations = np.asarray(iterations, np.float64)
    steps = np.diff(iterations)
    totals = busy_times(ops)
    per_iter = per_iteration(ops, iterations)
    shares = idle_shares(ops, iterations)

    mem = np.cumsum(ops["mem_delta"], dtype=np.int64)
    t0 = float(ops["issue"].min()) if len(ops) else 0.0
    t1 = float(max(ops["end"].max(), ops["issue"].max())) if len(ops) else 0.0

    return {
        "n_ops": int(len(ops)),
        "ops_by_kind": by_kind,
        "time_span": [t0, t1],
        "stream_busy": streams,
        **(per_iter if per_iter is not None else totals),
        "time_basis": PER_ITERATION if per_iter is not None else WHOLE_TRACE,
        "idle_share": float(np.median(shares)) if shares else None,
        "totals": totals,
        "flops": float(ops["flops"][comp].sum()),
        "iterations": iterations.tolist(),
        "iteration_times": steps.tolist(),
        "mean_iteration": float(steps.mean()) if len(steps) else None,
        "median_iteration": float(np.median(steps)) if len(steps) else None,
        "peak_memory": int(max(0, int(mem.max()))) if len(mem) else 0,
        "final_memory": int(mem[-1]) if len(mem) else 0,
        "top_kernels": top_kernels(ops[comp], names, top),
    }


def top_kernels(kernels: np.ndarray, names: list[str], top: int = DEFAULT_TOP) -> list[dict[str, Any]]:
    """Kernel names by total `duration`, largest first: name, count, total and mean seconds."""
    if not len(kernels):
        return []
    ids, inverse = np.unique(kernels["name"], return_inverse=True)
    totals = np.bincount(inverse, weights=kernels["duration"])
    counts = np.bincount(inverse)
    order = np.argsort(-totals, kind="stable")[:top]
    return [{"name": names[int(ids[i])] if int(ids[i]) < len(names) else f"#{int(ids[i])}",
             "count": int(counts[i]), "total": float(totals[i]), "mean": float(totals[i] / counts[i])}
            for i in order]


def summarize(reader: TraceReader, top: int = DEFAULT_TOP) -> dict[str, Any]:
    """Summary of a whole trace: file facts, one entry per simulated rank, and top kernels over all ranks.

    The dependencies table is checked against the op rows (trace.deps.check_dependencies): `dependency_problems`
    counts rows that contradict them or the physics of the timeline, `dependency_messages` says what the first were.
    """
    names = reader.names
    meta = reader.meta
    ranks = []
    all_kernels = []
    deps = reader.dependencies
    dep_rank = deps["rank"]
    problems, messages = 0, []
    strays = ~np.isin(dep_rank, np.asarray(reader.ranks, np.int64))
    if strays.any():
        n, msgs = check_dependencies(deps[strays], {})
        problems, messages = problems + n, messages + msgs
    for r in reader.ranks:
        ops = reader.ops(r)
        mine = deps[dep_rank == r]
        entry = {"rank": r, **summarize_ops(ops, names, reader.iterations(r, ops), top), "dependencies": len(mine)}
        n, msgs = check_dependencies(mine, {r: ops})
        problems, messages = problems + n, messages + msgs
        ranks.append(entry)
        all_kernels.append(ops[ops["kind"] == int(OpKind.KERNEL)])
    kernels = np.concatenate(all_kernels) if all_kernels else np.empty(0, S.OP_DTYPE)
    return {
        "file": reader.path,
        "version": reader.version,
        "complete": reader.complete,
        "warning": reader.warning,
        "error": reader.error,
        "meta": {k: meta.get(k) for k in ("mode", "gpu", "world_size", "created", "command", "routing") if k in meta},
        "n_signatures": len(reader.signatures),
        "n_collectives": int(len(reader.collectives)),
        "n_dependencies": int(len(deps)),
        "dependency_problems": problems,
        "dependency_messages": messages[:5],
        "ranks": ranks,
        "top_kernels": top_kernels(kernels, names, top),
    }


def format_summary(summary: dict[str, Any]) -> str:
    """Terminal text of a `summarize` result."""
    lines = [f"trace {summary['file']}  (format v{summary['version']}, "
             f"{'complete' if summary['complete'] else 'INCOMPLETE'})"]
    if summary.get("warning"):
        lines.append(f"warning: {summary['warning']}")
    if summary.get("error"):
        lines.append(f"run ended with an error: {summary['error']}")
    meta = summary.get("meta", {})
    facts = [f"{k}: {meta[k]}" for k in ("mode", "gpu", "world_size", "created") if meta.get(k) is not None]
    if facts:
        lines.append("  ".join(facts))
    if meta.get("command"):
        cmd = meta["command"]
        lines.append("command: " + (" ".join(map(str, cmd)) if isinstance(cmd, list) else str(cmd)))
    if skewed(meta.get("routing")):
        lines.append(f"expert routing assumed: {describe_routing(meta['routing'])}")
    lines.append(f"{len(summary['ranks'])} simulated rank(s), {summary['n_collectives']} collectives, "
                 f"{summary['n_signatures']} kernel signatures")
    n_deps = summary.get("n_dependencies")
    if n_deps is not None:
        bad = summary.get("dependency_problems", 0)
        state = "all consistent with the timeline" if not bad else f"{bad} INCONSISTENT"
        lines.append(f"cross-stream dependencies (event record -> wait): {n_deps}, {state}" if n_deps else
                     "cross-stream dependencies (event record -> wait): none recorded")
        for m in summary.get("dependency_messages", [])[:3]:
            lines.append(f"  {m}")
    lines.append("")

    bases = {r.get("time_basis", WHOLE_TRACE) for r in summary["ranks"]}
    if bases == {PER_ITERATION}:
        lines.append("compute, comm, exposed comm, GPU idle: per iteration, in each rank's median iteration (iter "
                     "time); streams busy: whole trace")
    elif bases == {WHOLE_TRACE}:
        lines.append("compute, comm, exposed comm, GPU idle, streams busy: over the whole trace (fewer than two "
                     "iteration marks)")
    elif bases:
        lines.append("compute, comm, exposed comm, GPU idle: per iteration, in each rank's median iteration; ranks "
                     "marked * over their whole trace (fewer than two iteration marks); streams busy: whole trace")
    header = ["rank", "ops", "iters", "iter time", "compute", "comm", "exposed comm", "GPU idle", "peak mem",
              "streams busy"]
    rows = []
    for r in summary["ranks"]:
        busy = ", ".join(f"{s}:{_time(t)}" for s, t in sorted(r["stream_busy"].items()))
        star = "*" if len(bases) > 1 and r.get("time_basis") == WHOLE_TRACE else ""
        rows.append([f"{r['rank']}{star}", str(r["n_ops"]), str(len(r["iteration_times"])),
                     _time(r["median_iteration"]) if r["median_iteration"] is not None else "-",
                     _time(r["compute"]), _time(r["communication"]), _time(r["exposed_communication"]),
                     _time(r.get("gpu_idle", 0.0)), _bytes(r["peak_memory"]), busy or "-"])
    lines.extend(_table(header, rows))

    if summary["top_kernels"]:
        lines.append("")
        lines.append("top kernels (all simulated ranks)")
        total = sum(r.get("totals", r)["compute"] for r in summary["ranks"]) or 1.0
        krows = [[k["name"], str(k["count"]), _time(k["total"]), _time(k["mean"]), f"{100 * k['total'] / total:.1f}%"]
                 for k in summary["top_kernels"]]
        lines.extend(_table(["kernel", "count", "total", "mean", "of compute"], krows))
    return "\n".join(lines)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    fmt = lambda cells: "  ".join(c.ljust(w) if i == 0 or i == len(cells) - 1 else c.rjust(w)  # noqa: E731
                                  for i, (c, w) in enumerate(zip(cells, widths))).rstrip()
    return [fmt(header), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows]


def _time(seconds: float) -> str:
    s = abs(seconds)
    if s >= 1:
        return f"{seconds:.3f} s"
    if s >= 1e-3:
        return f"{seconds * 1e3:.3f} ms"
    if s >= 1e-6 or s == 0:
        return f"{seconds * 1e6:.1f} us"
    return f"{seconds * 1e9:.0f} ns"


def _bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"
