"""NCCL's own cost model: latencies, protocol bandwidth factors and the (algorithm, protocol) choice.

Constants are those of NVIDIA NCCL's `src/graph/tuning.cc` (2.19+ tuner constants: base latencies, per-hop hardware
latencies, LL/LL128/tree bandwidth caps per architecture) and `src/graph/topo.h`; docs/network-model.md lists them with
their sources. NCCL predicts `time = latency + bytes / algbw` for each (algorithm, protocol) pair and runs the fastest.
Phantora keeps NCCL's latency terms and protocol factors, but takes the raw bandwidth from the flow simulation of
the collective on the cluster topology, so contention and oversubscription are seen.

Where collectives were measured (groundtruth/nccl/), a `Calibration` corrects the time of the (algorithm, protocol)
pair NCCL picks: a measured per-call latency and the measured fraction of the link bandwidth that Simple rings and
p2p transfers reach. NCCL's own model still makes the choice, as it does on the real system.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

ALGOS = ("tree", "ring")
PROTOS = ("LL", "LL128", "Simple")

# baseLat[algo][proto], microseconds
BASE_LAT = {"tree": {"LL": 6.8, "LL128": 14.0, "Simple": 8.4},
            "ring": {"LL": 6.6, "LL128": 14.0, "Simple": 8.4}}
# hwLat[hw][algo][proto], microseconds per step
HW_LAT = {
    "nvlink": {"tree": {"LL": 0.6, "LL128": 1.25, "Simple": 4.0}, "ring": {"LL": 0.6, "LL128": 1.9, "Simple": 3.4}},
    "pci": {"tree": {"LL": 1.0, "LL128": 1.9, "Simple": 4.0}, "ring": {"LL": 1.0, "LL128": 2.5, "Simple": 5.7}},
    "net": {"tree": {"LL": 5.0, "LL128": 8.5, "Simple": 14.0}, "ring": {"LL": 2.7, "LL128": 4.0, "Simple": 14.0}},
}
# per architecture: values for 1 node / 2 nodes / more than 2 nodes
LL_MAX_BW = {"volta": (39.0, 39.0, 20.4), "ampere": (87.7, 22.5, 19.0), "hopper": (141.0, 45.0, 35.0),
             "blackwell": (282.0, 90.0, 70.0)}
PER_CH_MAX_RING_LL128 = {"volta": (20.0,) * 3, "ampere": (20.0,) * 3, "hopper": (36.7,) * 3, "blackwell": (40.0,) * 3}
PER_CH_MAX_TREE_LL128 = {"volta": (20.0,) * 3, "ampere": (20.0,) * 3, "hopper": (36.7, 36.7, 29.0),
                         "blackwell": (40.0, 40.0, 40.0)}
PER_CH_MAX_TREE = {"volta": (26.5, 18.5, 10.0), "ampere": (24.0, 23.6, 17.8), "hopper": (38.7, 41.4, 36.0),
                   "blackwell": (70.0, 42.8, 24.0)}
# Trees deviate from the model at medium sizes: NCCL's static correction, per protocol, index log2(bytes/64)
TREE_CORRECTION = {
    "LL": (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0),
    "LL128": (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .5, .6, .6, .7, .7, .8, .9, .9, 1.0),
    "Simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .5, .5, .6, .6, .7, .8, .9),
}


def arch_of(sm_version: int) -> str:
    if sm_version >= 100:
        return "blackwell"
    if sm_version >= 90:
        return "hopper"
    if sm_version >= 80:
        return "ampere"
    return "volta"


@dataclass(frozen=True)
class CommShape:
    """What NCCL's tuner knows of a communicator."""
    n_ranks: int
    n_nodes: int
    intra_hw: str        # "nvlink" | "pci"
    arch: str            # volta | ampere | hopper | blackwell
    channels: int        # NCCL channels (for its per-channel caps)
    ll128: bool = True   # LL128 enabled (NCCL enables it on NVLink systems of sm80+)

    @property
    def ppn(self) -> float:
        return self.n_ranks / self.n_nodes

    @property
    def scale(self) -> int:
        return 0 if self.n_nodes == 1 else (1 if self.n_nodes == 2 else 2)


def steps(coll: str, n_ranks: int, n_nodes: int) -> tuple[int, int]:
    """(nsteps, nInterSteps) of a ring collective."""
    if coll == "all_reduce":
        return 2 * (n_ranks - 1), 2 * (n_nodes - 1)
    if coll in ("all_gather", "reduce_scatter"):
        return n_ranks - 1, n_nodes - 1
    return n_ranks, n_nodes


def latency_us(coll: str, algo: str, proto: str, comm: CommShape, nbytes: float = 0.0) -> float:
    """NCCL's latency term for one call, microseconds."""
    lat = BASE_LAT[algo][proto]
    intra = HW_LAT[comm.intra_hw][algo][proto]
    inter = HW_LAT["net"][algo][proto]
    if comm.n_nodes > 1 and proto == "LL":
        intra *= 1.8
    if algo == "ring":
        if coll in ("broadcast", "reduce"):
            hw = comm.intra_hw if comm.n_nodes == 1 else "net"
            return lat + HW_LAT[hw]["ring"][proto]
        nsteps, ninter = steps(coll, comm.n_ranks, comm.n_nodes)
        lat += (nsteps - ninter) * intra + ninter * inter
        if (proto == "Simple" and comm.n_nodes > 1 and coll == "all_reduce"
                and nbytes / (comm.channels * comm.n_ranks) >= 64):
            lat *= 1.4 if comm.arch != "volta" else 1.9
        return lat
    # tree
    ppn = int(comm.ppn)
    return lat + 2 * ((ppn - 1) * intra + math.log2(comm.n_nodes) * inter) if comm.n_nodes > 1 else \
        lat + 2 * (ppn - 1) * intra


def protocol_efficiency(coll: str, algo: str, proto: str, comm: CommShape, raw_busbw: float) -> float:
    """Fraction of the raw bus bandwidth (GB/s) NCCL's model grants this (algorithm, protocol); 0 = disabled."""
    if raw_busbw <= 0:
        return 0.0
    s = comm.scale
    nch = comm.channels
    if algo == "ring":
        if proto == "Simple":
            return 1.0
        # NCCL 2.2x ("Various model refinements" in tuning.cc), as logged by NCCL 2.28.9 on the measured H200 pair:
        # LL gets half the bus bandwidth up to llMaxBw, LL128 0.92 (120/128) up to its per-channel cap
        if proto == "LL":
            return min(raw_busbw * 0.5, LL_MAX_BW[comm.arch][s]) / raw_busbw
        if not comm.ll128:
            return 0.0
        return min(raw_busbw * 0.92, nch * PER_CH_MAX_RING_LL128[comm.arch][s]) / raw_busbw
    # tree (all_reduce only)
    bw = min(raw_busbw * 0.92, nch * PER_CH_MAX_TREE[comm.arch][s])
    if proto == "LL":
        bw *= 1.0 / 3.8
    elif proto == "LL128":
        if not comm.ll128:
            return 0.0
        bw = min(bw * (7.0 / 9.0 if comm.n_nodes == 1 else 120.0 / 128.0), nch * PER_CH_MAX_TREE_LL128[comm.arch][s])
    return bw / raw_busbw


def tree_correction(proto: str, nbytes: float) -> float:
    log_size = int(math.log2(max(nbytes, 64) / 64))
    table = TREE_CORRECTION[proto]
    return table[log_size] if log_size < len(table) else 1.0


@dataclass(frozen=True)
class Calibration:
    """Measured corrections to NCCL's model for one kind of communicator.

    `latency_us[op]` is the measured per-call latency (the intercept of time against size); it replaces NCCL's
    latency term where it is larger. `bw_fraction[op]` is the measured fraction of the topology's link bandwidth
    that the op reaches with the Simple protocol (p2p transfers always use Simple); the other protocols keep NCCL's
    factors. Ops are the collective names of collectives.COLLECTIVES (barrier is timed as all_reduce).
    """
    source: str
    latency_us: dict[str, float] = field(default_factory=dict)
    bw_fraction: dict[str, float] = field(default_factory=dict)

    def latency(self, op: str, nccl_latency_us: float) -> float:
        """Latency in microseconds of one call: NCCL's term, raised to the measured per-call latency."""
        return max(nccl_latency_us, self.latency_us.get(op, 0.0))

    def efficiency(self, op: str, proto: str, nccl_efficiency: float) -> float:
        """Fraction of the raw link bandwidth the op gets with this protocol."""
        if proto == "Simple" and op in self.bw_fraction:
            return self.bw_fraction[op]
        return nccl_efficiency


# Fitted to groundtruth/nccl/h200x2 (2 x H200 SXM on NVLink4, NV18, NCCL 2.28.9 through torch 2.11, NVLS off), over
# the sizes above 1 MiB; docs/network-model.md gives the fit and its errors per op. The link bandwidth itself is
# NCCL's topo.h figure (18 x 20.6 GB/s = 370.8 GB/s), which send/recv reaches at 1 GiB (370.7 GB/s measured); the
# collectives reach less: all_reduce and all_to_all 85%, all_gather and reduce_scatter 70.5% of it. Every call costs at
# least about 20 us on that system, also inside CUDA graphs, against NCCL's 11.8-15.2 us for 2 ranks.
H200_NVLINK_2_RANKS = Calibration(
    source="groundtruth/nccl/h200x2",
    latency_us={"all_reduce": 22.5, "all_gather": 22.5, "reduce_scatter": 22.5, "all_to_all": 20.5,
                "send_recv": 18.0},
    bw_fraction={"all_reduce": 0.85, "all_gather": 0.705, "reduce_scatter": 0.705, "all_to_all": 0.845,
                 "send_recv": 1.0},
)

# (arch, intra-node hardware, nodes, ranks) -> calibration measured on such a communicator. NVLink4 (18 links of
# 20.6 GB/s) is the same on H100 and H200 SXM, so the Hopper entry covers both.
CALIBRATIONS: dict[tuple[str, str, int, int], Calibration] = {
    ("hopper", "nvlink", 1, 2): H200_NVLINK_2_RANKS,
}


# (arch, intra-node hardware) -> the per-call latencies measured on 2 ranks of such a node, a floor for every larger
# communicator on such nodes (more ranks, or more nodes, add hops and never make a call cheaper than 2 ranks of one
# node); their bandwidth keeps NCCL's factors, as no larger communicator was measured
LATENCY_FLOORS: dict[tuple[str, str], Calibration] = {
    ("hopper", "nvlink"): Calibration(
        source="groundtruth/nccl/h200x2 (the 2-rank per-call latency, a floor for larger communicators)",
        latency_us=dict(H200_NVLINK_2_RANKS.latency_us)),
}


def calibration(comm: CommShape) -> Calibration | None:
    """The measured calibration for a communicator of this shape; for a larger communicator of a kind of node
    measured on 2 ranks, the measured per-call latency as a floor (LATENCY_FLOORS); None otherwise (NCCL's model
    alone)."""
    exact = CALIBRATIONS.get((comm.arch, comm.intra_hw, comm.n_nodes, comm.n_ranks))
    if exact is not None or comm.n_ranks <= 2 and comm.n_nodes == 1:
        return exact
    return LATENCY_FLOORS.get((comm.arch, comm.intra_hw))
