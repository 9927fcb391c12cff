"""Replay reproduces a recorded run exactly and responds physically to a changed cluster."""

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from phantora.cli import main
from phantora.cluster import load_cluster
from phantora.errors import PresetError
from phantora.gpus import load_gpu
from phantora.replay import replay
from phantora.simulate import simulate_streams
from phantora.synthetic import SyntheticModel, fsdp_streams

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    spec = load_cluster("h100-hgx", nodes=2)
    streams, sigs, meta = fsdp_streams(spec, SyntheticModel(layers=4, seq=1024), iterations=3)
    path = tmp_path_factory.mktemp("t") / "run.h5"
    engine = simulate_streams(spec, streams, path, signatures=sigs, meta=meta)
    return path, engine


def test_replay_without_change_reproduces_the_recording(trace):
    path, engine = trace
    r = replay(path)
    assert r.iterations_s == r.recorded_iterations_s            # bit for bit
    assert len(r.iterations_s) == 2


def test_slower_network_slows_communication_bound_run(trace):
    path, _ = trace
    base = replay(path)
    slow_net = replay(path, overrides=("net.inter_node_gbps=25",))
    slow_nvlink_only_matters_within_nodes = replay(path, overrides=("intra.nvlink_link_gbyte_per_s=40",))
    assert slow_net.iteration_s > 1.2 * base.iteration_s
    # a faster NVLink cannot make an FSDP step over two nodes slower
    assert slow_nvlink_only_matters_within_nodes.iteration_s <= base.iteration_s * 1.000001


def test_tokens_and_mfu_are_consistent(trace):
    path, _ = trace
    r = replay(path)
    spec = load_cluster("h100-hgx", nodes=2)
    assert r.tokens_per_s_per_gpu == pytest.approx(r.tokens_per_iteration / r.iteration_s / spec.world_size)
    # MFU from its definition: achieved model FLOP/s per GPU over the bf16 peak, and below 1 by physics
    assert 0 < r.mfu < 1
    assert r.mfu == pytest.approx(r.tokens_per_s_per_gpu * r.flops_per_token / spec.gpu_spec().peak_flops("bf16"))


def test_world_size_mismatch_is_a_clear_error(trace):
    path, _ = trace
    res = CliRunner().invoke(main, ["replay", str(path), "--cluster", "h100-hgx"])
    assert res.exit_code != 0 and "16 ranks" in res.output and "Traceback" not in res.output


@pytest.mark.parametrize("option", ["--nodes", "--gpus-per-node"])
@pytest.mark.parametrize("cluster", [[], ["--cluster", "h100-hgx"]], ids=["trace-cluster", "preset"])
def test_a_node_count_below_one_is_a_usage_error_naming_its_option(trace, option, cluster):
    path, _ = trace
    res = CliRunner().invoke(main, ["replay", str(path), *cluster, option, "0"])
    assert res.exit_code == 2, res.output
    errors = [line for line in res.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and f"'{option}'" in errors[0] and "--set" not in errors[0], res.output
    with pytest.raises(PresetError, match=option) as exc:      # the same refusal without the command line
        replay(path, **{option.lstrip("-").replace("-", "_"): 0})
    assert "--set" not in str(exc.value)


def test_cli_replay_json(trace, tmp_path):
    path, _ = trace
    out = tmp_path / "new.h5"
    res = CliRunner().invoke(main, ["replay", str(path), "--set", "net.inter_node_gbps=200", "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert {"iteration_s", "recorded_iteration_s", "ops_per_s"} <= set(d)
    assert d["iteration_s"] >= d["recorded_iteration_s"]
    again = replay(out)   # the written trace replays to itself
    assert again.iterations_s == again.recorded_iterations_s


def test_replayed_trace_equals_the_recording_row_for_row(trace, tmp_path):
    """Replay without a change writes the recorded trace again: every op row (string ids compared as strings),
    the collectives and the dependencies."""
    from phantora.trace.reader import TraceReader

    path, _ = trace
    out = tmp_path / "again.h5"
    replay(path, out=str(out))
    with TraceReader(path) as a, TraceReader(out) as b:
        assert a.ranks == b.ranks
        for r in a.ranks:
            x, y = a.ops(r), b.ops(r)
            other = [c for c in x.dtype.names if c != "name"]
            assert np.array_equal(x[other], y[other])
            assert [a.names[i] for i in x["name"]] == [b.names[i] for i in y["name"]]
        cols = ["id", "group", "nbytes", "root", "start", "end", "ranks_arrived"]
        assert np.array_equal(a.collectives[cols], b.collectives[cols])
        assert len(a.dependencies) and np.array_equal(a.dependencies, b.dependencies)


# ---- re-costing kernels -----------------------------------------------------------------------------------------------
# The fixture's kernels were costed by phantora/synthetic.py's plain roofline (source ROOFLINE); the recorded GPU, an
# H100 SXM, has a measured profile (presets/profiles/h100-sxm-80gb.h5), so `recost=True` must cost them from it, and
# an A100 (no profile of its own) from the H100's across. Checked against the datasheet rooflines and the measurements.

PROFILES = ROOT / "presets" / "profiles"


def _h100_profile() -> dict[str, float]:
    """Signature key -> measured median seconds, read straight from the profile file (the measurements)."""
    import h5py

    with h5py.File(PROFILES / "h100-sxm-80gb.h5", "r") as f:
        assert f.attrs["gpu"] == "h100-sxm-80gb"
        rec = f["records"][:]
    return {(k.decode() if isinstance(k, bytes) else k): float(m) * 1e-6 for k, m in zip(rec["key"], rec["median_us"])}


def _h100_event_overhead() -> float:
    """What the profile's CUDA events add to a kernel on the H100, in seconds (its preset: the cost model subtracts
    it, docs/cost-model.md "Stream time")."""
    return load_gpu("h100-sxm-80gb").event_overhead_us * 1e-6


def _floor(gpu, flops, nbytes):
    """Roofline lower bound: no kernel beats the datasheet's bf16 tensor peak nor its HBM bandwidth."""
    return np.maximum(np.asarray(flops, float) / (gpu.peak_tflops["bf16"] * 1e12),
                      np.asarray(nbytes, float) / (gpu.hbm_bandwidth_gbyte_per_s * 1e9))


def _signature_floor(gpu, keys):
    """The roofline floor of each bf16 GEMM signature (aten.mm [m,k] x [k,n]) from its shapes: 2mkn FLOPs and
    reading both operands and writing the result once."""
    flops, nbytes = [], []
    for key in keys:
        op, shapes, dtypes = json.loads(key)[:3]
        assert op == "aten.mm.default" and dtypes == ["bfloat16", "bfloat16"], key
        (m, k), (k2, n) = shapes
        assert k == k2
        flops.append(2.0 * m * k * n)
        nbytes.append(2 * (m * k + k * n + m * n))
    return _floor(gpu, flops, nbytes)


def test_recosted_kernels_last_their_new_duration(trace):
    """On another GPU kernels are re-costed from their signatures: each signed kernel lasts exactly its row's new
    duration on its stream, no faster than the A100's datasheet roofline allows, and, the A100 having no profile of
    its own, is costed across from the H100's measurements (slower than the H100 measured it)."""
    from phantora.engine.ops import CostSource
    from phantora.gpus import load_gpu
    from phantora.trace.reader import TraceReader

    path, _ = trace
    out = path.parent / "a100.h5"
    assert not (PROFILES / "a100-sxm-80gb.h5").exists()       # premise: no A100 profile, so no PROFILE source
    replay(path, gpu="a100-sxm-80gb", out=str(out))
    a100 = load_gpu("a100-sxm-80gb")
    measured = _h100_profile()
    with TraceReader(out) as rd:
        sigs = rd.signatures
        held = [s for s in range(len(sigs)) if sigs[s] in measured]
        assert held                                              # premise: the H100 measured one of the GEMMs
        for r in rd.ranks:
            ops = rd.ops(r)
            k = ops[(ops["kind"] == 0) & (ops["sig"] >= 0)]
            assert len(k)
            assert np.allclose(k["end"] - k["start"], k["duration"], rtol=1e-9, atol=1e-15)
            floor = _signature_floor(a100, [sigs[s] for s in k["sig"].tolist()])
            assert np.all(k["duration"] >= floor), "an A100 kernel beats the A100's datasheet roofline"
            assert int(CostSource.PROFILE) not in k["source"].tolist()
            for s in held:
                mine = k[k["sig"] == s]
                assert np.all(mine["source"] == int(CostSource.CROSS_GPU))
                # A100 SXM: 312 bf16 TFLOP/s and 2039 GB/s against the H100 SXM's 989.4 and 3350
                assert np.all(mine["duration"] > measured[sigs[s]])


@pytest.fixture(scope="module")
def recosted(trace):
    path, _ = trace
    out = path.parent / "recosted.h5"
    result = replay(path, recost=True, out=str(out))
    return path, out, result


def test_recost_on_the_recorded_gpu_costs_from_its_profile(recosted):
    """Re-costing replaces the synthetic roofline costs with the H100's profile: every signed kernel's source becomes
    PROFILE (measured, or interpolated from measured GEMMs), a signature the profile holds lasts its measured median,
    which differs from the recorded roofline cost; kernels without a signature keep their recorded duration."""
    from phantora.engine.ops import CostSource
    from phantora.trace.reader import TraceReader

    path, out, _ = recosted
    measured = _h100_profile()
    with TraceReader(path) as before, TraceReader(out) as after:
        assert before.meta["gpu"] == after.meta["gpu"] == "h100-sxm-80gb"
        sigs = after.signatures
        held = {s for s in range(len(sigs)) if sigs[s] in measured}
        assert held                                             # premise: the profile measured one of the GEMMs
        changed = 0
        for r in before.ranks:
            x, y = before.ops(r), after.ops(r)
            signed = (x["kind"] == 0) & (x["sig"] >= 0)
            assert np.array_equal(signed, (y["kind"] == 0) & (y["sig"] >= 0))
            assert np.all(x["source"][signed] == int(CostSource.ROOFLINE))   # premise: recorded from the roofline
            assert np.all(y["source"][signed] == int(CostSource.PROFILE))
            k = y[signed]
            assert np.allclose(k["end"] - k["start"], k["duration"], rtol=1e-9, atol=1e-15)
            for i in np.flatnonzero(signed).tolist():
                s = int(y["sig"][i])
                if s in held:
                    assert y["duration"][i] == pytest.approx(measured[sigs[s]] - _h100_event_overhead(), rel=1e-12)
                    changed += y["duration"][i] != x["duration"][i]
            unsigned = (x["kind"] == 0) & (x["sig"] < 0)
            assert unsigned.any() and np.array_equal(x["duration"][unsigned], y["duration"][unsigned])
        assert changed


def test_replay_reports_the_recosted_sources(recosted):
    """The result's kernel time per cost source is the re-costed rows' (what validation reports as a case's cost
    source), not the recorded trace's: the synthetic trace was costed by the roofline, the replay from the profile."""
    from phantora.engine.ops import CostSource
    from phantora.trace.reader import TraceReader

    path, out, result = recosted
    with TraceReader(path) as before, TraceReader(out) as after:
        assert len(result.kernel_time_by_source) == len(after.ranks)
        for r, times in zip(after.ranks, result.kernel_time_by_source):
            k = after.ops(r)
            k = k[k["kind"] == 0]
            assert sum(times.values()) == pytest.approx(float(k["duration"].sum()), rel=1e-9)
            signed = float(k["duration"][k["sig"] >= 0].sum())
            assert times.get(int(CostSource.PROFILE), 0.0) == pytest.approx(signed, rel=1e-9)
            # unsigned kernels keep their recorded (roofline) cost
            b = before.ops(r)
            b = b[(b["kind"] == 0) & (b["sig"] < 0)]
            assert times.get(int(CostSource.ROOFLINE), 0.0) == pytest.approx(float(b["duration"].sum()), rel=1e-9)


def test_recosted_kernels_are_not_faster_than_the_roofline(recosted):
    """Every re-costed kernel lasts at least its GEMM's roofline floor on the H100's datasheet (989.4 bf16 TFLOP/s,
    3350 GB/s), FLOPs and bytes counted here from the signature's shapes."""
    from phantora.gpus import load_gpu
    from phantora.trace.reader import TraceReader

    _, out, _ = recosted
    h100 = load_gpu("h100-sxm-80gb")
    with TraceReader(out) as rd:
        sigs = rd.signatures
        for r in rd.ranks:
            ops = rd.ops(r)
            k = ops[(ops["kind"] == 0) & (ops["sig"] >= 0)]
            assert len(k)
            assert np.all(k["duration"] >= _signature_floor(h100, [sigs[s] for s in k["sig"].tolist()]))


@pytest.mark.parametrize("gpu", ["h100-sxm-80gb", "a100-sxm-80gb"])
def test_recosted_rows_respect_the_roofline_of_their_own_flops_and_bytes(trace, tmp_path, gpu):
    """Every signed kernel row of a re-costed trace lasts at least max(flops / peak, bytes / bandwidth) of the GPU's
    datasheet, from the row's own `flops` and `nbytes` columns: a trace row never claims to beat the hardware."""
    from phantora.gpus import load_gpu
    from phantora.trace.reader import TraceReader

    path, _ = trace
    out = tmp_path / "rows.h5"
    replay(path, gpu=gpu, recost=True, out=str(out))
    spec = load_gpu(gpu)
    with TraceReader(out) as rd:
        for r in rd.ranks:
            ops = rd.ops(r)
            k = ops[(ops["kind"] == 0) & (ops["sig"] >= 0)]
            assert len(k)
            assert np.all(k["duration"] >= _floor(spec, k["flops"], k["nbytes"]))


def test_recost_uses_the_profile_the_live_run_named(tmp_path):
    """A live run's `--profile` is kept in the trace's meta: re-costing on the same GPU takes it again (a copy of the
    H100 profile with one GEMM's median doubled costs that GEMM at the doubled time), and says so when it is gone."""
    import shutil

    import h5py

    from phantora.errors import PhantoraError
    from phantora.trace.reader import TraceReader

    own = tmp_path / "own.h5"
    shutil.copy(PROFILES / "h100-sxm-80gb.h5", own)
    spec = load_cluster("h100-hgx", nodes=2)
    streams, sigs, meta = fsdp_streams(spec, SyntheticModel(layers=2, seq=1024), iterations=2)
    measured = _h100_profile()
    held = [s for s in sigs if s in measured]
    assert held                                           # premise: the profile measured one of the GEMMs
    with h5py.File(own, "r+") as f:
        rec = f["records"][:]
        keys = [k.decode() if isinstance(k, bytes) else k for k in rec["key"]]
        rec["median_us"][keys.index(held[0])] *= 2
        f["records"][...] = rec
    path = tmp_path / "run.h5"
    simulate_streams(spec, streams, path, signatures=sigs, meta={**meta, "profile": str(own)})
    out = tmp_path / "recosted.h5"
    replay(path, recost=True, out=str(out))
    with TraceReader(out) as rd:
        s = rd.signatures.index(held[0])
        k = np.concatenate([rd.ops(r) for r in rd.ranks])
        mine = k[(k["kind"] == 0) & (k["sig"] == s)]
        assert len(mine) and np.allclose(mine["duration"], 2 * measured[held[0]] - _h100_event_overhead(), rtol=1e-9)
    own.unlink()
    with pytest.raises(PhantoraError, match="not there"):
        replay(path, recost=True)


def test_replay_models_the_allocator_the_run_used(tmp_path):
    """Peak reserved memory follows PyTorch's segment rules for the allocator setting in the trace's meta, and
    `alloc_conf` replays under another. A 3 MiB block takes a 20 MiB segment, a 12 MiB block the rest of it; both
    freed, a 25 MiB block does not fit in the cached 20 MiB: by default it gets its own 26 MiB segment (46 MiB
    reserved; the 1 MiB left over is not split off, so 26 MiB count as allocated), with expandable segments the free
    20 MiB grows by one 20 MiB page (40 MiB; blocks split whenever 512 B remain: 25 MiB allocated)."""
    from phantora.engine.ops import Op, OpKind

    MiB = 1 << 20
    spec = load_cluster("h100-hgx", nodes=1, gpus_per_node=1)
    ops = [Op(OpKind.ALLOC, stream=0, nbytes=3 * MiB, arg=1), Op(OpKind.ALLOC, stream=0, nbytes=12 * MiB, arg=2),
           Op(OpKind.FREE, nbytes=3 * MiB, arg=1), Op(OpKind.FREE, nbytes=12 * MiB, arg=2),
           Op(OpKind.ALLOC, stream=0, nbytes=25 * MiB, arg=3)]
    for conf, own, other, used in (("", 46, 40, 26), ("expandable_segments:True", 40, 46, 25)):
        path = tmp_path / f"alloc{len(conf)}.h5"
        simulate_streams(spec, {0: list(ops)}, path, meta={"allocator": conf})
        r = replay(path)
        assert r.allocator == conf and r.peak_reserved_bytes == {0: own * MiB}
        assert r.peak_allocated_bytes == {0: used * MiB}
        flipped = "" if conf else "expandable_segments:True"
        assert replay(path, alloc_conf=flipped).peak_reserved_bytes == {0: other * MiB}


def test_replay_names_the_model_constants_a_preset_changed_since_the_trace(tmp_path):
    """A trace keeps its cluster: replayed without --cluster it keeps the GPU-sharing factors it was recorded with,
    and the result names each constant its preset has changed since (the CLI prints them as a note); with --cluster
    the preset's own are used and nothing is named. The factors matter: the two replays' iterations differ."""
    old = load_cluster("h100-hgx", nodes=2, overrides=["nccl.sharing_compute=1.0", "nccl.sharing_memory=1.0"])
    streams, sigs, meta = fsdp_streams(old, SyntheticModel(layers=2, seq=1024), iterations=3)
    path = tmp_path / "old.h5"
    simulate_streams(old, streams, path, signatures=sigs, meta=meta)
    kept = replay(path)
    today = load_cluster("h100-hgx", nodes=2)
    named = {d.split(" ")[0] for d in kept.preset_drift}
    assert named == {"nccl.sharing_compute", "nccl.sharing_memory"}
    assert all(f"(preset: {getattr(today.nccl, k.split('.')[1])})" in d
               for k, d in zip(sorted(named), sorted(kept.preset_drift)))
    fresh = replay(path, cluster="h100-hgx", nodes=2)
    assert fresh.preset_drift == []
    # a constant the user sets (--set) is the user's, not a change of the preset: not named
    own = replay(path, overrides=("nccl.sharing_compute=1.5",))
    assert {d.split(" ")[0] for d in own.preset_drift} == {"nccl.sharing_memory"}
    assert fresh.iteration_s > kept.iteration_s            # today's factors slow the compute beside collectives
    runner = CliRunner().invoke(main, ["replay", str(path)])
    assert runner.exit_code == 0 and "nccl.sharing_compute 1.0 (preset: " in runner.output


def test_a_forced_algorithm_says_where_it_did_not_apply(trace):
    """NCCL has tree for all-reduce alone: `--algo tree` on an FSDP trace (all-gathers and reduce-scatters) applies
    nowhere, and the replay must say so, with each collective's count from the trace itself, rather than print
    figures that look like tree's; `--algo ring`, which every collective has, adds no note."""
    from phantora.trace.reader import TraceReader

    path, _ = trace
    with TraceReader(path) as reader:
        names = [reader.names[int(i)] for i in reader.collectives["name"]]
    counts = {n: names.count(n) for n in set(names)}
    assert "all_reduce" not in counts and counts
    r = replay(path, algo="tree")
    assert f"applied to 0 of {len(names)} collectives" in r.forced
    for name, n in counts.items():
        assert f"{name} {n}" in r.forced
    assert replay(path, algo="ring").forced == ""
    res = CliRunner().invoke(main, ["replay", str(path), "--algo", "tree"])
    assert res.exit_code == 0 and "kept NCCL's own choice" in res.output, res.output


def test_fields_only_a_live_run_applies_are_named_not_silently_ignored(trace):
    """The ranks' software, host-compute rates and conversion prices reach a run through its ranks; a replay keeps
    the durations the trace recorded. `replay --set host.cpu_cores=1` says so, and a sweep over such a field, whose
    rows would all read the trace's figures as "no sensitivity", is refused naming the field."""
    path, _ = trace
    res = CliRunner().invoke(main, ["replay", str(path), "--set", "host.cpu_cores=1", "--set",
                                    "net.inter_node_gbps=100"])
    assert res.exit_code == 0 and "note: --set host.cpu_cores: only a live run applies this" in res.output, res.output
    res = CliRunner().invoke(main, ["sweep", str(path), "--vary", "host.cpu_cores=1,64"])
    assert res.exit_code != 0 and "--vary host.cpu_cores: only a live run applies it" in res.output, res.output
    res = CliRunner().invoke(main, ["replay", str(path), "--set", "net.inter_node_gbps=100"])
    assert "only a live run" not in res.output
