"""Replay throughput on recorded synthetic FSDP traces (32 layers, 4 iterations) of 8 x H100 (one node) and
16 x H100 (two nodes). Reports the median replay ops/s (`ReplayResult.ops_per_s`: reading the op tables,
simulating and building the new rows) in extra_info; run with
`python -m pytest tests/benchmarks --benchmark-enable -k replay`."""

import statistics

import pytest

from phantora.cluster import load_cluster
from phantora.replay import replay
from phantora.simulate import simulate_streams
from phantora.synthetic import SyntheticModel, fsdp_streams


@pytest.fixture(scope="module", params=[1, 2], ids=["1node", "2nodes"])
def trace(request, tmp_path_factory):
    spec = load_cluster("h100-hgx", nodes=request.param)
    streams, sigs, meta = fsdp_streams(spec, SyntheticModel(layers=32), iterations=4)
    path = tmp_path_factory.mktemp("b") / "run.h5"
    simulate_streams(spec, streams, path, signatures=sigs, meta=meta)
    replay(path)   # warm-up: first-use imports and caches of the process
    return path


def test_replay_throughput(benchmark, trace):
    rates = []

    def once():
        r = replay(trace)
        rates.append(r.ops_per_s)
        return r

    result = benchmark.pedantic(once, rounds=7, iterations=1)
    benchmark.extra_info["ops"] = result.n_ops
    benchmark.extra_info["median_ops_per_s"] = statistics.median(rates)
    benchmark.extra_info["max_ops_per_s"] = max(rates)
    print(f"\nreplay of {result.n_ops} ops: median {statistics.median(rates):,.0f} ops/s, "
          f"best {max(rates):,.0f} ops/s over {len(rates)} rounds")
    assert result.iterations_s == result.recorded_iterations_s
