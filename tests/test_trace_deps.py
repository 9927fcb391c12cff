"""The cross-stream dependencies table: filled by the recorder, checked against the timeline's physics (a wait
cannot resume before the event it waits for was recorded), independent of how often the run flushed, used by
`phantora inspect`, replay and the Perfetto export."""

from __future__ import annotations

import json
from collections import defaultdict
from decimal import Decimal

import h5py
import numpy as np
import pytest

from phantora.cluster import load_cluster
from phantora.engine.core import Engine
from phantora.engine.ops import Op, OpKind as K
from phantora.engine.recorder import Recorder
from phantora.errors import TraceError
from phantora.replay import replay
from phantora.simulate import simulate_streams
from phantora.synthetic import SyntheticModel, fsdp_streams
from phantora.trace import schema as S
from phantora.trace.deps import check_dependencies, dependencies_of
from phantora.trace.perfetto import export_perfetto
from phantora.trace.reader import TraceReader
from phantora.trace.summary import summarize
from phantora.trace.writer import TraceWriter

GPU = (int(K.KERNEL), int(K.MEMCPY), int(K.COLLECTIVE), int(K.SEND), int(K.RECV))


@pytest.fixture(scope="module", params=[1, 2], ids=["1node", "2nodes-representative"])
def fsdp(request, tmp_path_factory):
    """A synthetic FSDP run; on two nodes only node 0 is simulated and node 1 mirrors it."""
    nodes = request.param
    spec = load_cluster("h100-hgx", nodes=nodes)
    simulated = list(range(8))
    rank_map = [r % 8 for r in range(spec.world_size)]
    streams, sigs, meta = fsdp_streams(spec, SyntheticModel(layers=3, seq=512), iterations=2, ranks=simulated)
    path = tmp_path_factory.mktemp("deps") / "fsdp.h5"
    simulate_streams(spec, streams, path, signatures=sigs, meta=meta, rank_map=rank_map)
    with TraceReader(path) as r:
        return path, {rank: r.ops(rank) for rank in r.ranks}, r.dependencies


def test_every_wait_on_a_recorded_event_has_its_dependency(fsdp):
    _, ops, deps = fsdp
    assert len(deps)
    for rank, rows in ops.items():
        mine = deps[deps["rank"] == rank]
        # independent derivation from the op rows alone (latest record of the event id before the wait)
        expected = dependencies_of(rank, rows)
        assert np.array_equal(np.sort(mine, order=["dst"]), np.sort(expected, order=["dst"]))
        # the synthetic FSDP step waits on every event it records: one row per STREAM_WAIT
        assert len(mine) == int((rows["kind"] == int(K.STREAM_WAIT)).sum())


def test_dependencies_obey_the_physics_of_the_timeline(fsdp):
    _, ops, deps = fsdp
    for d in deps:
        rows = ops[int(d["rank"])]
        rec, wait = rows[int(d["src"])], rows[int(d["dst"])]
        assert rec["kind"] == int(K.EVENT_RECORD) and wait["kind"] == int(K.STREAM_WAIT)
        assert rec["arg"] == wait["arg"] and d["src"] < d["dst"]
        assert rec["end"] <= wait["start"]                 # the stream resumes only once the event was recorded
        # and the record itself happens after the work queued before it on its stream
        before = rows[:int(d["src"])]
        same = before[(before["stream"] == rec["stream"]) & np.isin(before["kind"], GPU)]
        assert not len(same) or same["end"].max() <= rec["start"]
    assert check_dependencies(deps, ops) == (0, [])


def _run(spec, streams, flush_every: int | None, path):
    """Feed the streams in slices of `flush_every` ops per rank, flushing the recorder after each (as a live run
    does), or all at once."""
    writer = TraceWriter(path, {"ranks": sorted(streams), "world_size": spec.world_size})
    rec = Recorder(writer)
    eng = Engine(spec, simulated=sorted(streams), sink=rec)
    rec.attach(eng)
    step = flush_every or max(len(s) for s in streams.values())
    longest = max(len(s) for s in streams.values())
    for lo in range(0, longest, step):
        for r, ops in streams.items():
            eng.feed(r, ops[lo:lo + step])
            if lo + step >= len(ops):
                eng.close(r)
        eng.run()
        rec.flush()
    writer.close()
    with TraceReader(path) as r:
        return r.dependencies, {rank: (r.ops(rank), r.names) for rank in r.ranks}


def test_incremental_flushes_give_the_same_table(tmp_path):
    spec = load_cluster("h100-hgx")
    streams, _, _ = fsdp_streams(spec, SyntheticModel(layers=2, seq=256), iterations=2)
    once, ops_once = _run(spec, streams, None, tmp_path / "once.h5")
    often, ops_often = _run(spec, streams, 7, tmp_path / "often.h5")
    assert len(once) and np.array_equal(np.sort(once, order=["rank", "dst"]), np.sort(often, order=["rank", "dst"]))
    for r, (a, names_a) in ops_once.items():
        b, names_b = ops_often[r]
        other = [c for c in S.OP_DTYPE.names if c != "name"]    # string ids depend on the order names were met
        assert np.array_equal(a[other], b[other])
        assert [names_a[i] for i in a["name"]] == [names_b[i] for i in b["name"]]


def test_host_syncs_on_events_and_reused_event_ids(tmp_path):
    """A SYNC_EVENT depends on the record it waits for; an event id recorded twice links each wait to the latest
    record before it; a wait on an event never recorded has no dependency. (Kernels of the two streams side by side
    at full speed: the order alone.)"""
    spec = load_cluster("h100-hgx", overrides=tuple(f"streams.{k}=1" for k in (
        "compute_beside_compute", "compute_beside_memory", "memory_beside_compute", "memory_beside_memory")))
    ops = [Op(K.KERNEL, stream=1, duration=3e-3), Op(K.EVENT_RECORD, stream=1, arg=5),        # 0, 1
           Op(K.STREAM_WAIT, stream=0, arg=5), Op(K.KERNEL, stream=0, duration=1e-3),       # 2, 3
           Op(K.KERNEL, stream=1, duration=2e-3), Op(K.EVENT_RECORD, stream=1, arg=5),      # 4, 5
           Op(K.SYNC_EVENT, arg=5), Op(K.STREAM_WAIT, stream=0, arg=99),                     # 6, 7
           Op(K.SYNC_DEVICE)]
    path = tmp_path / "t.h5"
    simulate_streams(spec, {0: ops}, path, meta={"command": ["test"]})
    with TraceReader(path) as r:
        deps, rows = r.dependencies, r.ops(0)
    assert [(int(d["src"]), int(d["dst"])) for d in deps] == [(1, 2), (5, 6)]
    assert rows[1]["end"] <= rows[2]["start"]
    assert rows[5]["end"] <= rows[6]["end"]                # the host resumes once the second record happened
    assert rows[6]["end"] == pytest.approx(3e-3 + 2e-3, abs=1e-4)   # both stream-1 kernels, back to back
    assert check_dependencies(deps, {0: rows}) == (0, [])


def _corrupt(path, src_value):
    with h5py.File(path, "r+") as f:
        ds = f[S.DEPENDENCIES]
        d = ds[()]
        d["src"][0] = src_value
        ds[...] = d


def test_inconsistent_tables_are_reported(fsdp, tmp_path):
    path, ops, deps = fsdp
    bad = tmp_path / "bad.h5"
    bad.write_bytes(path.read_bytes())
    first = deps[0]
    rows = ops[int(first["rank"])]
    kernel = int(np.flatnonzero(rows["kind"] == int(K.KERNEL))[0])
    _corrupt(bad, kernel)                                   # points a dependency at a kernel
    with TraceReader(bad) as r:
        s = summarize(r)
    assert s["dependency_problems"] >= 1 and "not an EVENT_RECORD" in " ".join(s["dependency_messages"])
    with pytest.raises(TraceError, match="dependencies table contradicts"):
        replay(bad)
    # physics alone: a wait moved before its record's end
    late = {r: t.copy() for r, t in ops.items()}
    late_rows = late[int(first["rank"])]
    late_rows["start"][int(first["dst"])] = late_rows["end"][int(first["src"])] - 1e-6
    n, messages = check_dependencies(deps, late)
    assert n == 1 and "before the event" in messages[0]


def test_perfetto_draws_each_dependency_forward_in_time(fsdp, tmp_path):
    path, ops, deps = fsdp
    out = tmp_path / "t.json"
    with TraceReader(path) as r:
        stats = export_perfetto(r, out)
    events = json.loads(out.read_text())["traceEvents"]
    slices = defaultdict(list)
    names = {}
    for e in events:
        if e["ph"] == "X":
            slices[(e["pid"], e["tid"])].append(e)
        if e["ph"] == "M" and e["name"] == "thread_name":
            names[(e["pid"], e["tid"])] = e["args"]["name"]
    pairs = defaultdict(dict)
    for e in events:
        if e["ph"] in ("s", "f") and e["cat"] == "dependency":
            pairs[e["id"]][e["ph"]] = e

    def ns(ts):   # the exporter writes integer nanoseconds as microseconds with a trailing 5 (perfetto.us)
        return int(Decimal(str(ts)) * 1000)

    def enclosing(ev):
        t = ns(ev["ts"])
        found = [s for s in slices[(ev["pid"], ev["tid"])] if ns(s["ts"]) <= t <= ns(s["ts"]) + ns(s["dur"])]
        assert len(found) == 1
        return found[0]

    # expected from the rows: a dependency is drawn when its record stream ran a GPU op before the record and its
    # waiting stream runs one after the wait
    expected = 0
    for d in deps:
        rows = ops[int(d["rank"])]
        src, dst = int(d["src"]), int(d["dst"])
        gpu = np.isin(rows["kind"], GPU)
        before = gpu[:src] & (rows["stream"][:src] == rows["stream"][src])
        after = gpu[dst + 1:] & (rows["stream"][dst + 1:] == rows["stream"][dst])
        expected += bool(before.any() and after.any())
    assert expected and stats["dependency_flows"] == len(pairs) == expected
    for pair in pairs.values():
        s, f = pair["s"], pair["f"]
        assert s["pid"] == f["pid"] and f["bp"] == "e" and ns(s["ts"]) <= ns(f["ts"])
        a, b = enclosing(s), enclosing(f)
        assert names[(s["pid"], s["tid"])] != names[(f["pid"], f["tid"])]   # across streams
        assert ns(a["ts"]) + ns(a["dur"]) <= ns(b["ts"])                   # producer ends before consumer starts
