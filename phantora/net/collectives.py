"""Collectives decomposed the way NCCL runs them, as bulk flows on the topology plus NCCL's latency term.

Sizes follow nccl-tests: `size` is the all_reduce buffer, the gathered output of all_gather, the input of
reduce_scatter, the send buffer of all_to_all, the buffer of broadcast/reduce/send.

Patterns (n ranks, C channels, S bytes):
- ring all_reduce: C rings; every ring edge carries 2(n-1)/n * S / C (reduce-scatter then all-gather, pipelined);
- ring all_gather / reduce_scatter: every ring edge carries (n-1)/n * S / C;
- broadcast / reduce: a pipelined chain from (to) the root along each ring, S / C per edge;
- tree all_reduce (NCCL's double binary tree): two trees over the nodes, each moving S/2; in each node a chain through
  its GPUs; every tree and chain edge carries its share up (reduce) and down (broadcast) concurrently;
- all_to_all: pairwise, S/n from every rank to every other rank;
- send/recv: one flow of S.
Across nodes there is one ring (and tree) channel per NIC rail; each node is entered and left through NICs of the same
rail, so inter-node traffic stays on its rail's leaf switch as NCCL's rail-aligned rings do.
The bandwidth part of a collective's time comes from simulating these flows (with protocol overhead applied as extra
bytes), the latency part from NCCL's tuning model; the (algorithm, protocol) pair is the one NCCL's model would pick.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from . import nccl
from .topology import Topology

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all", "barrier",
               "send_recv")


def busbw_factor(op: str, n: int) -> float:
    """nccl-tests' busbw / algbw ratio (doc/PERFORMANCE.md)."""
    if n <= 1:
        return 1.0
    if op in ("all_reduce", "barrier"):
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


def nccl_size(op: str, input_bytes: int, n: int) -> int:
    """The nccl-tests size of a collective from the bytes of one rank's input buffer."""
    if op == "all_gather":
        return input_bytes * n
    if op == "barrier":
        return 4
    return input_bytes


@dataclass
class Plan:
    op: str
    algo: str
    proto: str
    size: int                  # nccl-tests size, bytes
    latency_s: float
    src: np.ndarray            # flow sources (global ranks)
    dst: np.ndarray
    flow_bytes: np.ndarray     # bytes each flow moves, protocol overhead included
    channel: np.ndarray
    predicted_s: float         # NCCL-model time on an idle network (latency + size / algbw)


class CollectivePlanner:
    """Chooses algorithm and protocol and lays out the flows of one collective on a topology."""

    def __init__(self, topo: Topology):
        self.topo = topo
        spec = topo.spec
        self.arch = nccl.arch_of(spec.gpu_spec().sm_version)
        self.intra_hw = "pci" if spec.intra.kind == "pcie" else "nvlink"
        self.algos = tuple(a for a in nccl.ALGOS if a in spec.nccl.algorithms)
        self.protos = tuple(p for p in nccl.PROTOS if p in spec.nccl.protocols)
        self.channels = spec.nccl.channels or (16 if self.intra_hw == "nvlink" else 2)
        self.ll128 = self.intra_hw == "nvlink" and spec.gpu_spec().sm_version >= 80
        self._rings: dict[tuple[int, ...], list[list[int]]] = {}
        self._pattern: dict[tuple, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}
        self._raw: dict[tuple, float] = {}

    # ------------------------------------------------------------------------------------------------ rings
    def rings(self, ranks: tuple[int, ...]) -> list[list[int]]:
        r = self._rings.get(ranks)
        if r is None:
            r = self._make_rings(ranks)
            self._rings[ranks] = r
        return r

    def _make_rings(self, ranks: tuple[int, ...]) -> list[list[int]]:
        topo = self.topo
        by_node: dict[int, list[int]] = {}
        for r in ranks:
            by_node.setdefault(topo.node_of(r), []).append(r)
        nodes = sorted(by_node)
        if len(nodes) == 1:
            members = sorted(ranks)
            if topo.spec.intra.kind == "nvlink-mesh" and len(members) > 2:
                return self._mesh_rings(members)
            return [members]
        n_ch = max(1, topo.nics_per_node)
        rings = []
        for c in range(n_ch):
            ring: list[int] = []
            for k, node in enumerate(nodes):
                local = sorted(by_node[node])
                m = len(local)
                e = (c - k) % m
                ring += [local[(e + j) % m] for j in range(m)]
            rings.append(ring)
        return rings

    @staticmethod
    def _mesh_rings(members: list[int]) -> list[list[int]]:
        """Rings that use every NVLink pair of a fully connected node evenly (NCCL searches such a set)."""
        first, rest = members[0], members[1:]
        if len(members) <= 5:
            return [[first, *p] for p in itertools.permutations(rest)]
        m = len(members)
        return [[members[(i * s) % m] for i in range(m)] for s in range(1, m) if np.gcd(s, m) == 1]

    # ------------------------------------------------------------------------------------------------ patterns
    def pattern(self, op: str, algo: str, ranks: tuple[int, ...], root: int = 0):
        """(src, dst, fraction of S per flow, channel) arrays; cached."""
        key = (op, algo, ranks, root if op in ("broadcast", "reduce") else 0)
        p = self._pattern.get(key)
        if p is None:
            p = self._make_pattern(op, algo, ranks, root)
            self._pattern[key] = p
        return p

    def _make_pattern(self, op: str, algo: str, ranks: tuple[int, ...], root: int):
        n = len(ranks)
        src: list[int] = []
        dst: list[int] = []
        frac: list[float] = []
        chan: list[int] = []
        if op == "all_to_all":
            for i in ranks:
                for j in ranks:
                    if i != j:
                        src.append(i); dst.append(j); frac.append(1.0 / n); chan.append(0)
        elif op == "all_reduce" and algo == "tree":
            self._tree_pattern(ranks, src, dst, frac, chan)
        else:
            rings = self.rings(ranks)
            C = len(rings)
            if op in ("all_reduce", "barrier"):
                per_edge = 2 * (n - 1) / n / C
            elif op in ("all_gather", "reduce_scatter"):
                per_edge = (n - 1) / n / C
            else:  # broadcast / reduce: a chain starting at the root
                per_edge = 1.0 / C
            for c, ring in enumerate(rings):
                m = len(ring)
                if op in ("broadcast", "reduce"):
                    start = ring.index(ranks[root]) if 0 <= root < n else 0
                    order = [ring[(start + j) % m] for j in range(m)]
                    edges = list(zip(order[:-1], order[1:]))
                    if op == "reduce":
                        edges = [(b, a) for a, b in edges]
                else:
                    edges = [(ring[j], ring[(j + 1) % m]) for j in range(m)]
                for a, b in edges:
                    src.append(a); dst.append(b); frac.append(per_edge); chan.append(c)
        return (np.array(src, dtype=np.int64), np.array(dst, dtype=np.int64), np.array(frac), np.array(chan, dtype=np.int64))

    def _tree_pattern(self, ranks, src, dst, frac, chan) -> None:
        topo = self.topo
        by_node: dict[int, list[int]] = {}
        for r in ranks:
            by_node.setdefault(topo.node_of(r), []).append(r)
        nodes = sorted(by_node)
        N = len(nodes)
        C = max(1, topo.nics_per_node) if N > 1 else 1
        share = 1.0 / (2 * C)
        for t in range(2):
            order = nodes if t == 0 else nodes[::-1]
            for c in range(C):
                leaders = {}
                for node in nodes:
                    local = sorted(by_node[node])
                    m = len(local)
                    s = c % m
                    chain = [local[(s + j) % m] for j in range(m)]
                    leaders[node] = chain[0]
                    for a, b in zip(chain[:-1], chain[1:]):
                        for x, y in ((b, a), (a, b)):  # up (reduce) and down (broadcast)
                            src.append(x); dst.append(y); frac.append(share); chan.append(c)
                for i in range(1, N):
                    child, parent = leaders[order[i]], leaders[order[(i - 1) // 2]]
                    for x, y in ((child, parent), (parent, child)):
                        src.append(x); dst.append(y); frac.append(share); chan.append(c)

    def paths(self, src: np.ndarray, dst: np.ndarray, chan: np.ndarray) -> list[np.ndarray]:
        route = self.topo.route
        return [route(int(a), int(b), int(c)) for a, b, c in zip(src.tolist(), dst.tolist(), chan.tolist())]

    # ------------------------------------------------------------------------------------------------ bandwidth
    def raw_algbw(self, op: str, algo: str, ranks: tuple[int, ...], root: int = 0) -> float:
        """Bytes/s of S the pattern moves on an idle network: S / max over links of (load / capacity)."""
        key = (op, algo, ranks, root)
        v = self._raw.get(key)
        if v is None:
            src, dst, frac, chan = self.pattern(op, algo, ranks, root)
            if len(src) == 0:
                v = float("inf")
            else:
                paths = self.paths(src, dst, chan)
                lens = np.fromiter((len(p) for p in paths), dtype=np.int64, count=len(paths))
                links = np.concatenate(paths) if paths else np.zeros(0, dtype=np.int64)
                load = np.bincount(links, weights=np.repeat(frac, lens), minlength=len(self.topo.capacity))
                t = float(np.max(load / self.topo.capacity)) if links.size else 0.0
                v = 1.0 / t if t > 0 else float("inf")
            self._raw[key] = v
        return v

    def comm_shape(self, ranks: tuple[int, ...]) -> nccl.CommShape:
        n_nodes = len({self.topo.node_of(r) for r in ranks})
        return nccl.CommShape(len(ranks), n_nodes, self.intra_hw, self.arch, self.channels, self.ll128)

    def candidates(self, op: str, ranks: tuple[int, ...], size: int, root: int = 0, forced: str | None = None):
        """Yield (predicted seconds, algo, proto, efficiency, latency seconds) for every enabled pair (`forced`: an
        algorithm the user asked for, which NCCL's own choice of ring on two ranks does not rule out)."""
        n = len(ranks)
        comm = self.comm_shape(ranks)
        coll = "all_reduce" if op == "barrier" else op
        for algo in self.algos:
            if algo == "tree" and coll != "all_reduce":
                continue
            if algo == "tree" and "ring" in self.algos and n <= 2 and forced != "tree":
                continue
            raw = self.raw_algbw(coll, algo, ranks, root)
            raw_busbw = raw * busbw_factor(coll, n) / 1e9
            for proto in self.protos:
                if coll == "all_to_all" and proto != "Simple" and "Simple" in self.protos:
                    continue
                eff = nccl.protocol_efficiency(coll, algo, proto, comm, raw_busbw)
                if eff <= 0:
                    continue
                if algo == "tree":
                    eff *= nccl.tree_correction(proto, size)
                lat = nccl.latency_us(coll, algo, proto, comm, size) * 1e-6
                yield lat + size / (raw * eff), algo, proto, eff, lat

    def plan(self, op: str, ranks: tuple[int, ...], input_bytes: int, root: int = 0,
             algo: str | None = None, proto: str | None = None) -> Plan:
        n = len(ranks)
        size = nccl_size(op, input_bytes, n)
        if op == "send_recv":
            comm = self.comm_shape(ranks)
            hw = comm.intra_hw if comm.n_nodes == 1 else "net"
            lat_us = nccl.BASE_LAT["ring"]["Simple"] + nccl.HW_LAT[hw]["ring"]["Simple"]
            eff = 1.0
            cal = nccl.calibration(comm)
            if cal is not None:
                lat_us, eff = cal.latency(op, lat_us), cal.efficiency(op, "Simple", eff)
            lat = lat_us * 1e-6
            src = np.array([ranks[0]]); dst = np.array([ranks[1]])
            return Plan(op, "p2p", "Simple", size, lat, src, dst, np.array([size / eff]), np.zeros(1, dtype=np.int64),
                        lat + size / (self.raw_algbw("broadcast", "ring", ranks, 0) * eff))
        if n == 1:
            return Plan(op, "none", "none", size, 0.0, *(np.zeros(0, dtype=np.int64),) * 2, np.zeros(0),
                        np.zeros(0, dtype=np.int64), 0.0)
        every = list(self.candidates(op, ranks, size, root, forced=algo))
        # a forced algorithm or protocol applies where the collective has it (tree: all-reduce alone; LL128 where
        # the hardware enables it), as NCCL_ALGO / NCCL_PROTO given per collective; elsewhere NCCL's own choice
        options = [c for c in every if (algo is None or c[1] == algo) and (proto is None or c[2] == proto)] \
            or [c for c in every if algo is None or c[1] == algo] \
            or [c for c in every if proto is None or c[2] == proto] or every
        if not options:
            raise ValueError(f"no enabled algorithm/protocol for {op} (algo={algo}, proto={proto})")
        pred, a, p, eff, lat = min(options, key=lambda c: c[0])
        coll = "all_reduce" if op == "barrier" else op
        cal = nccl.calibration(self.comm_shape(ranks))
        if cal is not None:
            # NCCL chose by its own model; the time of its choice follows the measurements
            lat = cal.latency(coll, lat * 1e6) * 1e-6
            eff = cal.efficiency(coll, p, eff)
            pred = lat + size / (self.raw_algbw(coll, a, ranks, root) * eff)
        src, dst, frac, chan = self.pattern(coll, a, ranks, root)
        return Plan(op, a, p, size, lat, src, dst, frac * (size / eff), chan, pred)


def forced_choice_text(collectives: list[dict], algo: str | None, proto: str | None) -> str:
    """How a forced algorithm or protocol (`--algo`, `--proto`) applied to a run's collectives ("" when none was
    forced, or it applied to every collective that has a choice). NCCL_ALGO / NCCL_PROTO apply only where the
    collective has that algorithm or protocol (tree: all-reduce alone; LL128 where the hardware enables it); the
    others keep NCCL's own choice, which a report must say rather than let the option look applied."""
    if not algo and not proto:
        return ""
    chosen = [c for c in collectives if c.get("algo") not in ("", "none", "p2p")]
    missed: dict[str, int] = {}
    for c in chosen:
        if (algo and c["algo"] != algo) or (proto and c["proto"] != proto):
            missed[c["name"]] = missed.get(c["name"], 0) + 1
    if not missed:
        return ""
    forced = " ".join(f"--{k} {v}" for k, v in (("algo", algo), ("proto", proto)) if v)
    n_missed = sum(missed.values())
    which = ", ".join(f"{name} {n:,}" for name, n in sorted(missed.items(), key=lambda kv: -kv[1]))
    return (f"{forced} applied to {len(chosen) - n_missed:,} of {len(chosen):,} collectives; {n_missed:,} kept "
            f"NCCL's own choice, having no such algorithm or protocol on this cluster ({which})")
