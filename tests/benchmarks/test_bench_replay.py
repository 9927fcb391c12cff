"""Replay throughput on a recorded (synthetic FSDP, 8 x H100) trace; reports ops/s in extra_info."""

import pytest

from phantora.cluster import load_cluster
from phantora.replay import replay
from phantora.simulate import simulate_streams
from phantora.synthetic import SyntheticModel, fsdp_streams


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    spec = load_cluster("h100-hgx")
    streams, sigs, meta = fsdp_streams(spec, SyntheticModel(layers=32), iterations=4)
    path = tmp_path_factory.mktemp("b") / "run.h5"
    simulate_streams(spec, streams, path, signatures=sigs, meta=meta)
    return path


def test_replay_throughput(benchmark, trace):
    result = benchmark.pedantic(replay, args=(trace,), rounds=3, iterations=1)
    benchmark.extra_info["ops"] = result.n_ops
    benchmark.extra_info["ops_per_s"] = result.ops_per_s
    assert result.iterations_s == result.recorded_iterations_s
