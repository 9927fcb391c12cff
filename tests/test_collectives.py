"""Collective times against NCCL's published cost model and reported nccl-tests measurements.

Sources (see docs/network-model.md):
- NCCL src/graph/topo.h: per-link NVLink bandwidth 20.0 GB/s (SM80), 20.6 GB/s (SM90); NICs 12 GB/s per 100 Gb/s.
- NCCL src/graph/tuning.cc: base latency Ring/LL 6.6 us, NVLink per-step latency Ring/LL 0.6 us.
- nccl-tests doc/PERFORMANCE.md: busbw = algbw * 2(n-1)/n (all_reduce), (n-1)/n (all_gather, reduce_scatter, alltoall).
- nccl-tests issues #212/#290: H100 8-GPU NVLink ring collectives reach ~370 GB/s busbw (NVLS up to ~480).
- nccl-tests #175: A100 8-GPU all_reduce ~230-233 GB/s busbw.
- nccl-tests #267: H100 multi-node alltoall ~48-49 GB/s busbw (one 400 Gb/s NIC per GPU cannot be aggregated).
"""

import pytest

from phantora.cluster import load_cluster
from phantora.net.bench import bench, sizes
from phantora.net.collectives import busbw_factor
from phantora.net.network import Network

GiB = 2**30


def busbw(spec, op, size, **kw):
    net = Network(spec)
    ranks = tuple(range(spec.world_size))
    inp = size // len(ranks) if op == "all_gather" else size
    t, plan = net.time_alone(op, ranks, inp, **kw)
    return size / t * busbw_factor(op, len(ranks)) / 1e9, t, plan


def test_h100_node_all_reduce_reaches_nvlink_busbw():
    bw, _, _ = busbw(load_cluster("h100-hgx"), "all_reduce", GiB)
    # bounded by 18 links x 20.6 GB/s = 370.8 GB/s (no NVLS), and nccl-tests report ~370 for ring
    assert bw <= 18 * 20.6 * 1.0001
    assert 360 <= bw <= 480


def test_a100_node_all_reduce_matches_reported():
    bw, _, _ = busbw(load_cluster("a100-hgx"), "all_reduce", GiB)
    assert bw <= 12 * 20.0 * 1.0001
    assert bw == pytest.approx(232, rel=0.05)


def test_all_gather_and_reduce_scatter_saturate_nvlink():
    spec = load_cluster("h100-hgx")
    for op in ("all_gather", "reduce_scatter"):
        bw, _, _ = busbw(spec, op, 4 * GiB)
        assert 0.95 * 370.8 <= bw <= 370.8 * 1.0001


def test_two_nodes_reflect_the_rails():
    # 16 GPUs on 2 nodes, ring: every ring crosses nodes through one 400 Gb/s NIC per rail; the bus bandwidth is
    # bounded by 8 NICs x 48 GB/s and by NVLink, and scales with the NIC rate once the NICs are the bottleneck.
    full = load_cluster("h100-hgx", nodes=2)
    bw400, _, plan = busbw(full, "all_reduce", 4 * GiB, algo="ring")
    assert bw400 <= min(8 * 48.0, 370.8) * 1.0001
    assert bw400 >= 0.9 * min(8 * 48.0, 370.8)
    for gbps in (200, 100):
        slow = load_cluster("h100-hgx", nodes=2, overrides=[f"net.inter_node_gbps={gbps}"])
        bw, _, _ = busbw(slow, "all_reduce", 4 * GiB, algo="ring")
        assert bw == pytest.approx(8 * 48.0 * gbps / 400, rel=0.03)


def test_fewer_nics_lower_multi_node_bandwidth():
    eight = busbw(load_cluster("h100-hgx", nodes=2), "all_gather", 4 * GiB)[0]
    four = busbw(load_cluster("h100-hgx", nodes=2, overrides=["net.nics_per_node=4"]), "all_gather", 4 * GiB)[0]
    assert four < 0.6 * eight


def test_tiny_all_reduce_costs_nccl_latency():
    # 8 B on one A100 node: NCCL picks Ring/LL; latency = 6.6 + 2(n-1) * 0.6 us = 15.0 us, bandwidth negligible
    _, t, plan = busbw(load_cluster("a100-hgx"), "all_reduce", 8)
    assert (plan.algo, plan.proto) == ("ring", "LL")
    assert t * 1e6 == pytest.approx(6.6 + 2 * 7 * 0.6, rel=0.01)
    # on an H100 node NCCL picks the same, and the call costs at least the per-call latency measured on 2 Hopper
    # GPUs (nccl.LATENCY_FLOORS)
    _, t, plan = busbw(load_cluster("h100-hgx"), "all_reduce", 8)
    assert (plan.algo, plan.proto) == ("ring", "LL")
    assert t * 1e6 == pytest.approx(max(6.6 + 2 * 7 * 0.6, 22.5), rel=0.01)


def test_multi_node_latency_uses_network_steps():
    # 2 nodes, tiny: NCCL's tree/LL latency 6.8 + 2 * ((ppn-1) * 0.6 * 1.8 + log2(2) * 5.0) us
    _, t, plan = busbw(load_cluster("h100-hgx", nodes=2), "all_reduce", 8)
    expected_tree_ll = 6.8 + 2 * (7 * 0.6 * 1.8 + 1 * 5.0)
    assert t * 1e6 <= expected_tree_ll * 1.01  # NCCL picks the cheapest; tree/LL is a candidate
    assert t * 1e6 >= 6.6                        # never below the base latency


@pytest.mark.parametrize("op", ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all"])
def test_busbw_rises_with_size_and_saturates(op):
    spec = load_cluster("h100-hgx")
    rows = bench(spec, op, sizes(1024, 8 * GiB, 8))
    bws = [r.busbw for r in rows]
    for a, b in zip(bws, bws[1:]):
        assert b >= a * 0.97, (op, bws)
    # saturated at the top: close to the per-GPU NVLink bound (18 x 20.6 GB/s), never above it
    assert 0.95 * 370.8 <= bws[-1] <= 370.8 * 1.0001
    assert bws[-1] / bws[-2] < 1.1
    assert bws[0] < 0.1 * bws[-1]                    # latency-bound at the bottom


def test_all_to_all_across_nodes_is_nic_bound():
    spec = load_cluster("h100-hgx", nodes=16)
    bw, _, _ = busbw(spec, "all_to_all", 4 * GiB)
    assert 40 <= bw <= 56


def test_send_recv_bandwidth_is_the_link():
    net = Network(load_cluster("h100-hgx", nodes=2))
    size = 4 * GiB
    t_intra, _ = net.time_alone("send_recv", (0, 1), size)
    t_inter, _ = net.time_alone("send_recv", (0, 8), size)
    assert size / t_intra / 1e9 == pytest.approx(18 * 20.6, rel=0.02)
    assert size / t_inter / 1e9 == pytest.approx(48.0, rel=0.02)


def test_concurrent_collectives_on_disjoint_groups_do_not_interfere_but_shared_links_do():
    spec = load_cluster("h100-hgx", nodes=2)
    net = Network(spec)
    a = net.plan("all_reduce", tuple(range(8)), GiB, algo="ring")
    b = net.plan("all_reduce", tuple(range(8, 16)), GiB, algo="ring")
    net.start(1, a)
    net.start(2, b)
    done = dict(net.sim.run())
    alone, _ = Network(spec).time_alone("all_reduce", tuple(range(8)), GiB, algo="ring")
    assert done[1] == pytest.approx(alone, rel=1e-6) and done[2] == pytest.approx(alone, rel=1e-6)
    # two all-reduces over the same 8 GPUs share every NVLink: each takes about twice as long
    net2 = Network(spec)
    net2.start(1, a)
    net2.start(2, net2.plan("all_reduce", tuple(range(8)), GiB, algo="ring"))
    done2 = dict(net2.sim.run())
    bw_part = alone - a.latency_s
    assert done2[1] == pytest.approx(2 * bw_part + a.latency_s, rel=0.02)


def test_a_forced_algorithm_applies_where_nccl_has_it():
    """`--algo tree` (NCCL_ALGO=Tree): NCCL's tree is an all-reduce algorithm; the other collectives of the run keep
    NCCL's choice (a run that all-gathers failed on every collective), and a two-rank all-reduce, which NCCL's own
    choice leaves to ring, takes tree when forced. Tree's time is then NCCL's tree model: not that of ring."""
    net = Network(load_cluster("h100-hgx", nodes=2, gpus_per_node=1))
    ranks = (0, 1)
    _, ag = net.time_alone("all_gather", ranks, 4 << 20, algo="tree")
    assert ag.algo == "ring"
    t_tree, ar = net.time_alone("all_reduce", ranks, 64 << 20, algo="tree")
    t_ring, ring = net.time_alone("all_reduce", ranks, 64 << 20, algo="ring")
    assert (ar.algo, ring.algo) == ("tree", "ring") and t_tree != t_ring
