"""Faults around traces: existing traces and exports are never destroyed, damaged traces give one-line errors on
every read path, replays say when the replayed run is out of memory or the recorded run failed, and `compute` has
one meaning (per iteration) in inspect, replay and the live-run summary.

Traces are synthetic (phantora/synthetic.py through the engine) or hand-built rows, so these tests stay fast; one
test starts `phantora run` to check the refusal and `--overwrite` end to end.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
from click.testing import CliRunner

from phantora.cli import main
from phantora.cluster import load_cluster
from phantora.engine.ops import OpKind
from phantora.errors import TraceError
from phantora.live.summary import RunSummary, _from_trace
from phantora.simulate import simulate_streams
from phantora.synthetic import SyntheticModel, fsdp_streams
from phantora.trace import schema as S
from phantora.trace.reader import TraceReader, partial_traces
from phantora.trace.writer import TraceWriter
from test_live_run import phantora_run

SCRIPTS = Path(__file__).resolve().parent / "scripts"
GIB = 2 ** 30


def synthetic_trace(path: Path, iterations: int = 3) -> Path:
    spec = load_cluster("h100-hgx", nodes=1, gpus_per_node=2)
    streams, sigs, meta = fsdp_streams(spec, SyntheticModel(layers=2, seq=256), iterations=iterations)
    simulate_streams(spec, streams, path, signatures=sigs, meta=meta)
    return path


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    return synthetic_trace(tmp_path_factory.mktemp("good") / "run.h5")


def copy_of(good: Path, tmp_path: Path, name: str = "run.h5") -> Path:
    dst = tmp_path / name
    shutil.copy(good, dst)
    return dst


def leftovers(folder: Path) -> list[str]:
    """Temporary files a writer or an export may have left in `folder`."""
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".partial"))


def cli(*args: str):
    return CliRunner().invoke(main, [str(a) for a in args])


def all_ops(path: Path) -> dict[int, np.ndarray]:
    with TraceReader(path) as r:
        return {rank: r.ops(rank) for rank in r.ranks}


def same_tables(a: dict[int, np.ndarray], b: dict[int, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def one_line_error(res, path) -> str:
    """The output of a failed command: exit status 1, no traceback, one `Error:` line naming `path`."""
    assert res.exit_code == 1, (res.exit_code, res.output, res.exception)
    assert "Traceback" not in res.output
    errors = [line for line in res.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, res.output
    assert str(path) in errors[0], res.output
    return errors[0]


# -- 1. an existing trace is never destroyed ----------------------------------------------------------------------

def test_writer_refuses_an_existing_trace_and_leaves_it_intact(good, tmp_path):
    path = copy_of(good, tmp_path)
    before = all_ops(path)
    with pytest.raises(TraceError) as e:
        TraceWriter(path, {"ranks": [0]})
    assert str(path) in str(e.value) and "--overwrite" in str(e.value)
    assert same_tables(all_ops(path), before)
    assert leftovers(tmp_path) == []


def test_overwrite_replaces_the_trace_only_when_the_new_one_is_closed(good, tmp_path):
    path = copy_of(good, tmp_path)
    before = all_ops(path)
    rows = S.empty_ops(5)
    rows["kind"] = int(OpKind.KERNEL)
    w = TraceWriter(path, {"ranks": [0]}, overwrite=True)
    w.append_ops(0, rows)
    w.flush()
    assert same_tables(all_ops(path), before)          # the earlier trace is whole while the new one is written
    assert len(leftovers(tmp_path)) == 1
    w.close()
    after = all_ops(path)
    assert list(after) == [0] and np.array_equal(after[0], rows)
    assert leftovers(tmp_path) == []


def test_a_file_that_appears_during_the_write_is_not_replaced(tmp_path):
    path = tmp_path / "t.h5"
    w = TraceWriter(path, {"ranks": [0]})
    path.write_text("someone else's file")
    with pytest.raises(TraceError) as e:
        w.close()
    kept = w.written_path
    assert kept != str(path) and kept in str(e.value) and str(path) in str(e.value)
    assert path.read_text() == "someone else's file"
    with TraceReader(kept) as r:                       # the trace is whole under its temporary name
        assert r.complete


def test_a_failed_run_ends_with_its_trace_at_its_name_marked_with_the_error(tmp_path):
    path = tmp_path / "t.h5"
    with pytest.raises(RuntimeError):
        with TraceWriter(path, {"ranks": [0]}) as w:
            w.append_ops(0, S.empty_ops(3))
            raise RuntimeError("the program broke")
    with TraceReader(path) as r:
        assert "the program broke" in r.error and len(r.ops(0)) == 3
    assert leftovers(tmp_path) == []


def test_asking_for_the_trace_of_an_unclosed_run_names_its_unfinished_file(tmp_path):
    path = tmp_path / "t.h5"
    w = TraceWriter(path, {"ranks": [0]})
    w.append_ops(0, S.empty_ops(4))
    w.flush()
    res = cli("inspect", path)
    line = one_line_error(res, path)
    assert w.written_path in line and partial_traces(str(path)) == [w.written_path]
    w.close()


def test_phantora_run_refuses_an_existing_trace_unless_overwrite(good, tmp_path):
    path = copy_of(good, tmp_path)
    before = all_ops(path)
    script = ("--", "python", str(SCRIPTS / "live_fail.py"), "--mode", "raise")
    proc = phantora_run("--gpus-per-node", "2", "--trace", str(path), *script)
    assert proc.returncode != 0 and str(path) in proc.stderr and "--overwrite" in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "[rank" not in proc.stderr + proc.stdout   # refused before it ran
    assert same_tables(all_ops(path), before)
    # with --overwrite the run goes ahead; it fails (deliberately), and its trace takes the name, with the error
    proc = phantora_run("--gpus-per-node", "2", "--trace", str(path), "--overwrite", *script)
    assert proc.returncode == 1, proc.stderr[-2000:]
    with TraceReader(path) as r:
        assert r.error and "rank 1" in r.error
    assert leftovers(tmp_path) == []


# -- 2. export writes whole files only; damaged traces give one-line errors -------------------------------------

def damage_a_chunk(path: Path) -> None:
    with h5py.File(path, "r") as f:
        info = f["ranks/0/ops"].id.get_chunk_info(0)
    with open(path, "r+b") as fh:                      # garbage in the middle of a deflated chunk
        fh.seek(info.byte_offset + info.size // 2)
        fh.write(b"\xff" * 64)


def test_export_of_a_corrupt_trace_leaves_the_earlier_export_intact(good, tmp_path):
    trace = copy_of(good, tmp_path)
    out = tmp_path / "run.json"
    assert cli("export", trace, "--perfetto", out).exit_code == 0
    first = out.read_bytes()
    json.loads(first)
    res = cli("export", trace, "--perfetto", out)      # refused: it exists
    line = one_line_error(res, out)
    assert "--overwrite" in line and out.read_bytes() == first
    damage_a_chunk(trace)
    res = cli("export", trace, "--perfetto", out, "--overwrite")
    one_line_error(res, trace)
    assert out.read_bytes() == first                   # not truncated, not half-written
    res = cli("export", trace, "--perfetto", tmp_path / "new.json")
    one_line_error(res, trace)
    assert not (tmp_path / "new.json").exists()
    assert leftovers(tmp_path) == []


def test_export_overwrite_replaces_a_good_export(good, tmp_path):
    out = tmp_path / "run.json"
    out.write_text("old")
    res = cli("export", good, "--perfetto", out, "--overwrite")
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text())["traceEvents"]
    assert leftovers(tmp_path) == []


def damaged_variants(good: Path, folder: Path) -> dict[str, Path]:
    data = good.read_bytes()
    rng = np.random.default_rng(0)
    variants = {
        "first-4KiB-garbage": rng.bytes(4096) + data[4096:],
        "header-zeroed-after-signature": data[:8] + bytes(4088) + data[4096:],
        "truncated-half": data[:len(data) // 2],
        "truncated-3000": data[:3000],
    }
    for off in range(512, min(len(data), 16384), 512):  # garbage over the metadata near the superblock
        variants[f"garbage-at-{off}"] = data[:off] + rng.bytes(512) + data[off + 512:]
    out = {}
    for name, blob in variants.items():
        p = folder / f"{name}.h5"
        p.write_bytes(blob)
        out[name] = p
    return out


def test_damaged_traces_raise_trace_errors_naming_the_file_from_the_reader(good, tmp_path):
    for name, path in damaged_variants(good, tmp_path).items():
        try:
            with TraceReader(path) as r:
                r.complete, r.error, r.flushes, r.warning
                r.names, r.signatures, r.groups, r.collectives, r.dependencies
                for rank in r.ranks:
                    r.ops(rank)
                    r.iterations(rank)
        except TraceError as e:                        # anything else fails the test
            assert str(path) in str(e), name


@pytest.mark.parametrize("command", ["inspect", "export", "replay", "sweep"])
def test_damaged_traces_give_one_line_errors_on_every_read_path(good, tmp_path, command):
    variants = damaged_variants(good, tmp_path)
    for name, path in variants.items():
        args = {"inspect": ["inspect", path], "export": ["export", path, "--perfetto", tmp_path / f"{name}.json"],
                "replay": ["replay", path], "sweep": ["sweep", path, "--vary", "net.inter_node_gbps=100"]}[command]
        res = cli(*args)
        assert res.exception is None or isinstance(res.exception, SystemExit), (name, res.exception)
        assert "Traceback" not in res.output, (name, res.output)
        if name.startswith(("first-", "header-", "truncated-")):
            one_line_error(res, path)                   # these never read as a trace
        elif res.exit_code != 0:
            one_line_error(res, path)
        if command == "export" and res.exit_code != 0:
            assert not (tmp_path / f"{name}.json").exists()
    assert leftovers(tmp_path) == []


# -- 3. replay: out of memory, failed and incomplete runs, --out -------------------------------------------------

def peak_allocated(trace: Path) -> int:
    res = cli("replay", trace, "--json")
    assert res.exit_code == 0, res.output
    return max(json.loads(res.stdout)["peak_allocated_bytes"].values())


def roomy_gib(peak: int) -> float:
    """A device with room for twice the run's peak beside what a process holds outside the allocator (at most a
    context, the libraries' workspaces, two NCCL communicators and a peer connection: engine/devmem.py)."""
    from phantora.cluster import DeviceMemorySpec

    d = DeviceMemorySpec()
    outside = (d.context_mib + d.libraries_mib + d.nccl_first_comm_mib + d.nccl_comm_mib + d.nccl_p2p_mib) * 2 ** 20
    return round((2 * peak + outside) / GIB, 3)


def test_replay_that_runs_out_of_memory_says_so_and_exits_3(good, tmp_path):
    peak = peak_allocated(good)
    vram_gib = round(peak / 2 / GIB, 3)                # half of what the run needs
    res = cli("replay", good, "--set", f"vram_gib={vram_gib}")
    assert res.exit_code == 3, res.output
    assert "OUT OF MEMORY" in res.stdout and "out of device memory" in res.stderr
    assert f"of {vram_gib:.2f} GiB device memory" in res.stdout          # the capacity asked for
    res = cli("replay", good, "--set", f"vram_gib={vram_gib}", "--json")
    assert res.exit_code == 3
    d = json.loads(res.stdout)
    assert d["out_of_memory"] and d["ooms"]
    for o in d["ooms"]:
        assert o["rank"] in (0, 1) and 0 <= int(vram_gib * GIB) - o["capacity_bytes"] < 2**16   # a driver's 64 KiB
        # it failed: the request did not fit beside what the allocator and the process outside it held
        held = o.get("outside_bytes", 0)
        assert o["requested_bytes"] + o["reserved_bytes"] + held > o["capacity_bytes"]
    # the control: enough memory, no OOM, exit 0
    res = cli("replay", good, "--set", f"vram_gib={roomy_gib(peak)}")
    assert res.exit_code == 0 and "OUT OF MEMORY" not in res.output


def test_sweep_marks_the_values_that_run_out_of_memory_and_exits_3(good):
    peak = peak_allocated(good)
    low, high = round(peak / 2 / GIB, 3), roomy_gib(peak)
    res = cli("sweep", good, "--vary", f"vram_gib={low},{high}")
    assert res.exit_code == 3, res.output
    rows = {line.split()[0]: line for line in res.stdout.splitlines()[1:]}
    assert "OUT OF MEMORY" in rows[str(low)] and "OUT OF MEMORY" not in rows[str(high)]
    assert str(low) in res.stderr


def test_a_replayed_trace_of_an_oom_records_it(good, tmp_path):
    peak = peak_allocated(good)
    out = tmp_path / "oom.h5"
    res = cli("replay", good, "--set", f"vram_gib={round(peak / 2 / GIB, 3)}", "--out", out)
    assert res.exit_code == 3
    with TraceReader(out) as r:
        assert r.complete and "out of device memory" in r.error


def mark(path: Path, **attrs) -> Path:
    with h5py.File(path, "a") as f:
        for k, v in attrs.items():
            f.attrs[k] = v
    return path


@pytest.mark.parametrize("state", ["failed", "incomplete", "simulation"])
def test_replay_of_a_failed_or_incomplete_run_needs_allow_incomplete(good, tmp_path, state):
    trace = copy_of(good, tmp_path)
    if state == "failed":
        mark(trace, error="rank 1 exited with code 1")
        said = "rank 1 exited with code 1"
    elif state == "incomplete":
        mark(trace, complete=False)
        said = "incomplete"
    else:
        with h5py.File(trace, "a") as f:
            meta = json.loads(f["meta"][()])
            meta["complete_simulation"] = False
            f["meta"][()] = json.dumps(meta)
        said = "complete_simulation"
    for cmd in (["replay", trace], ["sweep", trace, "--vary", "net.inter_node_gbps=100"]):
        res = cli(*cmd)
        line = one_line_error(res, trace)
        assert said in line and "--allow-incomplete" in line
        res = cli(*cmd, "--allow-incomplete")
        assert res.exit_code == 0, res.output
        assert said in res.stderr                      # what the trace records, still said
    res = cli("replay", trace, "--allow-incomplete", "--json")
    assert said in json.loads(res.stdout)["recorded_problem"]


def test_replay_out_refuses_an_existing_file_and_a_failed_replay_leaves_it_intact(good, tmp_path):
    existing = copy_of(good, tmp_path, "existing.h5")
    before = all_ops(existing)
    line = one_line_error(cli("replay", good, "--out", existing), existing)
    assert "--overwrite" in line
    # a trace whose dependencies table contradicts its op tables fails during the replay, after --out was opened
    broken = copy_of(good, tmp_path, "broken.h5")
    with h5py.File(broken, "a") as f:
        deps = f[S.DEPENDENCIES][()]
        deps["dst"] = 10 ** 9
        del f[S.DEPENDENCIES]
        f.create_dataset(S.DEPENDENCIES, data=deps, maxshape=(None,), chunks=True)
    one_line_error(cli("replay", broken, "--out", existing, "--overwrite"), broken)
    assert same_tables(all_ops(existing), before)
    assert leftovers(tmp_path) == []
    res = cli("replay", good, "--out", existing, "--overwrite")
    assert res.exit_code == 0, res.output
    with TraceReader(existing) as r:
        assert r.meta["mode"] == "replay"


def test_an_output_that_is_the_input_trace_is_refused_naming_the_option(good, tmp_path):
    trace = copy_of(good, tmp_path)
    before = all_ops(trace)
    (tmp_path / "link.h5").symlink_to(trace)
    for args, option in ((["replay", trace, "--out", trace, "--overwrite"], "'--out'"),
                         (["replay", tmp_path / "link.h5", "--out", tmp_path / "." / "run.h5"], "'--out'"),
                         (["export", trace, "--perfetto", tmp_path / "link.h5", "--overwrite"], "'--perfetto'")):
        res = cli(*args)
        assert res.exit_code == 2, res.output
        errors = [line for line in res.output.splitlines() if line.startswith("Error:")]
        assert len(errors) == 1 and option in errors[0] and "input trace" in errors[0], res.output
    assert same_tables(all_ops(trace), before)
    assert leftovers(tmp_path) == []


# -- 4. compute: one meaning ------------------------------------------------------------------------------------

def hand_built_trace(path: Path) -> Path:
    """Rank 0: a 1 s set-up kernel, then iterations marked at 10, 20 and 30 s, each with a 4 s kernel and a 2 s
    collective that overlaps the kernel for 1 s."""
    spec = [(OpKind.KERNEL, 0, 0.0, 1.0)]
    for t in (10.0, 20.0):
        spec += [(OpKind.KERNEL, 0, t, t + 4), (OpKind.COLLECTIVE, 1, t + 3, t + 5)]
    rows = S.empty_ops(len(spec))
    for i, (kind, stream, start, end) in enumerate(spec):
        rows[i]["kind"], rows[i]["stream"] = int(kind), stream
        rows[i]["issue"] = rows[i]["start"] = start
        rows[i]["end"], rows[i]["duration"] = end, end - start
    with TraceWriter(path, {"ranks": [0]}) as w:
        w.append_ops(0, rows)
        for t in (10.0, 20.0, 30.0):
            w.mark_iteration(0, t)
    return path


def test_inspect_gives_compute_per_iteration_and_says_so(tmp_path):
    trace = hand_built_trace(tmp_path / "t.h5")
    res = cli("inspect", trace, "--json")
    assert res.exit_code == 0, res.output
    r0 = json.loads(res.stdout)["ranks"][0]
    # by hand: two iterations between the marks at 10 and 30 s; 8 s of kernels, 4 s of collectives, of which
    # 2 s while no kernel runs; the set-up kernel before the first mark does not count
    assert r0["time_basis"] == "per iteration"
    assert r0["compute"] == pytest.approx(8 / 2)
    assert r0["communication"] == pytest.approx(4 / 2)
    assert r0["exposed_communication"] == pytest.approx(2 / 2)
    assert r0["totals"]["compute"] == pytest.approx(9)
    text = cli("inspect", trace).stdout
    assert "per iteration" in text


def test_compute_per_iteration_agrees_across_inspect_replay_and_the_live_summary(good):
    res = cli("inspect", good, "--json")
    ranks = json.loads(res.stdout)["ranks"]
    assert {r["time_basis"] for r in ranks} == {"per iteration"}
    inspect_compute = np.mean([r["compute"] for r in ranks])
    inspect_exposed = np.mean([r["exposed_communication"] for r in ranks])
    # replay on the recorded cluster reproduces the timeline: the same per-iteration figures
    res = cli("replay", good, "--json")
    d = json.loads(res.stdout)
    assert d["time_basis"] == "per iteration"
    assert d["compute_s"] == pytest.approx(inspect_compute, rel=1e-9)
    assert d["exposed_communication_s"] == pytest.approx(inspect_exposed, rel=1e-9)
    assert "compute per iteration" in cli("replay", good).stdout
    # the live-run summary reads the same figures from its trace
    s = RunSummary(cluster="c", gpu="g", world_size=2, simulated_ranks=[0, 1], iterations_s=[],
                   peak_memory_bytes={}, peak_allocated_bytes={}, vram_bytes=0)
    _from_trace(s, str(good))
    assert s.compute_s == pytest.approx(inspect_compute, rel=1e-9)
    assert s.exposed_communication_s == pytest.approx(inspect_exposed, rel=1e-9)


def test_compute_per_iteration_does_not_grow_with_the_number_of_iterations(good, tmp_path):
    longer = synthetic_trace(tmp_path / "longer.h5", iterations=6)
    three = json.loads(cli("inspect", good, "--json").stdout)["ranks"]
    six = json.loads(cli("inspect", longer, "--json").stdout)["ranks"]
    for a, b in zip(three, six):
        # the synthetic steps run the same kernels: the same compute per iteration, a larger whole-trace total
        assert b["compute"] == pytest.approx(a["compute"], rel=1e-6)
        assert b["totals"]["compute"] > 1.5 * a["totals"]["compute"]


# ------------------------------------------------------------------------------------------------ bad input, named
def test_a_cluster_file_that_is_not_toml_text_is_named(good, tmp_path):
    binary = tmp_path / "bin.toml"
    binary.write_bytes(good.read_bytes()[:300])           # a trace's first bytes: not UTF-8
    folder = tmp_path / "d.toml"
    folder.mkdir()
    for path, why in ((binary, "not UTF-8"), (folder, "a directory")):
        r = cli("replay", good, "--cluster", path)
        assert r.exit_code == 1, r.output
        assert str(path) in r.output and why in r.output and "Traceback" not in r.output
        assert str(good) not in r.output                    # the cluster file is at fault, not the trace


def test_sweep_checks_every_value_and_the_plot_before_replaying(good, tmp_path):
    r = cli("sweep", good, "--vary", "gpus_per_node=2,4")
    assert r.exit_code != 0 and "gpus_per_node=4" in r.output and "[1/2]" not in r.output
    r = cli("sweep", good, "--vary", "nodes=")
    assert r.exit_code != 0 and "no value" in r.output
    for plot, why in ((tmp_path / "nodir" / "p.png", "does not exist"), (tmp_path / "p.txt", ".png")):
        r = cli("sweep", good, "--vary", "vram_gib=40,80", "--plot", plot)
        assert r.exit_code != 0 and why in r.output and "[1/2]" not in r.output


def test_sweep_refuses_more_than_one_vary_before_replaying(good):
    r = cli("sweep", good, "--vary", "vram_gib=40,80", "--vary", "net.inter_node_gbps=100,200")
    assert r.exit_code == 2 and "'--vary'" in r.output and "given 2 times" in r.output, r.output
    assert "[1/2]" not in r.output and "Traceback" not in r.output


@pytest.mark.parametrize("column, value, said", [("kind", 200, "unknown op kind 200"),
                                                  ("duration", np.nan, "duration nan"),
                                                  ("duration", np.inf, "duration inf"),
                                                  ("duration", -1e-3, "duration -0.001")])
def test_op_rows_no_phantora_writes_are_one_line_trace_errors(good, tmp_path, column, value, said):
    bad = copy_of(good, tmp_path, "bad-row.h5")
    with h5py.File(bad, "r+") as f:
        ops = f["ranks/1/ops"]
        rows = ops[()]
        rows[column][5] = value
        ops[...] = rows
    with TraceReader(bad) as r:
        with pytest.raises(TraceError, match="rank 1, op 5") as exc:
            r.ops(1)
        with pytest.raises(TraceError, match="rank 1, op 5"):
            list(r.iter_ops(1))
    assert str(bad) in str(exc.value) and said in str(exc.value)
    for args in (("inspect", bad), ("export", bad, "--perfetto", tmp_path / "bad.json"), ("replay", bad)):
        line = one_line_error(cli(*args), bad)
        assert said in line, line
    assert not (tmp_path / "bad.json").exists() and leftovers(tmp_path) == []


def test_an_op_naming_a_signature_the_trace_lacks_is_a_one_line_error(good, tmp_path):
    bad = tmp_path / "bad-sig.h5"
    shutil.copyfile(good, bad)
    with h5py.File(bad, "r+") as f:
        ops = f["ranks/0/ops"]
        rows = ops[()]
        rows["sig"][rows["kind"] == int(OpKind.KERNEL)] = 10**6
        ops[...] = rows
    for args in (("replay", bad, "--recost"),):
        res = cli(*args)
        assert "Traceback" not in res.output, res.output
        one_line_error(res, bad)
        assert "signature 1000000" in res.output


def test_sweep_refuses_a_plot_folder_it_cannot_write_in_before_replaying(good):
    # /proc takes no new files on Linux, whoever runs the test (root included)
    r = cli("sweep", good, "--vary", "vram_gib=40,80", "--plot", "/proc/p.png")
    assert r.exit_code != 0 and "cannot write in /proc" in r.output and "[1/2]" not in r.output
    assert "Traceback" not in r.output


def test_allocator_settings_misspelt_or_out_of_range_are_refused(good):
    for conf, word in (("expandable_segment:True", "expandable_segments"),
                       ("garbage_collection_threshold:2", "between 0 and 1"),
                       ("max_split_size_mb:-1", "positive")):
        r = cli("replay", good, "--alloc-conf", conf)
        assert r.exit_code != 0 and word in r.output, (conf, r.output)
    assert cli("replay", good, "--alloc-conf", "expandable_segments:True,max_split_size_mb:512").exit_code == 0


@pytest.mark.parametrize("command", ["replay", "sweep"])
def test_an_allocator_key_pytorch_does_not_know_is_refused_naming_it_and_the_option(good, command):
    args = ["sweep", good, "--vary", "vram_gib=40,80"] if command == "sweep" else ["replay", good]
    r = cli(*args, "--alloc-conf", "foo:1")
    assert r.exit_code == 2, r.output
    errors = [line for line in r.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "'--alloc-conf'" in errors[0] and "'foo'" in errors[0], r.output
    assert "expandable_segments" in errors[0] and "[1/2]" not in r.output       # the known keys, before any work


def test_out_of_memory_report_counts_the_memory_outside_the_allocator(good):
    r = cli("replay", good, "--set", "vram_gib=0.5")
    assert r.exit_code == 3, r.output
    assert "held outside PyTorch's allocator" in r.output


def test_a_profile_of_another_gpu_is_refused_with_the_option_to_use(good):
    r = cli("replay", good, "--gpu", "h200-sxm-141gb", "--profile",
            Path(__file__).resolve().parent.parent / "presets" / "profiles" / "h100-sxm-80gb.h5")
    assert r.exit_code != 0 and "--gpu h100-sxm-80gb" in r.output and "fallback_gpu_db" not in r.output


def test_phantora_run_refuses_a_summary_file_it_cannot_write_before_the_program_runs():
    # /proc takes no new files on Linux, whoever runs the test (root included): said before the run, not after it
    proc = phantora_run("--gpus-per-node", "1", "--no-trace", "--summary-json", "/proc/s.json", "--",
                        "python", "-c", "print('the program ran')")
    assert proc.returncode != 0
    assert "--summary-json /proc/s.json" in proc.stderr and "cannot write in /proc" in proc.stderr
    assert "the program ran" not in proc.stdout and "Traceback" not in proc.stderr
