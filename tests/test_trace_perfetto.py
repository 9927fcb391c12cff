"""Perfetto / Chrome trace-event JSON export: the shape the importers need, and the trace's facts carried over.

The structural rules checked follow the Trace Event Format (phases X, i, C, M, s/f; ts and dur in microseconds;
process_name / thread_name metadata; flow events "s" and "f" sharing cat, name and id, "bp":"e" binding the end to
the enclosing slice) and what Perfetto's JSON tokenizer accepts (top-level keys traceEvents, displayTimeUnit,
otherData; "ts" before any nested value of an event; no \\u escapes in strings).
"""

from __future__ import annotations

import gzip
import json
import math
from collections import Counter, defaultdict
from decimal import Decimal

import numpy as np
import pytest

from phantora.engine.ops import CostSource, Memcpy, OpKind
from phantora.trace import schema as S
from phantora.trace.perfetto import export_perfetto
from phantora.trace.reader import TraceReader
from phantora.trace.writer import TraceWriter

ODD_NAME = 'naïve "quoted" \\ kernel ✓'


def build_trace(path, seed=0):
    """Three ranks: kernels back to back, a copy, one all_reduce on all ranks, a send/recv pair issued together
    (overlapping on one stream), a host sync, iteration marks and allocations."""
    rng = np.random.default_rng(seed)
    rows_by_rank = {}
    with TraceWriter(path, {"ranks": [0, 1, 2], "gpu": "h100-sxm", "world_size": 3}) as w:
        gemm, odd = w.add_string("gemm"), w.add_string(ODD_NAME)
        sig = w.add_signature('["aten.mm.default",[[64,64],[64,64]],["bfloat16","bfloat16"],[],[]]')
        w.add_group(0, [0, 1, 2], "world")
        colls = S.empty_collectives(2)
        colls["id"] = [7, 8]
        colls["name"] = [w.add_string("all_reduce"), w.add_string("send_recv")]
        colls["algo"] = w.add_string("ring")
        colls["proto"] = w.add_string("Simple")
        colls["ranks_arrived"] = [3, 2]
        w.append_collectives(colls)
        for rank in (0, 1, 2):
            spec = []
            t = 1e-3 + rank * 3.3e-7
            for i in range(40):                               # kernels that touch: end(i) == start(i+1)
                d = float(rng.exponential(7.7e-6))
                spec.append(dict(kind=OpKind.KERNEL, stream=0, name=gemm if i % 3 else odd, sig=sig, start=t,
                                 end=t + d, flops=2.0 * 64 ** 3, nbytes=3 * 64 * 64 * 2, source=CostSource.ROOFLINE))
                t += d
            spec.append(dict(kind=OpKind.MEMCPY, stream=0, arg=int(Memcpy.H2D), start=t, end=t + 2e-6, nbytes=4096))
            spec.append(dict(kind=OpKind.COLLECTIVE, stream=1, group=0, start=2e-3 + rank * 1e-5, end=2.5e-3,
                             coll=0, nbytes=1 << 20, source=CostSource.NETWORK))
            spec.append(dict(kind=OpKind.GROUP_START, start=2.6e-3, end=2.6e-3))
            if rank in (0, 1):
                kinds = (OpKind.SEND, OpKind.RECV) if rank == 0 else (OpKind.RECV, OpKind.SEND)
                for k in kinds:                                 # together on one stream: must not share a thread
                    spec.append(dict(kind=k, stream=1, group=0, arg=1 - rank, start=2.6e-3, end=2.7e-3,
                                     coll=1 if k == (OpKind.SEND if rank == 0 else OpKind.RECV) else -1,
                                     nbytes=1 << 16))
            spec.append(dict(kind=OpKind.GROUP_END, start=2.6e-3, end=2.6e-3))
            spec.append(dict(kind=OpKind.EVENT_RECORD, stream=1, arg=3, start=2.7e-3, end=2.7e-3))
            spec.append(dict(kind=OpKind.STREAM_WAIT, stream=0, arg=3, start=2.7e-3, end=2.7e-3))
            spec.append(dict(kind=OpKind.ALLOC, arg=1, nbytes=1000, mem_delta=1000, start=2.8e-3, end=2.8e-3))
            spec.append(dict(kind=OpKind.FREE, arg=1, mem_delta=-400, start=2.9e-3, end=2.9e-3))
            # the host issues the mark ahead of the GPU, whose work ends later; then a host sync
            spec.append(dict(kind=OpKind.ITER_MARK, issue=2.95e-3, start=2.95e-3, end=3.1e-3))
            spec.append(dict(kind=OpKind.SYNC_DEVICE, issue=3e-3, start=3e-3, end=3.2e-3))
            rows = S.empty_ops(len(spec))
            for i, d in enumerate(spec):
                d = dict(d)
                d.setdefault("issue", d["start"] - 5e-6)
                d["kind"] = int(d["kind"])
                d["source"] = int(d.get("source", CostSource.NONE))
                d["duration"] = d["end"] - d["start"]
                for k, v in d.items():
                    rows[i][k] = v
            w.append_ops(rank, rows)
            rows_by_rank[rank] = rows
    return rows_by_rank


def load(path):
    """The JSON with every number kept as its exact decimal text, and key order recorded."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        text = f.read()
    assert "\\u" not in text                   # Perfetto's tokenizer does not take \u escapes
    return json.loads(text, parse_float=Decimal, object_pairs_hook=lambda pairs: dict(pairs) | {"__keys": [
        k for k, _ in pairs]})


def ns(value) -> int:
    """Nanoseconds as Perfetto's importer computes them from a microsecond number, both ways it does: "dur" as a
    double times 1000, truncated; "ts" as its integer part times 1000 plus its fraction (a double) times 1000,
    truncated. The two must agree."""
    text = str(value)
    as_double = int(float(text) * 1000)
    whole, _, fraction = text.partition(".")
    split = int(whole or 0) * 1000 + int(float("0." + (fraction or "0")) * 1000)
    assert as_double == split, text
    return as_double


def no_lists(value) -> bool:
    if isinstance(value, list):
        return False
    if isinstance(value, dict):
        return all(no_lists(v) for k, v in value.items() if k != "__keys")
    return True


def check_structure(doc):
    """The requirements of the trace-event importers, event by event."""
    assert set(k for k in doc if k != "__keys") <= {"traceEvents", "displayTimeUnit", "otherData"}
    assert doc["displayTimeUnit"] in ("ms", "ns")
    assert all(isinstance(v, str) for k, v in doc["otherData"].items() if k != "__keys")
    events = doc["traceEvents"]
    assert isinstance(events, list) and events
    for ev in events:
        keys = ev["__keys"]
        assert isinstance(ev["name"], str) and ev["name"]
        assert ev["ph"] in ("X", "M", "i", "C", "s", "f")
        assert isinstance(ev["pid"], int) and isinstance(ev["tid"], int)
        assert "ts" in ev and isinstance(ev["ts"], (int, Decimal))
        assert all(not isinstance(ev[k], (dict, list)) for k in keys[:keys.index("ts")])
        assert no_lists(ev)
        if ev["ph"] == "X":
            assert isinstance(ev["dur"], Decimal) and ev["dur"] >= 0
        if ev["ph"] == "i":
            assert ev["s"] in ("t", "p", "g")
        if ev["ph"] == "C":
            assert all(isinstance(v, (int, Decimal)) for k, v in ev["args"].items() if k != "__keys")
        if ev["ph"] == "M":
            assert ev["name"] in ("process_name", "thread_name", "process_sort_index", "thread_sort_index")
        if ev["ph"] in ("s", "f"):
            assert isinstance(ev["id"], int) and isinstance(ev["cat"], str)
    return events


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    d = tmp_path_factory.mktemp("perfetto")
    rows = build_trace(d / "t.h5")
    with TraceReader(d / "t.h5") as r:
        stats = export_perfetto(r, d / "t.json")
        stats_gz = export_perfetto(r, d / "t.json.gz", cpu=False, memory=False)
    return rows, load(d / "t.json"), stats, load(d / "t.json.gz"), stats_gz


def test_structure_follows_the_trace_event_format(exported):
    rows, doc, stats, doc_gz, stats_gz = exported
    events = check_structure(doc)
    check_structure(doc_gz)
    assert stats["events"] == len(events) and stats_gz["events"] == len(doc_gz["traceEvents"])
    assert stats["slices"] == sum(e["ph"] == "X" for e in events)


def test_processes_threads_and_slices_match_the_trace(exported):
    rows, doc, *_ = exported
    events = doc["traceEvents"]
    process_names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert process_names == {r: f"rank {r}" for r in rows}
    thread_names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    gpu = [int(k) for k in S.GPU_KINDS]
    for rank, table in rows.items():
        slices = [e for e in events if e["ph"] == "X" and e["pid"] == rank and e["cat"] != "sync"]
        expected = [i for i, k in enumerate(table["kind"].tolist()) if k in gpu]
        assert sorted(e["args"]["op"] for e in slices) == expected
        for e in slices:
            row = table[e["args"]["op"]]
            assert ns(e["ts"]) == round(float(row["start"]) * 1e9)
            assert ns(e["ts"]) + ns(e["dur"]) == round(float(row["end"]) * 1e9)
            assert e["args"]["bytes"] == int(row["nbytes"]) and e["args"]["flops"] == row["flops"]
            assert e["args"]["source"] == CostSource(int(row["source"])).name
            assert thread_names[(rank, e["tid"])].startswith(f"stream {int(row['stream'])}")
        kernels = [e for e in slices if e["cat"] == "kernel"]
        assert Counter(e["name"] for e in kernels) == Counter({"gemm": 26, ODD_NAME: 14})
        assert all(json.loads(e["args"]["signature"])[0] == "aten.mm.default" for e in kernels)
        assert [e["name"] for e in slices if e["cat"] == "memcpy"] == ["memcpy H2D"]
        assert [e["name"] for e in slices if e["cat"] == "collective"] == ["all_reduce"]


def test_slices_of_a_thread_never_overlap(exported):
    """Perfetto nests the slices of one thread; ops that overlap on a stream must go to separate threads."""
    rows, doc, *_ = exported
    by_thread = defaultdict(list)
    for e in doc["traceEvents"]:
        if e["ph"] == "X":
            by_thread[(e["pid"], e["tid"])].append((ns(e["ts"]), ns(e["ts"]) + ns(e["dur"])))
    for spans in by_thread.values():
        spans.sort()
        assert all(b[0] >= a[1] for a, b in zip(spans, spans[1:]))
    # The send and the receive that rank 0 issued together sit on two threads of stream 1.
    p2p = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] == "p2p" and e["pid"] == 0]
    assert len(p2p) == 2 and p2p[0]["tid"] != p2p[1]["tid"]


def test_flows_chain_the_parts_of_each_collective(exported):
    rows, doc, stats, *_ = exported
    events = doc["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    flows = defaultdict(dict)
    for e in events:
        if e["ph"] in ("s", "f"):
            assert e["ph"] not in flows[e["id"]]
            flows[e["id"]][e["ph"]] = e
    assert stats["flows"] == len(flows)
    flows = {i: pair for i, pair in flows.items() if pair["s"]["cat"] == "collective"}

    def enclosing(ev):
        t = ns(ev["ts"])
        found = [s for s in slices if s["pid"] == ev["pid"] and s["tid"] == ev["tid"]
                 and ns(s["ts"]) <= t <= ns(s["ts"]) + ns(s["dur"])]
        assert len(found) == 1
        return found[0]

    links = defaultdict(list)
    for pair in flows.values():
        s, f = pair["s"], pair["f"]
        assert f["bp"] == "e" and s["cat"] == f["cat"] and s["name"] == f["name"]
        assert ns(s["ts"]) <= ns(f["ts"])
        a, b = enclosing(s), enclosing(f)
        assert a["args"]["coll"] == b["args"]["coll"] and a["pid"] != b["pid"]
        links[a["args"]["coll"]].append((a["pid"], b["pid"]))
    # Expected from the trace itself: every op row naming collective c is one part; parts form one chain.
    parts = defaultdict(set)
    for rank, table in rows.items():
        for c in table["coll"][table["coll"] >= 0].tolist():
            parts[c].add(rank)
    assert set(links) == {c for c, members in parts.items() if len(members) > 1}
    for c, edges in links.items():
        assert len(edges) == len(parts[c]) - 1
        assert {p for e in edges for p in e} == parts[c]


def test_cpu_thread_and_memory_counter(exported):
    rows, doc, _, doc_gz, _ = exported
    events = doc["traceEvents"]
    for rank, table in rows.items():
        mine = [e for e in events if e["pid"] == rank]
        sync = [e for e in mine if e["cat" if "cat" in e else "name"] == "sync"]
        row = table[table["kind"] == int(OpKind.SYNC_DEVICE)][0]
        assert len(sync) == 1 and ns(sync[0]["ts"]) == round(row["issue"] * 1e9)
        assert ns(sync[0]["dur"]) == round(row["end"] * 1e9) - round(row["issue"] * 1e9)
        launches = [e for e in mine if e.get("cat") == "launch"]
        assert len(launches) == int(np.isin(table["kind"], [int(k) for k in S.GPU_KINDS]).sum())
        marks = [e for e in mine if e.get("cat") == "iteration"]
        mark = table[table["kind"] == int(OpKind.ITER_MARK)][0]
        # at the iteration's end, the GPU's completion (what inspect and replay time), not the host's issue
        assert len(marks) == 1 and ns(marks[0]["ts"]) == round(mark["end"] * 1e9)
        memory = [e["args"]["allocated_bytes"] for e in mine if e["ph"] == "C"]
        assert memory == np.cumsum(table["mem_delta"][table["mem_delta"] != 0]).tolist()
    assert not any(e["ph"] in ("C", "i") or e.get("cat") == "sync" for e in doc_gz["traceEvents"])


def test_export_of_a_subset_of_ranks(tmp_path):
    build_trace(tmp_path / "t.h5")
    with TraceReader(tmp_path / "t.h5") as r:
        stats = export_perfetto(r, tmp_path / "sub.json", ranks=[2], signatures=False)
    doc = load(tmp_path / "sub.json")
    check_structure(doc)
    assert stats["flows"] == 0 and {e["pid"] for e in doc["traceEvents"]} == {2}
    assert not any("signature" in e.get("args", {}) for e in doc["traceEvents"])


def test_non_finite_flops_stay_valid_json(tmp_path):
    rows = S.empty_ops(2)
    rows["kind"] = int(OpKind.KERNEL)
    rows["flops"] = [math.inf, 1.5]
    rows["end"] = [1e-6, 2e-6]
    rows["start"] = [0, 1e-6]
    with TraceWriter(tmp_path / "t.h5", {}) as w:
        w.append_ops(0, rows)
    with TraceReader(tmp_path / "t.h5") as r:
        export_perfetto(r, tmp_path / "t.json")
    events = json.loads((tmp_path / "t.json").read_text())["traceEvents"]   # strict: no NaN/Infinity tokens
    assert [e["args"]["flops"] for e in events if e["ph"] == "X"] == ["inf", 1.5]
