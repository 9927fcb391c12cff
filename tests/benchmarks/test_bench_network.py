"""Benchmarks (run with `pytest tests/benchmarks --benchmark-enable`)."""

from phantora.cluster import load_cluster
from phantora.net.network import Network


def test_ring_all_reduce_1024_gpus(benchmark):
    """A 1 GiB ring all-reduce over 1024 GPUs (128 HGX H100 nodes) through the flow simulator."""
    spec = load_cluster("h100-hgx", nodes=128)
    ranks = tuple(range(spec.world_size))

    def run():
        net = Network(spec)
        return net.time_alone("all_reduce", ranks, 2**30, algo="ring")[0]

    t = benchmark(run)
    assert t > 0
