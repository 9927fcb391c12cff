"""HDF5 trace: round trip of every table, Op objects rebuilt for replay, killed runs, and broken files."""

from __future__ import annotations

import inspect
import json
import os
import shutil
import signal
import subprocess
import sys
import zlib
from pathlib import Path

import h5py
import numpy as np
import pytest

from phantora.costmodel.signature import Signature
from phantora.engine.ops import CostSource, Op, OpKind
from phantora.errors import PhantoraError, TraceError
from phantora.trace import reader as reader_module
from phantora.trace import schema as S
from phantora.trace.reader import TraceReader, partial_traces
from phantora.trace.writer import TraceWriter

REPO = Path(__file__).resolve().parents[1]


def make_rows(seed: int, n: int, n_names: int = 20, n_sigs: int = 50) -> np.ndarray:
    """`n` op rows with every column drawn at random (valid kinds, sources and indices)."""
    rng = np.random.default_rng(seed)
    rows = np.zeros(n, S.OP_DTYPE)
    rows["kind"] = rng.choice([int(k) for k in OpKind], n)
    rows["stream"] = rng.integers(0, 4, n)
    rows["name"] = rng.integers(0, n_names, n)
    rows["sig"] = rng.integers(-1, n_sigs, n)
    rows["issue"] = np.cumsum(rng.exponential(1e-5, n))
    rows["start"] = rows["issue"] + rng.exponential(1e-5, n)
    rows["duration"] = rng.exponential(1e-5, n)
    rows["end"] = rows["start"] + rows["duration"]
    rows["cpu_delta"] = rng.exponential(1e-6, n)
    rows["flops"] = rng.integers(0, 2 ** 40, n) * 1.0
    rows["nbytes"] = rng.integers(0, 2 ** 40, n)
    rows["mem_delta"] = rng.integers(-2 ** 30, 2 ** 30, n)
    rows["source"] = rng.choice([int(s) for s in CostSource], n)
    rows["group"] = rng.integers(-1, 4, n)
    rows["arg"] = rng.integers(-1, 2 ** 40, n)
    rows["coll"] = rng.integers(-1, 100, n)
    for col in S.OPTIONAL_OP_COLUMNS:
        rows[col] = rng.integers(0, 2 ** 20, n)
    return rows


def make_collectives(seed: int, n: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    rows = np.zeros(n, S.COLL_DTYPE)
    rows["id"] = np.arange(n)
    rows["name"] = rng.integers(0, 5, n)
    rows["group"] = rng.integers(0, 4, n)
    rows["nbytes"] = rng.integers(0, 2 ** 34, n)
    rows["root"] = rng.integers(-1, 8, n)
    rows["algo"] = rng.integers(0, 5, n)
    rows["proto"] = rng.integers(0, 5, n)
    rows["start"] = rng.random(n)
    rows["end"] = rows["start"] + rng.random(n)
    rows["ranks_arrived"] = rng.integers(1, 9, n)
    return rows


def make_dependencies(seed: int, n: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    rows = np.zeros(n, S.DEP_DTYPE)
    rows["rank"] = rng.integers(0, 2, n)
    rows["src"] = rng.integers(0, 1000, n)
    rows["dst"] = rows["src"] + rng.integers(1, 100, n)
    return rows


META = {"command": ["python", "train.py", "--steps", "3"], "cluster": {"nodes": 2, "gpus_per_node": 8,
        "links": {"nvlink": "900GB/s"}}, "gpu": "h100-sxm", "world_size": 16, "ranks": [0, 8],
        "rank_map": [0] * 8 + [8] * 8, "mode": "live"}


@pytest.fixture(params=["gzip", None], ids=["gzip", "raw"])
def compression(request):
    return request.param


def test_round_trip_of_every_table(tmp_path, compression):
    path = tmp_path / "t.h5"
    rows = {0: make_rows(1, 1000), 8: make_rows(2, 777)}
    colls = make_collectives(3, 300)
    deps = make_dependencies(4, 50)
    names = [f"kernel_{i}" for i in range(20)]
    sig_keys = [Signature("aten.mm.default", ((i, 64), (64, 32)), ("bfloat16", "bfloat16")).key() for i in range(50)]
    cuts = [0, 1, 63, 64, 65, 400, 1000]   # batches straddling chunk edges (chunk_rows=64)
    with TraceWriter(path, META, compression=compression, chunk_rows=64) as w:
        assert [w.add_string(n) for n in names[1:]] == list(range(1, 20))   # "" is string 0
        assert [w.add_signature(k) for k in sig_keys] == list(range(50))
        w.add_group(0, range(16), "world")
        w.add_group(3, [8, 0])
        for a, b in zip(cuts, cuts[1:]):
            for r, table in rows.items():
                w.append_ops(r, table[a * len(table) // 1000:b * len(table) // 1000])
            w.append_collectives(colls[a * 300 // 1000:b * 300 // 1000])
            w.mark_iteration(0, float(b))
            w.flush()
        w.append_dependencies(deps)
    with TraceReader(path) as r:
        assert r.complete and r.warning is None and r.error is None
        assert r.version == S.FORMAT_VERSION
        assert r.ranks == [0, 8]
        for rank, table in rows.items():
            got = r.ops(rank)
            assert got.dtype == S.OP_DTYPE and np.array_equal(got, table)
        assert r.names == [""] + names[1:] + ["world"]
        assert r.signatures == sig_keys
        assert r.groups == {0: ("world", list(range(16))), 3: ("", [8, 0])}
        assert np.array_equal(r.collectives, colls)
        assert np.array_equal(r.dependencies, deps)
        assert r.iterations(0).tolist() == [float(b) for b in cuts[1:]]
        expected_meta = json.loads(json.dumps(META))
        assert {k: r.meta[k] for k in expected_meta} == expected_meta
        assert r.meta["versions"]["python"].count(".") == 2 and "created" in r.meta


def test_closed_trace_reads_with_plain_h5py(tmp_path):
    """The file needs nothing but HDF5's standard filters: h5py alone reads every table and the metadata."""
    path = tmp_path / "t.h5"
    rows = make_rows(5, 5000)
    with TraceWriter(path, META, chunk_rows=1024) as w:
        w.append_ops(0, rows[:3000])
        w.flush()
        w.append_ops(0, rows[3000:])
    with h5py.File(path, "r") as f:
        assert f.attrs["format"] == S.FORMAT_NAME and int(f.attrs["version"]) == S.FORMAT_VERSION
        assert bool(f.attrs["complete"])
        assert json.loads(f["meta"][()])["gpu"] == META["gpu"]
        assert np.array_equal(f["ranks/0/ops"][:], rows)
        ds = f["ranks/0/ops"]
        # Every chunk went through the whole filter pipeline (mask 0).
        assert [ds.id.get_chunk_info(i).filter_mask for i in range(ds.id.get_num_chunks())] == [0] * 5


def test_signature_keys_round_trip(tmp_path):
    sigs = [Signature("aten.mm.default", ((128, 256), (256, 64)), ("float16", "float16"), ((256, 1), (64, 1))),
            Signature("aten._scaled_dot_product_flash_attention.default", ((2, 8, 128, 64),) * 3,
                      ("bfloat16",) * 3, scalars=(0.0, True)),
            Signature("aten.mm.default", ((128, 256), (256, 64)), ("float16", "float16"), ((256, 1), (64, 1)))]
    with TraceWriter(tmp_path / "t.h5", {}) as w:
        ids = [w.add_signature(s.key()) for s in sigs]
    assert ids[0] == ids[2] != ids[1]
    with TraceReader(tmp_path / "t.h5") as r:
        assert [Signature.from_key(r.signatures[i]) for i in ids] == sigs


def random_ops(seed: int, n: int) -> list[Op]:
    rng = np.random.default_rng(seed)
    kinds, sources = list(OpKind), list(CostSource)
    return [Op(kinds[rng.integers(len(kinds))], stream=int(rng.integers(0, 3)), name=f"op{rng.integers(0, 9)}é",
               sig=int(rng.integers(-1, 9)), duration=float(rng.random()), flops=float(rng.integers(0, 2 ** 50)),
               nbytes=int(rng.integers(0, 2 ** 40)), group=int(rng.integers(-1, 3)), arg=int(rng.integers(-1, 99)),
               cpu_delta=float(rng.random()), source=sources[rng.integers(len(sources))],
               mem=int(rng.integers(-2 ** 31, 2 ** 31)), host_py=int(rng.integers(0, 2 ** 20)),
               host_c=int(rng.integers(0, 2 ** 20)), host_disp=int(rng.integers(0, 2 ** 10)),
               host_line=int(rng.integers(0, 2 ** 24)))
            for _ in range(n)]


def test_iter_ops_rebuilds_the_op_stream(tmp_path, monkeypatch):
    ops = random_ops(6, 500)
    times = np.cumsum(np.random.default_rng(7).random(500))
    with TraceWriter(tmp_path / "t.h5", {"ranks": [0, 1]}, chunk_rows=32) as w:
        w.append_op_objects(1, ops[:123], times[:123], times[:123] + 1, times[:123] + 2)
        w.flush()
        w.append_op_objects(1, ops[123:], times[123:], times[123:] + 1, times[123:] + 2)
    monkeypatch.setattr(reader_module, "_BLOCK_ROWS", 64)   # several blocks, each read ahead in a thread
    with TraceReader(tmp_path / "t.h5") as r:
        back = list(r.iter_ops(1))
        assert list(r.iter_ops(0)) == []
        rows = r.ops(1)
    assert len(back) == len(ops)
    for a, b in zip(ops, back):
        assert isinstance(b, Op)
        for slot in Op.__slots__:
            assert getattr(b, slot) == getattr(a, slot), slot
        assert isinstance(b.kind, OpKind) and isinstance(b.source, CostSource)
        assert type(b.name) is str and type(b.duration) is float and type(b.nbytes) is int
    assert np.array_equal(rows["issue"], times) and np.array_equal(rows["end"], times + 2)


def test_an_older_trace_s_generated_kernels_are_found_by_name(tmp_path):
    # a trace written before KERNEL ops' arg marked the kernels Inductor generated: a kernel named as the simulation
    # names them (interceptor.emit_fused) is read as generated, so that a replay charges its launch as a live run
    ops = [Op(OpKind.KERNEL, name="triton_poi_fused_add_0"), Op(OpKind.KERNEL, name="triton_red_fused_sum_1"),
           Op(OpKind.KERNEL, name="aten.mm.default"), Op(OpKind.MEMCPY, name="triton_poi_x", arg=0)]
    path = tmp_path / "old.h5"
    zeros = np.zeros(len(ops))
    with TraceWriter(path, {}) as w:
        w.append_op_objects(0, ops, zeros, zeros, zeros)
    with TraceReader(path) as r:
        assert r.meta["generated_marked"] is True
        assert [o.arg for o in r.iter_ops(0)] == [-1, -1, -1, 0]         # this code's traces: as written
    with h5py.File(path, "r+") as f:
        meta = json.loads(f[S.META][()])
        del meta["generated_marked"]
        f[S.META][()] = json.dumps(meta)
    with TraceReader(path) as r:
        assert [o.arg for o in r.iter_ops(0)] == [1, 1, -1, 0]


def test_unknown_op_kind_is_reported(tmp_path):
    rows = S.empty_ops(3)
    rows["kind"][1] = 200
    with TraceWriter(tmp_path / "t.h5", {}) as w:
        w.append_ops(0, rows)
    with TraceReader(tmp_path / "t.h5") as r:
        with pytest.raises(TraceError, match="op 1: unknown op kind 200"):
            list(r.iter_ops(0))


def test_ranks_from_meta_and_unknown_rank(tmp_path):
    with TraceWriter(tmp_path / "t.h5", {"ranks": [0, 4]}) as w:
        w.append_ops(4, S.empty_ops(2))
    with TraceReader(tmp_path / "t.h5") as r:
        assert r.ranks == [0, 4]
        assert len(r.ops(0)) == 0 and len(r.ops(4)) == 2 and len(r.iterations(0)) == 0
        with pytest.raises(TraceError, match=r"no rank 5 .*ranks: 0, 4"):
            r.ops(5)
        with pytest.raises(TraceError, match=r"no rank 5"):
            r.iter_ops(5)


def test_writer_rejects_misuse(tmp_path):
    w = TraceWriter(tmp_path / "t.h5", {})
    with pytest.raises(ValueError, match="OP_DTYPE|schema dtype"):
        w.append_ops(0, np.zeros(3, S.COLL_DTYPE))
    w.add_group(1, [0, 1], "dp")
    w.add_group(1, [0, 1], "dp")          # same again is fine
    with pytest.raises(ValueError, match="group 1"):
        w.add_group(1, [0, 2], "dp")
    with pytest.raises(ValueError, match="mode"):
        TraceWriter(tmp_path / "u.h5", {"mode": "dream"})
    w.close()
    with pytest.raises(ValueError, match="closed"):
        w.append_ops(0, S.empty_ops(1))


def test_writer_error_names_the_file(tmp_path):
    target = tmp_path / "no-such-dir" / "t.h5"
    with pytest.raises(TraceError, match="no-such-dir"):
        TraceWriter(target, {})


def test_rows_are_copied_on_append(tmp_path):
    rows = make_rows(8, 10)
    expected = rows.copy()
    with TraceWriter(tmp_path / "t.h5", {}) as w:
        w.append_ops(0, rows)
        rows["issue"] = -1.0                # the caller reuses its buffer before the flush
    with TraceReader(tmp_path / "t.h5") as r:
        assert np.array_equal(r.ops(0), expected)


def test_failed_run_records_its_error(tmp_path):
    with pytest.raises(RuntimeError):
        with TraceWriter(tmp_path / "t.h5", {}) as w:
            w.append_ops(0, S.empty_ops(5))
            raise RuntimeError("simulated OOM")
    with TraceReader(tmp_path / "t.h5") as r:
        assert r.complete and "simulated OOM" in r.error and len(r.ops(0)) == 5


def test_update_meta_is_written_at_flush(tmp_path):
    with TraceWriter(tmp_path / "t.h5", {"world_size": 2}) as w:
        w.update_meta({"world_size": 4, "note": "résumé"})
    with TraceReader(tmp_path / "t.h5") as r:
        assert r.meta["world_size"] == 4 and r.meta["note"] == "résumé"


# -- killed runs ---------------------------------------------------------------------------------------------------

CHILD = """
import os, signal, sys
import numpy as np
from phantora.engine.ops import CostSource, OpKind
from phantora.trace import schema as S
from phantora.trace.writer import TraceWriter
{make_rows}
path, mode = sys.argv[1], sys.argv[2]
w = TraceWriter(path, {{"ranks": [0, 1], "world_size": 2}}, chunk_rows=100, max_pending_rows=250)
if mode == "flushed":
    for i in range(3):
        w.add_string(f"name-{{i}}")
        w.add_signature(f"sig-{{i}}")
        w.append_ops(0, make_rows(i, 130))
        w.append_ops(1, make_rows(10 + i, 70))
        w.mark_iteration(0, float(i))
        w.flush()
    w.add_string("after-last-flush")          # none of this reaches the file
    w.add_signature("sig-after")
    w.append_ops(0, make_rows(99, 50))
    w.mark_iteration(0, 99.0)
elif mode == "autoflush":
    for i in range(5):                        # 100 rows each; max_pending_rows=250 flushes after the 3rd
        w.append_ops(0, make_rows(i, 100))
os.kill(os.getpid(), signal.SIGKILL)
"""


def run_killed_child(path: Path, mode: str) -> None:
    code = CHILD.format(make_rows=inspect.getsource(make_rows))
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-c", code, str(path), mode], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr


def test_killed_run_leaves_everything_up_to_the_last_flush(tmp_path):
    path = tmp_path / "killed.h5"
    run_killed_child(path, "flushed")
    # killed before close(): the trace never got its own name, and asking for it names the unfinished file
    with pytest.raises(TraceError, match="unfinished trace"):
        TraceReader(path)
    [partial] = partial_traces(str(path))
    with TraceReader(partial) as r:
        assert not r.complete
        assert "incomplete" in r.warning and partial in r.warning
        assert np.array_equal(r.ops(0), np.concatenate([make_rows(i, 130) for i in range(3)]))
        assert np.array_equal(r.ops(1), np.concatenate([make_rows(10 + i, 70) for i in range(3)]))
        assert r.names == ["", "name-0", "name-1", "name-2"]
        assert r.signatures == ["sig-0", "sig-1", "sig-2"]
        assert r.iterations(0).tolist() == [0.0, 1.0, 2.0]
        assert r.meta["world_size"] == 2
    # HDF5's own filter pipeline reads it too, the partial last chunk included.
    with h5py.File(partial, "r") as f:
        ds = f["ranks/0/ops"]
        assert np.array_equal(ds[:], np.concatenate([make_rows(i, 130) for i in range(3)]))
        assert len(ds) % 100 != 0                     # (there is a partial last chunk)


def test_killed_run_keeps_rows_flushed_by_the_pending_limit(tmp_path):
    path = tmp_path / "auto.h5"
    run_killed_child(path, "autoflush")
    [partial] = partial_traces(str(path))
    with TraceReader(partial) as r:
        assert not r.complete
        assert np.array_equal(r.ops(0), np.concatenate([make_rows(i, 100) for i in range(3)]))
        assert len(r.ops(1)) == 0 and r.ranks == [0, 1]


# -- broken files --------------------------------------------------------------------------------------------------

def good_trace(path: Path) -> Path:
    with TraceWriter(path, META, chunk_rows=256) as w:
        w.add_group(0, [0, 8], "world")
        w.append_ops(0, make_rows(11, 3000))
        w.append_collectives(make_collectives(12, 100))
    return path


def expect_trace_error(path: Path, *words: str) -> TraceError:
    with pytest.raises(TraceError) as info:
        TraceReader(path)
    msg = str(info.value)
    assert str(path) in msg, msg
    for word in words:
        assert word in msg, msg
    assert isinstance(info.value, PhantoraError)
    return info.value


def test_missing_file(tmp_path):
    expect_trace_error(tmp_path / "absent.h5", "no such")


def test_directory(tmp_path):
    expect_trace_error(tmp_path, "directory")


def test_empty_file(tmp_path):
    (tmp_path / "e.h5").write_bytes(b"")
    expect_trace_error(tmp_path / "e.h5", "empty")


def test_random_bytes(tmp_path):
    path = tmp_path / "noise.h5"
    path.write_bytes(np.random.default_rng(0).bytes(100_000))
    expect_trace_error(path, "not an HDF5 file")


@pytest.mark.parametrize("fraction", [0.02, 0.3, 0.6, 0.95, 0.9999])
def test_truncated_copy(tmp_path, fraction):
    good = good_trace(tmp_path / "good.h5")
    data = good.read_bytes()
    cut = tmp_path / "cut.h5"
    cut.write_bytes(data[:int(len(data) * fraction)])
    expect_trace_error(cut, "truncated")


def test_hdf5_file_that_is_not_a_trace(tmp_path):
    path = tmp_path / "other.h5"
    with h5py.File(path, "w") as f:
        f["x"] = np.arange(10)
    expect_trace_error(path, "not a Phantora trace")
    with h5py.File(path, "a") as f:
        f.attrs["format"] = "someone-elses-trace"
    expect_trace_error(path, "not a Phantora trace", "someone-elses-trace")


def test_version_from_the_future(tmp_path):
    path = good_trace(tmp_path / "t.h5")
    with h5py.File(path, "a") as f:
        f.attrs["version"] = S.FORMAT_VERSION + 1
    expect_trace_error(path, "newer", f"version {S.FORMAT_VERSION + 1}", "upgrade")


def test_missing_version(tmp_path):
    path = good_trace(tmp_path / "t.h5")
    with h5py.File(path, "a") as f:
        del f.attrs["version"]
    expect_trace_error(path, "version")


def test_missing_table(tmp_path):
    path = good_trace(tmp_path / "t.h5")
    with h5py.File(path, "a") as f:
        del f["strings"]
    expect_trace_error(path, "'strings'")


def test_corrupt_chunk_is_reported_on_read(tmp_path):
    path = good_trace(tmp_path / "t.h5")
    with h5py.File(path, "r") as f:
        info = f["ranks/0/ops"].id.get_chunk_info(3)
    with open(path, "r+b") as fh:           # overwrite the middle of one deflated chunk
        fh.seek(info.byte_offset + info.size // 2)
        fh.write(b"\xff" * 64)
    with TraceReader(path) as r:            # metadata is intact: the file opens
        with pytest.raises(TraceError) as e1:
            r.ops(0)
        with pytest.raises(TraceError) as e2:
            list(r.iter_ops(0))
    for e in (e1, e2):
        assert str(path) in str(e.value) and "ops of rank 0" in str(e.value)


def test_copy_of_a_trace_opens_while_the_original_is_written(tmp_path):
    """A trace can be copied and read while its run still writes it: the copy holds the flushed state."""
    path = tmp_path / "live.h5"
    w = TraceWriter(path, {"ranks": [0]})
    w.append_ops(0, make_rows(13, 500))
    w.flush()
    assert not path.exists()                 # written under its temporary name until closed
    shutil.copy(w.written_path, tmp_path / "copy.h5")
    w.append_ops(0, make_rows(14, 10))
    with TraceReader(tmp_path / "copy.h5") as r:
        assert not r.complete and np.array_equal(r.ops(0), make_rows(13, 500))
    w.close()
    with TraceReader(path) as r:
        assert r.complete and len(r.ops(0)) == 510


def test_trace_read_by_the_process_writing_it(tmp_path):
    """Between flushes the open trace reads back what was flushed, in the writing process too."""
    path = tmp_path / "t.h5"
    w = TraceWriter(path, {"ranks": [0]}, chunk_rows=64)
    w.append_ops(0, make_rows(15, 100))      # one full chunk and a partial last chunk
    w.flush()
    for _ in range(2):
        with TraceReader(w.written_path) as r:
            assert not r.complete and np.array_equal(r.ops(0), make_rows(15, 100))
        w.append_ops(0, make_rows(16, 10))   # not flushed: not visible
    w.close()


def test_tables_with_added_columns_still_read(tmp_path):
    """Versioning policy: a column added by a later compatible writer is ignored by this reader."""
    path = good_trace(tmp_path / "t.h5")
    rows = make_rows(11, 3000)
    rows["name"] = 1                     # "world", so that every name index is in the string table
    wider = np.dtype(S.OP_DTYPE.descr + [("extra", "<f4")])
    table = np.zeros(len(rows), wider)
    for name in S.OP_DTYPE.names:
        table[name] = rows[name]
    with h5py.File(path, "a") as f:
        del f["ranks/0/ops"]
        f.create_dataset("ranks/0/ops", data=table, chunks=(500,), maxshape=(None,), compression="gzip")
    with TraceReader(path) as r:
        assert np.array_equal(r.ops(0), rows)
        assert [int(op.kind) for op in r.iter_ops(0)] == rows["kind"].tolist()
    with h5py.File(path, "a") as f:
        del f["ranks/0/ops"]
        f.create_dataset("ranks/0/ops", data=rows[["kind", "stream", "name"]].astype(
            np.dtype([("kind", "u1"), ("stream", "<i2"), ("name", "<u4")])))
    with TraceReader(path) as r:
        with pytest.raises(TraceError, match="lack the column"):
            r.ops(0)


@pytest.mark.parametrize("dropped", [("host_line",), S.OPTIONAL_OP_COLUMNS], ids=["no-lines", "no-host-counts"])
def test_tables_of_older_writers_read_their_later_columns_as_zero(tmp_path, dropped):
    """Versioning policy: a trace written before a column was appended (host_line after host_disp; all four host
    counts before that) reads it as 0, the other columns as written, row by row and as ops."""
    path = good_trace(tmp_path / "t.h5")
    rows = make_rows(12, 2000)
    rows["name"] = 1
    older = np.dtype([d for d in S.OP_DTYPE.descr if d[0] not in dropped])
    table = np.zeros(len(rows), older)
    for name in older.names:
        table[name] = rows[name]
    with h5py.File(path, "a") as f:
        del f["ranks/0/ops"]
        f.create_dataset("ranks/0/ops", data=table, chunks=(500,), maxshape=(None,), compression="gzip")
    with TraceReader(path) as r:
        got = r.ops(0)
        ops = list(r.iter_ops(0))
    for name in S.OP_DTYPE.names:
        assert np.array_equal(got[name], np.zeros_like(rows[name]) if name in dropped else rows[name]), name
    assert all(op.host_line == 0 for op in ops)
    assert [op.host_disp for op in ops] == ([0] * len(rows) if "host_disp" in dropped else rows["host_disp"].tolist())


def test_the_h5py_example_of_the_format_document(tmp_path, monkeypatch, capsys):
    doc = (REPO / "docs" / "trace-format.md").read_text(encoding="utf-8")
    code = doc.split("```python\n", 1)[1].split("```", 1)[0]
    rows = make_rows(17, 300, n_names=3)
    rows["kind"][::3] = int(OpKind.KERNEL)
    with TraceWriter(tmp_path / "run.trace.h5", {**META, "ranks": [0, 8]}) as w:
        w.add_string("gemm")
        w.add_string("softmax")
        w.append_ops(8, rows)
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "trace-format.md", "exec"), {})
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == ["8"] and "300 ops" in lines[0]


@pytest.mark.parametrize("mask", [0b01, 0b10, 0b11], ids=["deflate-only", "shuffle-only", "unfiltered"])
def test_chunks_stored_with_skipped_filters_read_back(tmp_path, mask):
    """A chunk's filter mask (set by another HDF5 writer) is honoured by the reader's own chunk decoding."""
    path = tmp_path / "t.h5"
    rows = make_rows(18, 1000)
    with TraceWriter(path, {}, chunk_rows=256) as w:
        w.append_ops(0, rows)
    chunk = rows[256:512]
    data = chunk.view(np.uint8).reshape(256, S.OP_DTYPE.itemsize)
    stored = data.tobytes() if mask & 0b01 else data.T.tobytes()           # shuffle unless skipped
    if not mask & 0b10:
        stored = zlib.compress(stored)                                       # deflate unless skipped
    with h5py.File(path, "a") as f:
        f["ranks/0/ops"].id.write_direct_chunk((256,), stored, mask)
    with h5py.File(path, "r") as f:                                          # HDF5 agrees on the meaning
        assert np.array_equal(f["ranks/0/ops"][256:512], chunk)
    with TraceReader(path) as r:
        assert np.array_equal(r.ops(0), rows)
