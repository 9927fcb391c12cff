"""`phantora net bench` on 2 NVLinked H200 against the collectives measured there (groundtruth/nccl/h200x2).

The measurements (groundtruth/nccl/README.md): NCCL 2.28.9 through torch.distributed on 2 x H200 SXM (NV18), three
eager runs; each run's time is the mean over back-to-back iterations timed with CUDA events (the slowest rank), sizes
as nccl-tests count them. `<op>.csv` holds the minimum, median and maximum of the three runs per size.

The band: for every size above 1 MiB the model's time must lie within 10% of the measured range [min, max] of the
runs (at sizes of 32 MiB and more the runs agree within about 1%, so this is 10% of the measurement; between 2 and
16 MiB single runs differ by up to a factor of two, from the host). One measured point is left out, named below.
The worst error against the median is printed per op (pytest -s) and bounded loosely.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest

from phantora.cluster import load_cluster
from phantora.net import nccl
from phantora.net.bench import bench
from phantora.net.network import Network

DATA = Path(__file__).resolve().parent.parent / "groundtruth" / "nccl" / "h200x2"
CLUSTER = "h200-2gpu-nvlink"
MiB = 2**20
OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")
# all_to_all at 4 MiB: 67-74 us in all three eager runs, twice the 8 MiB time (30-38 us), while CUDA-graph timing
# (runs/graph) gives 33 us, in line with its neighbours: a slow path of the eager call at that size, not modelled.
EXCLUDED = {("all_to_all", 4 * MiB)}
BAND = 0.10


def read_measured(op: str) -> tuple[dict[str, str], dict[int, tuple[float, float, float]]]:
    lines = (DATA / f"{op}.csv").read_text().splitlines()
    meta = {}
    for line in lines:
        if line.startswith("#") and ":" in line:
            k, v = line[1:].split(":", 1)
            meta[k.strip()] = v.strip()
    rows = csv.DictReader(l for l in lines if not l.startswith("#"))
    table = {int(r["size_bytes"]): (float(r["time_us_min"]), float(r["time_us_median"]), float(r["time_us_max"]))
             for r in rows}
    return meta, table


@pytest.fixture(scope="module")
def spec():
    return load_cluster(CLUSTER)


@pytest.fixture(scope="module")
def modelled(spec):
    """op -> size -> (model time us, algo, proto), for the measured sizes above 1 MiB."""
    net = Network(spec)
    out = {}
    for op in OPS:
        _, table = read_measured(op)
        sizes = sorted(s for s in table if s > MiB)
        out[op] = {r.size: (r.time_us, r.algo, r.proto) for r in bench(spec, op, sizes, network=net)}
    return out


def test_measurements_carry_their_provenance():
    for op in OPS:
        meta, table = read_measured(op)
        assert meta["gpu"] == "NVIDIA H200" and meta["world_size"] == "2"
        assert re.fullmatch(r"\d+\.\d+\.\d+", meta["nccl"]) and meta["torch"] and meta["driver"]
        assert '"NCCL_NVLS_ENABLE": "0"' in meta["nccl_env"]
        assert "NCCL_ALGO" not in meta["nccl_env"] and "NCCL_PROTO" not in meta["nccl_env"]
        sizes = sorted(table)
        assert sizes[0] == 1024 and sizes[-1] == 2**30
        assert all(lo <= med <= hi for lo, med, hi in table.values())


def test_send_recv_reaches_nccls_nvlink_figure():
    # NCCL src/graph/topo.h: SM90 NVLink 20.6 GB/s per link; 18 links (nvidia-smi topo: NV18) = 370.8 GB/s, the
    # preset's link bandwidth. A one-way 1 GiB transfer is the plainest measure of it.
    _, table = read_measured("send_recv")
    busbw = 2**30 / (table[2**30][1] * 1e-6) / 1e9
    assert busbw == pytest.approx(18 * 20.6, rel=0.01)


@pytest.mark.parametrize("op", OPS)
def test_net_bench_within_band_above_1mib(op, modelled):
    _, table = read_measured(op)
    worst_band, worst_med = 0.0, (0.0, 0)
    failures = []
    for size, (t, _, _) in sorted(modelled[op].items()):
        lo, med, hi = table[size]
        err_med = t / med - 1
        if abs(err_med) > abs(worst_med[0]):
            worst_med = (err_med, size)
        if (op, size) in EXCLUDED:
            continue
        band_err = max(t / hi - 1, 1 - t / lo, 0.0)
        worst_band = max(worst_band, band_err)
        if band_err > BAND:
            failures.append(f"{size} B: model {t:.1f} us, measured {lo:.1f}..{hi:.1f} us (median {med:.1f})")
    print(f"\n{op}: worst error outside the measured range {worst_band:.1%}; worst error against the median "
          f"{worst_med[0]:+.1%} at {worst_med[1]} B")
    assert not failures, f"{op}: outside the 10% band: " + "; ".join(failures)


@pytest.mark.parametrize("op", OPS)
def test_large_sizes_within_10pct_of_median(op, modelled):
    # from 32 MiB up the three runs agree within about 1%: there the model must be within 10% of the median itself
    _, table = read_measured(op)
    for size, (t, _, _) in modelled[op].items():
        if size >= 32 * MiB:
            assert t == pytest.approx(table[size][1], rel=BAND), (op, size)


def _ncclchoices() -> dict[tuple[str, int], str]:
    """(op, nccl-tests size) -> protocol that NCCL logged (NCCL_DEBUG_SUBSYS=TUNING) on the measured system."""
    names = {"AllReduce": "all_reduce", "AllGather": "all_gather", "ReduceScatter": "reduce_scatter"}
    pat = re.compile(r"(AllReduce|AllGather|ReduceScatter): (\d+) Bytes -> Algo (\w+) proto (\w+)")
    out = {}
    for line in (DATA / "probe" / "nccl_rank0.log").read_text().splitlines():
        m = pat.search(line)
        if not m or int(m.group(2)) < 512:  # 4-byte all_reduces are the script's own barriers
            continue
        op = names[m.group(1)]
        nbytes = int(m.group(2)) * (2 if op == "all_gather" else 1)  # NCCL logs the per-rank send count
        out[(op, nbytes)] = (m.group(3).lower(), {"SIMPLE": "Simple"}.get(m.group(4), m.group(4)))
    return out


def test_model_picks_the_protocol_nccl_picked(spec):
    choices = _ncclchoices()
    assert len(choices) >= 20
    net = Network(spec)
    for (op, size), (algo, proto) in sorted(choices.items()):
        row = bench(spec, op, [size], network=net)[0]
        assert (row.algo, row.proto) == (algo, proto), (op, size)


def test_calibration_only_for_the_measured_shape():
    h200 = load_cluster("h200-hgx")
    planner = Network(h200).planner
    assert nccl.calibration(planner.comm_shape((0, 1))) is nccl.H200_NVLINK_2_RANKS
    for ranks in ((0, 1, 2, 3), tuple(range(8))):
        # larger communicators take the measured per-call latency as a floor, and NCCL's bandwidth factors
        floor = nccl.calibration(planner.comm_shape(ranks))
        assert floor.latency_us == nccl.H200_NVLINK_2_RANKS.latency_us and not floor.bw_fraction
    a100 = load_cluster("a100-hgx")
    assert nccl.calibration(Network(a100).planner.comm_shape((0, 1))) is None
    assert nccl.calibration(Network(a100).planner.comm_shape(tuple(range(8)))) is None


@pytest.mark.parametrize("op", ["all_reduce", "all_gather", "reduce_scatter", "all_to_all"])
def test_more_ranks_never_make_a_small_collective_cheaper(op):
    # a call over 4 or 8 GPUs of a node, or over 2 nodes, crosses at least the hops of a call over 2 of them: at
    # sizes where latency dominates it cannot take less time than the measured pair
    net = Network(load_cluster("h200-hgx", nodes=2))
    for size in (4096, 64 * 1024, 1 * MiB):
        pair = net.time_alone(op, (0, 1), size)[0]
        for ranks in ((0, 1, 2, 3), tuple(range(8)), (0, 8), tuple(range(16))):
            assert net.time_alone(op, ranks, size)[0] >= pair * (1 - 1e-9), (op, size, ranks)


def test_two_ranks_of_an_hgx_node_time_as_the_measured_pair(spec):
    # the same two NVSwitch-attached Hopper GPUs: a 2-rank group of an 8-GPU HGX node behaves as the 2-GPU preset
    pair, hgx = Network(spec), Network(load_cluster("h200-hgx"))
    for op in OPS:
        for size in (4 * MiB, 256 * MiB):
            inp = size // 2 if op == "all_gather" else size
            assert hgx.time_alone(op, (0, 1), inp)[0] == pytest.approx(pair.time_alone(op, (0, 1), inp)[0], rel=1e-9)


def _nccl_tuning_table() -> dict[str, list[tuple[float, float]]]:
    """NCCL's own (latency us, algbw GB/s) per function for Tree LL/LL128/Simple, Ring LL/LL128/Simple, as it
    logged them (NCCL_DEBUG_SUBSYS=TUNING) on the measured system."""
    out = {}
    for line in (DATA / "probe" / "nccl_rank0.log").read_text().splitlines():
        m = re.search(r"INFO\s+(AllReduce|AllGather|ReduceScatter) \|(.*)", line)
        if m and m.group(1) not in out:  # the first block holds Tree, Ring, CollNetDirect
            cells = [c.strip() for c in m.group(2).split("|") if c.strip()]
            out[m.group(1)] = [tuple(float(x) for x in c.split("/")) for c in cells[:6]]
    return out


def test_ring_latency_and_protocol_factors_match_nccls_own_table(spec):
    # NCCL printed its model for this communicator: ring bus bandwidth 360 GB/s (24 channels x 15 GB/s). Given the
    # same bus bandwidth, Phantora's NCCL model must reproduce NCCL's latencies and LL / LL128 / Simple bandwidths.
    table = _nccl_tuning_table()
    assert set(table) == {"AllReduce", "AllGather", "ReduceScatter"}
    comm = Network(spec).planner.comm_shape((0, 1))
    names = {"AllReduce": "all_reduce", "AllGather": "all_gather", "ReduceScatter": "reduce_scatter"}
    nccl_busbw = 360.0
    for fn, cells in table.items():
        op = names[fn]
        nsteps, _ = nccl.steps(op, 2, 1)
        for proto, (lat, algbw) in zip(nccl.PROTOS, cells[3:6]):
            assert nccl.latency_us(op, "ring", proto, comm) == pytest.approx(lat, abs=0.051), (fn, proto)
            ours = nccl.protocol_efficiency(op, "ring", proto, comm, nccl_busbw) * nccl_busbw * 2 / nsteps
            assert ours == pytest.approx(algbw, abs=0.051), (fn, proto)
