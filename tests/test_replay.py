"""Replay reproduces a recorded run exactly and responds physically to a changed cluster."""

import json

import numpy as np
import pytest
from click.testing import CliRunner

from phantora.cli import main
from phantora.cluster import load_cluster
from phantora.replay import replay
from phantora.simulate import simulate_streams
from phantora.synthetic import SyntheticModel, fsdp_streams


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


def test_recosted_kernels_last_their_new_duration(trace):
    """On another GPU kernels are re-costed from their signatures: each signed kernel's row says the new cost
    model's estimate (the one live runs use: own profile, else a same-architecture GPU's across, else roofline) and
    lasts exactly that long on its stream."""
    from phantora.costmodel.select import default_cost_model
    from phantora.costmodel.signature import Signature
    from phantora.gpus import load_gpu
    from phantora.trace.reader import TraceReader

    path, _ = trace
    out = path.parent / "a100.h5"
    replay(path, gpu="a100-sxm-80gb", out=str(out))
    model = default_cost_model(load_gpu("a100-sxm-80gb"))
    with TraceReader(out) as rd:
        sigs = rd.signatures
        for r in rd.ranks:
            ops = rd.ops(r)
            k = ops[(ops["kind"] == 0) & (ops["sig"] >= 0)]
            assert len(k)
            assert np.allclose(k["end"] - k["start"], k["duration"], rtol=1e-9, atol=1e-15)
            expect = {s: model.estimate(Signature.from_key(sigs[s])) for s in np.unique(k["sig"]).tolist()}
            assert k["duration"].tolist() == [expect[s].duration_s for s in k["sig"].tolist()]
            assert k["source"].tolist() == [int(expect[s].source) for s in k["sig"].tolist()]
