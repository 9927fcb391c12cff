"""Cluster presets become graphs whose routes are real paths with the capacities the presets describe."""

import networkx as nx
import pytest

from phantora.cluster import list_clusters, load_cluster
from phantora.net.topology import Topology


def _assert_path(topo, src, dst, channel=0):
    nodes = topo.route_nodes(src, dst, channel)
    assert nodes[0] == f"gpu{src}" and nodes[-1] == f"gpu{dst}"
    for a, b in zip(nodes, nodes[1:]):
        assert topo.graph.has_edge(a, b)
    return nodes


@pytest.mark.parametrize("name", list_clusters())
def test_every_preset_builds_and_routes(name):
    spec = load_cluster(name, nodes=2) if load_cluster(name).net.nics_per_node else load_cluster(name)
    topo = Topology(spec)
    n = spec.world_size
    for src in range(n):
        for dst in range(n):
            if src != dst:
                _assert_path(topo, src, dst, channel=src % 3)


def test_same_rail_routes_are_shortest_paths():
    topo = Topology(load_cluster("h100-hgx", nodes=4, overrides=["net.nodes_per_leaf=2"]))
    G = topo.gpus_per_node
    for src in (0, 3, 7):
        for node in (1, 2, 3):
            dst = node * G + src % G  # same local index = same rail
            nodes = _assert_path(topo, src, dst)
            assert len(nodes) - 1 == nx.shortest_path_length(topo.graph, f"gpu{src}", f"gpu{dst}")


def test_hgx_capacities_follow_nccl_constants():
    # NCCL src/graph/topo.h: SM90 NVLink 20.6 GB/s per link; DGX H100 has 18 links per GPU; 400 Gb/s NICs at
    # 12 GB/s per 100 Gb/s.
    topo = Topology(load_cluster("h100-hgx", nodes=2))
    nv = topo.capacity[topo.link_id("gpu0", "nvsw0")]
    assert nv == pytest.approx(18 * 20.6e9)
    nic = topo.capacity[topo.link_id("nic0.0", topo.route_nodes(0, 8)[2])]
    assert nic == pytest.approx(4 * 12e9)


def test_oversubscription_reduces_uplinks():
    a = Topology(load_cluster("h100-hgx", nodes=4, overrides=["net.nodes_per_leaf=2"]))
    b = Topology(load_cluster("h100-hgx", nodes=4, overrides=["net.nodes_per_leaf=2", "net.oversubscription=4"]))
    up_a = sum(l.capacity for l in a.links if l.kind == "uplink")
    up_b = sum(l.capacity for l in b.links if l.kind == "uplink")
    assert up_b == pytest.approx(up_a / 4)
