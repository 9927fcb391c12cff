"""`phantora inspect` numbers checked against timelines built by hand and against brute-force counting."""

from __future__ import annotations

from collections import Counter, defaultdict

import numpy as np
import pytest

from phantora.engine.ops import OpKind
from phantora.trace import schema as S
from phantora.trace.reader import TraceReader
from phantora.trace.summary import format_summary, interval_union, summarize, union_length
from phantora.trace.writer import TraceWriter


def ops_from(spec: list[tuple]) -> np.ndarray:
    """Op rows from (kind, stream, start, end) tuples; issue = start."""
    rows = S.empty_ops(len(spec))
    for i, (kind, stream, start, end) in enumerate(spec):
        rows[i]["kind"] = int(kind)
        rows[i]["stream"] = stream
        rows[i]["issue"] = rows[i]["start"] = start
        rows[i]["end"] = end
        rows[i]["duration"] = end - start
    return rows


def covered_cells(intervals) -> set[int]:
    """Unit cells [t, t+1) covered by integer-ended [start, end) intervals: the brute-force reference."""
    return {t for s, e in intervals for t in range(int(s), int(e))}


def test_interval_union_against_cell_counting():
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(0, 30))
        s = rng.integers(0, 100, n)
        e = s + rng.integers(0, 20, n)
        us, ue = interval_union(s, e)
        assert union_length(s, e) == len(covered_cells(zip(s, e)))
        # Disjoint, sorted, non-empty, and not touching (touching ones merge).
        assert np.all(ue > us) and np.all(us[1:] > ue[:-1])


def write(tmp_path, rows_by_rank, **kw):
    path = tmp_path / "t.h5"
    with TraceWriter(path, {"ranks": sorted(rows_by_rank)}) as w:
        for name in ("", "gemm", "softmax", "layernorm"):
            w.add_string(name)
        for r, rows in rows_by_rank.items():
            w.append_ops(r, rows)
        for r, marks in kw.get("marks", {}).items():
            for t in marks:
                w.mark_iteration(r, t)
    return path


def test_exposed_communication_of_a_hand_built_timeline(tmp_path):
    K, C, M = OpKind.KERNEL, OpKind.COLLECTIVE, OpKind.MEMCPY
    rows = ops_from([
        (K, 0, 0, 10), (K, 0, 12, 20), (K, 2, 15, 25),   # compute covers [0,10) and [12,25)
        (C, 1, 5, 14), (C, 1, 24, 30), (C, 1, 40, 41),   # communication [5,14), [24,30), [40,41)
        (M, 3, 30, 40),                                  # a copy is neither compute nor communication
    ])
    with TraceReader(write(tmp_path, {0: rows})) as r:
        s = summarize(r)["ranks"][0]
    # By hand: compute = 10 + 13 = 23; communication = 9 + 6 + 1 = 16; communication while no kernel runs:
    # [10,12) + [25,30) + [40,41) = 2 + 5 + 1 = 8.
    assert s["compute"] == pytest.approx(23)
    assert s["communication"] == pytest.approx(16)
    assert s["exposed_communication"] == pytest.approx(8)
    assert s["overlapped_communication"] == pytest.approx(8)
    assert s["copy"] == pytest.approx(10)
    assert s["stream_busy"] == pytest.approx({0: 18, 1: 16, 2: 10, 3: 10})
    # The GPU runs something all through [0, 41): kernels [0,25), collectives [5,14) [24,30) [40,41), the copy
    # [30,40): no idle time; moving the copy to [33,38) opens two gaps.
    assert s["gpu_idle"] == pytest.approx(0)
    rows[-1]["start"], rows[-1]["end"] = 33, 38
    (tmp_path / "moved").mkdir()
    with TraceReader(write(tmp_path / "moved", {0: rows})) as r:
        s = summarize(r)["ranks"][0]
    assert s["gpu_idle"] == pytest.approx(3 + 2)          # [30,33) and [38,40)


def test_summary_against_brute_force_on_random_timelines(tmp_path):
    rng = np.random.default_rng(1)
    kinds = [OpKind.KERNEL, OpKind.MEMCPY, OpKind.COLLECTIVE, OpKind.SEND, OpKind.RECV, OpKind.ALLOC,
             OpKind.FREE, OpKind.EVENT_RECORD, OpKind.ITER_MARK]
    rows_by_rank = {}
    for rank in (0, 3):
        n = 400
        rows = S.empty_ops(n)
        rows["kind"] = rng.choice([int(k) for k in kinds], n)
        rows["stream"] = rng.integers(0, 3, n)
        rows["start"] = rng.integers(0, 2000, n)
        rows["end"] = rows["start"] + rng.integers(0, 30, n)
        rows["issue"] = np.sort(rng.integers(0, 2000, n))
        rows["duration"] = rows["end"] - rows["start"]
        rows["name"] = rng.integers(1, 4, n)
        alloc = rows["kind"] == int(OpKind.ALLOC)
        rows["mem_delta"] = np.where(alloc, rng.integers(1, 1000, n), 0)
        rows["mem_delta"] -= np.where(rows["kind"] == int(OpKind.FREE), rng.integers(1, 1000, n), 0)
        rows_by_rank[rank] = rows
    with TraceReader(write(tmp_path, rows_by_rank)) as r:
        summary = summarize(r, top=3)
        names = r.names
    assert [e["rank"] for e in summary["ranks"]] == [0, 3]
    for entry in summary["ranks"]:
        rows = rows_by_rank[entry["rank"]]
        spans = defaultdict(list)
        for row in rows:
            spans[OpKind(row["kind"])].append((row["start"], row["end"]))
            if row["kind"] in [int(k) for k in S.GPU_KINDS]:
                spans[("stream", int(row["stream"]))].append((row["start"], row["end"]))
        compute = covered_cells(spans[OpKind.KERNEL])
        comm = covered_cells(spans[OpKind.COLLECTIVE] + spans[OpKind.SEND] + spans[OpKind.RECV])
        gpu = compute | comm | covered_cells(spans[OpKind.MEMCPY])
        totals = entry["totals"]
        first, last = int(rows["issue"].min()), int(max(rows["end"].max(), rows["issue"].max()))
        assert totals["gpu_idle"] == len(set(range(first, last)) - gpu)
        assert totals["compute"] == len(compute)
        assert totals["communication"] == len(comm)
        assert totals["exposed_communication"] == len(comm - compute)
        # the headline figures: those of the median iteration, the cells between the two consecutive marks that
        # are as many as the median length (the shorter middle one with an even count, the first of equal ones)
        ends = [int(row["end"]) for row in rows if row["kind"] == int(OpKind.ITER_MARK)]
        its = [(b - a, i, a, b) for i, (a, b) in enumerate(zip(ends, ends[1:])) if b > a]
        if its:
            _, _, a, b = sorted(its)[(len(its) - 1) // 2]
            window = set(range(a, b))
            assert entry["time_basis"] == "per iteration"
            assert entry["compute"] == pytest.approx(len(compute & window))
            assert entry["communication"] == pytest.approx(len(comm & window))
            assert entry["exposed_communication"] == pytest.approx(len((comm - compute) & window))
            assert entry["gpu_idle"] == pytest.approx(len(window - gpu))
            steps = [b2 - a2 for a2, b2 in zip(ends, ends[1:])]
            assert entry["median_iteration"] == pytest.approx(float(np.median(steps)))
            shares = [len(set(range(a, b)) - gpu) / (b - a) for a, b in zip(ends, ends[1:]) if b > a]
            assert entry["idle_share"] == pytest.approx(float(np.median(shares)))
        else:
            assert entry["time_basis"] == "whole trace" and entry["compute"] == len(compute)
        for stream, busy in entry["stream_busy"].items():
            assert busy == len(covered_cells(spans[("stream", stream)]))

        assert entry["ops_by_kind"] == {OpKind(k).name: c for k, c in Counter(rows["kind"].tolist()).items()}
        level, peak = 0, 0
        for d in rows["mem_delta"].tolist():
            level += d
            peak = max(peak, level)
        assert entry["peak_memory"] == peak and entry["final_memory"] == level

        marks = [float(row["end"]) for row in rows if row["kind"] == int(OpKind.ITER_MARK)]   # documented: end
        assert entry["iterations"] == marks
        assert entry["iteration_times"] == pytest.approx([b - a for a, b in zip(marks, marks[1:])])

        totals, counts = defaultdict(float), Counter()
        for row in rows[rows["kind"] == int(OpKind.KERNEL)]:
            totals[names[row["name"]]] += row["duration"]
            counts[names[row["name"]]] += 1
        expected = sorted(totals, key=lambda k: -totals[k])[:3]
        assert [k["name"] for k in entry["top_kernels"]] == expected
        assert [k["count"] for k in entry["top_kernels"]] == [counts[k] for k in expected]
        assert [k["total"] for k in entry["top_kernels"]] == pytest.approx([totals[k] for k in expected])

    overall = defaultdict(float)
    for rows in rows_by_rank.values():
        for row in rows[rows["kind"] == int(OpKind.KERNEL)]:
            overall[names[row["name"]]] += row["duration"]
    assert [k["total"] for k in summary["top_kernels"]] == pytest.approx(sorted(overall.values(), reverse=True))


def test_iteration_marks_of_the_writer_take_precedence(tmp_path):
    rows = ops_from([(OpKind.ITER_MARK, 0, 1.0, 1.0), (OpKind.ITER_MARK, 0, 4.0, 4.0)])
    with TraceReader(write(tmp_path, {0: rows}, marks={0: [0.5, 2.0, 3.5]})) as r:
        s = summarize(r)["ranks"][0]
    assert s["iteration_times"] == pytest.approx([1.5, 1.5]) and s["mean_iteration"] == pytest.approx(1.5)


def test_format_summary_reports_ranks_kernels_and_incompleteness(tmp_path):
    rows = ops_from([(OpKind.KERNEL, 0, 0, 3), (OpKind.KERNEL, 0, 3, 4), (OpKind.COLLECTIVE, 1, 0, 2)])
    rows["name"] = [1, 2, 0]
    path = tmp_path / "t.h5"
    w = TraceWriter(path, {"ranks": [0, 5], "gpu": "h100-sxm", "world_size": 8})
    for name in ("gemm", "softmax"):
        w.add_string(name)
    w.append_ops(0, rows)
    w.flush()                                   # never closed: an incomplete trace
    with TraceReader(w.written_path) as r:
        text = format_summary(summarize(r))
    w.close()
    lines = text.splitlines()
    assert "INCOMPLETE" in lines[0] and any("incomplete trace" in line for line in lines)
    assert "h100-sxm" in text
    rank_lines = [line for line in lines if line.split() and line.split()[0] in ("0", "5")]
    assert [line.split()[0] for line in rank_lines] == ["0", "5"]
    assert rank_lines[0].split()[1] == "3"      # three ops on rank 0
    kernel_lines = lines[lines.index("top kernels (all simulated ranks)") + 3:]
    assert [line.split()[0] for line in kernel_lines] == ["gemm", "softmax"]   # 3 s before 1 s
