"""A cluster preset as a networkx graph of GPUs, switches, NICs and links, with fast structural routing.

Every directed link has an integer id, a capacity (bytes/s, achievable rather than nominal) and a latency (s). Nodes:
``gpu{r}``, ``nvsw{n}`` (the NVSwitch fabric of node n), ``pcie{n}`` (its PCIe switch), ``nic{n}.{k}``,
``leaf{rail}.{pod}`` / ``leaf{pod}``, ``spine{s}`` and ``switch`` (single-switch networks).

Routes are computed from the known structure (fast enough for thousands of flows) and are shortest paths in the graph;
between leaves the spine is chosen by ECMP hashing of (source, destination, channel).
"""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx
import numpy as np

from ..cluster import ClusterSpec
from ..errors import PresetError


@dataclass(frozen=True)
class LinkInfo:
    id: int
    src: str
    dst: str
    kind: str          # nvlink | pcie | nic | uplink
    capacity: float    # bytes/s
    latency: float     # s


def ecmp_hash(src: int, dst: int, channel: int) -> int:
    """A well-mixed deterministic hash of a flow's identity (stands in for the switches' 5-tuple hash)."""
    h = (src * 0x9E3779B1 ^ dst * 0x85EBCA77 ^ channel * 0xC2B2AE3D) & 0xFFFFFFFF
    h ^= h >> 16
    h = (h * 0x7FEB352D) & 0xFFFFFFFF
    h ^= h >> 15
    h = (h * 0x846CA68B) & 0xFFFFFFFF
    return h ^ (h >> 16)


class Topology:
    def __init__(self, spec: ClusterSpec):
        self.spec = spec
        self.nodes = spec.nodes
        self.gpus_per_node = spec.gpus_per_node
        self.world_size = spec.world_size
        self.graph = nx.DiGraph()
        self._links: list[LinkInfo] = []
        self._ids: dict[tuple[str, str], int] = {}
        self._route_cache: dict[tuple[int, int, int], np.ndarray] = {}
        nics = spec.net.nics_per_node if spec.nodes > 1 or spec.net.nics_per_node else 0
        if nics > spec.gpus_per_node:
            raise PresetError(f"{nics} NICs per node and {spec.gpus_per_node} GPUs per node: more NICs than GPUs "
                              f"per node is not modelled; for nodes of {spec.gpus_per_node} GPUs pass --set "
                              f"net.nics_per_node={spec.gpus_per_node} (or fewer)", key="net.nics_per_node")
        self.nics_per_node = nics
        self.pods = -(-spec.nodes // spec.net.nodes_per_leaf)
        self._build()
        self.capacity = np.array([l.capacity for l in self._links], dtype=np.float64)
        self.latency = np.array([l.latency for l in self._links], dtype=np.float64)

    # ----------------------------------------------------------------------------------------------------- building
    def _add(self, a: str, b: str, kind: str, capacity: float, latency: float, both: bool = True) -> None:
        for s, d in ((a, b), (b, a)) if both else ((a, b),):
            lid = len(self._links)
            self._links.append(LinkInfo(lid, s, d, kind, capacity, latency))
            self._ids[(s, d)] = lid
            self.graph.add_edge(s, d, id=lid, kind=kind, capacity=capacity, latency=latency)

    def _build(self) -> None:
        spec = self.spec
        intra, net = spec.intra, spec.net
        G = self.gpus_per_node
        hop = intra.hop_latency_us * 1e-6
        for n in range(self.nodes):
            for i in range(G):
                self.graph.add_node(f"gpu{n * G + i}", kind="gpu", node=n, local=i)
            if intra.kind == "nvswitch":
                self.graph.add_node(f"nvsw{n}", kind="nvswitch", node=n)
                for i in range(G):
                    self._add(f"gpu{n * G + i}", f"nvsw{n}", "nvlink", intra.gpu_nvlink_bytes_per_s, hop / 2)
            elif intra.kind == "nvlink-mesh":
                per_pair = intra.gpu_nvlink_bytes_per_s / max(G - 1, 1)
                for i in range(G):
                    for j in range(i + 1, G):
                        self._add(f"gpu{n * G + i}", f"gpu{n * G + j}", "nvlink", per_pair, hop)
            if intra.kind == "pcie":
                self.graph.add_node(f"pcie{n}", kind="pcie", node=n)
                for i in range(G):
                    self._add(f"gpu{n * G + i}", f"pcie{n}", "pcie", intra.pcie_gbyte_per_s * 1e9, hop / 2)
        if not self.nics_per_node:
            return
        nic_bw = net.nic_bytes_per_s
        sw_hop = net.hop_latency_us * 1e-6
        K = self.nics_per_node
        for n in range(self.nodes):
            pod = n // net.nodes_per_leaf
            for k in range(K):
                nic = f"nic{n}.{k}"
                self.graph.add_node(nic, kind="nic", node=n, rail=k)
                if intra.kind == "pcie":
                    self._add(f"pcie{n}", nic, "pcie", intra.pcie_gbyte_per_s * 1e9, 0.0)
                else:
                    # GPUDirect RDMA: each NIC hangs off the PCIe switch of its GPU(s)
                    for i in range(k * G // K, (k + 1) * G // K):
                        self._add(f"gpu{n * G + i}", nic, "pcie", intra.pcie_gbyte_per_s * 1e9, 0.0)
                self._add(nic, self._leaf_name(k, pod), "nic", nic_bw, sw_hop)
        if net.topology == "single-switch" or self._n_leaves() == 1:
            return
        # leaf-spine: each leaf has `spines` uplinks sharing downlink bandwidth / oversubscription
        for leaf in self._leaves():
            down = sum(1 for _ in self.graph.predecessors(leaf)) * nic_bw
            up_each = down / net.oversubscription / net.spines
            for s in range(net.spines):
                self._add(leaf, f"spine{s}", "uplink", up_each, sw_hop)

    def _leaf_name(self, rail: int, pod: int) -> str:
        topo = self.spec.net.topology
        if topo == "single-switch":
            return "switch"
        if topo == "rail-leaf-spine":
            return f"leaf{rail}.{pod}"
        return f"leaf{pod}"

    def _n_leaves(self) -> int:
        return len(self._leaves())

    def _leaves(self) -> list[str]:
        return sorted({n for n, d in self.graph.nodes(data=True) if n.startswith(("leaf", "switch"))})

    # ----------------------------------------------------------------------------------------------------- queries
    @property
    def links(self) -> list[LinkInfo]:
        return self._links

    def link_id(self, a: str, b: str) -> int:
        return self._ids[(a, b)]

    def node_of(self, rank: int) -> int:
        return rank // self.gpus_per_node

    def nic_of(self, rank: int) -> int:
        """Rail index of the NIC nearest to a GPU."""
        local = rank % self.gpus_per_node
        return local * self.nics_per_node // self.gpus_per_node

    def route(self, src: int, dst: int, channel: int = 0) -> np.ndarray:
        """Link ids from GPU `src` to GPU `dst` (global ranks)."""
        key = (src, dst, channel)
        r = self._route_cache.get(key)
        if r is None:
            r = np.array(self._route_ids(src, dst, channel), dtype=np.int64)
            self._route_cache[key] = r
        return r

    def route_nodes(self, src: int, dst: int, channel: int = 0) -> list[str]:
        ids = self.route(src, dst, channel)
        if len(ids) == 0:
            return [f"gpu{src}"]
        return [self._links[ids[0]].src] + [self._links[i].dst for i in ids]

    def _route_ids(self, src: int, dst: int, channel: int) -> list[int]:
        if src == dst:
            return []
        G = self.gpus_per_node
        ns, nd = src // G, dst // G
        gs, gd = f"gpu{src}", f"gpu{dst}"
        ids = self._ids
        kind = self.spec.intra.kind
        if ns == nd:
            if kind == "pcie":
                return [ids[(gs, f"pcie{ns}")], ids[(f"pcie{ns}", gd)]]
            return self._intra(gs, gd, ns)
        if not self.nics_per_node:
            raise PresetError("ranks on different nodes but the cluster has no network", key="net.nics_per_node")
        ks, kd = self.nic_of(src), self.nic_of(dst)
        path: list[int] = []
        if kind == "pcie":
            path += [ids[(gs, f"pcie{ns}")], ids[(f"pcie{ns}", f"nic{ns}.{ks}")]]
        elif ks != kd and self.spec.net.topology == "rail-leaf-spine":
            # PXN (NCCL >= 2.12): move the data over NVLink to the GPU whose NIC is on the destination's rail, so the
            # network traffic stays on one rail instead of crossing the spine
            proxy = f"gpu{ns * G + kd * G // self.nics_per_node}"
            path += self._intra(gs, proxy, ns)
            ks = kd
            path.append(ids[(proxy, f"nic{ns}.{ks}")])
        else:
            path.append(ids[(gs, f"nic{ns}.{ks}")])
        nic_s, nic_d = f"nic{ns}.{ks}", f"nic{nd}.{kd}"
        npl = self.spec.net.nodes_per_leaf
        leaf_s = self._leaf_name(ks, ns // npl)
        leaf_d = self._leaf_name(kd, nd // npl)
        path.append(ids[(nic_s, leaf_s)])
        if leaf_s != leaf_d:
            spine = f"spine{ecmp_hash(src, dst, channel) % self.spec.net.spines}"
            path += [ids[(leaf_s, spine)], ids[(spine, leaf_d)]]
        path.append(ids[(leaf_d, nic_d)])
        if kind == "pcie":
            path += [ids[(nic_d, f"pcie{nd}")], ids[(f"pcie{nd}", gd)]]
        else:
            path.append(ids[(nic_d, gd)])
        return path

    def _intra(self, a: str, b: str, node: int) -> list[int]:
        if a == b:
            return []
        ids = self._ids
        if self.spec.intra.kind == "nvswitch":
            return [ids[(a, f"nvsw{node}")], ids[(f"nvsw{node}", b)]]
        return [ids[(a, b)]]

    def path_latency(self, route: np.ndarray) -> float:
        return float(self.latency[route].sum()) if len(route) else 0.0

    def describe(self) -> str:
        kinds: dict[str, int] = {}
        for l in self._links:
            kinds[l.kind] = kinds.get(l.kind, 0) + 1
        parts = ", ".join(f"{v} {k}" for k, v in sorted(kinds.items()))
        return (f"{self.spec.name}: {self.nodes} node(s) x {self.gpus_per_node} GPU ({self.spec.gpu}), "
                f"{self.graph.number_of_nodes()} vertices, {len(self._links)} directed links ({parts})")
