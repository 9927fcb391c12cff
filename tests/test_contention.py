"""NCCL and compute kernels sharing a GPU (phantora/engine/contention.py, a GPU preset's [overlap] table).

Against the measurement (presets/profiles/overlap/h200-sxm-141gb.json, `phantora.costmodel.overlapprobe` on two
NVLinked H200) and against the engine's timelines without the model:
- sharing never sped anything up in the measurement, and the preset's factors are its means;
- a collective with no compute beside it takes what the network model says (nccl-tests' figures stay the same);
- a GEMM queued beside a collective ends later by at most (compute factor - 1) x the collective's time, and the
  collective takes at most collective_slowdown x its time alone, and at least its time alone;
- a GPU without an [overlap] table (the A100) runs both at full speed.
"""

import json
import statistics

import pytest

from phantora.cluster import load_cluster
from phantora.engine.core import Engine
from phantora.engine.ops import Op, OpKind as K
from phantora.gpus import load_gpu
from phantora.net.network import Network
from phantora.paths import presets_dir

MiB = 2**20
DATA = presets_dir() / "profiles" / "overlap" / "h200-sxm-141gb.json"
COMPUTE = ("gemm_8192x8192x8192", "gemm_8192x4096x14336", "flash_attn_fwd_s4096")
MEMORY = ("copy_1GiB", "add_1GiB")


def rows():
    d = json.loads(DATA.read_text())
    return [r for rank in d["ranks"] for r in rank]


def test_sharing_never_sped_up_and_the_preset_holds_the_measured_means():
    rs = rows()
    assert len(rs) >= 2 * 15 and all(r["covered"] for r in rs)     # the collective spanned the kernel's window
    assert min(r["kernel_slowdown"] for r in rs) > 0.99
    assert min(r["collective_slowdown"] for r in rs) > 0.99
    ov = load_gpu("h200-sxm-141gb").overlap
    assert ov.compute_kernel_slowdown == pytest.approx(
        statistics.mean(r["kernel_slowdown"] for r in rs if r["kernel"] in COMPUTE), abs=0.005)
    assert ov.memory_kernel_slowdown == pytest.approx(
        statistics.mean(r["kernel_slowdown"] for r in rs if r["kernel"] in MEMORY), abs=0.005)
    assert ov.collective_slowdown == pytest.approx(statistics.mean(r["collective_slowdown"] for r in rs), abs=0.005)
    # HBM-bound kernels lose more to NCCL's memory traffic than tensor-core-bound ones
    assert ov.memory_kernel_slowdown > ov.compute_kernel_slowdown


def run(spec, streams, **kw):
    recs = []
    eng = Engine(spec, sink=lambda *a: recs.append(a), **kw)
    for r, ops in streams.items():
        eng.feed(r, ops)
        eng.close(r)
    assert eng.run()
    return eng, recs


def gemm(duration):
    """A kernel far above the ridge point (8192^3 bf16 GEMM's FLOPs per byte)."""
    return Op(K.KERNEL, stream=1, duration=duration, flops=2 * 8192**3, nbytes=3 * 8192**2 * 2)


def test_a_collective_alone_takes_the_network_time():
    spec = load_cluster("h100-hgx")
    assert spec.gpu_spec().overlap is not None
    streams = {r: [Op(K.COLLECTIVE, name="all_gather", group=0, nbytes=64 * MiB), Op(K.SYNC_DEVICE)]
               for r in range(8)}
    eng, _ = run(spec, streams)
    alone, _ = Network(spec).time_alone("all_gather", tuple(range(8)), 64 * MiB)
    c = eng.collectives[0]
    assert c["end"] - c["start"] == pytest.approx(alone, rel=1e-9)


@pytest.mark.parametrize("cluster, modelled", [("h100-hgx", True), ("a100-hgx", False)])
def test_compute_beside_a_collective_slows_both_within_the_measured_factors(cluster, modelled):
    spec = load_cluster(cluster)
    alone, _ = Network(spec).time_alone("reduce_scatter", tuple(range(8)), 256 * MiB)
    kernel = 3 * alone                                  # covers the collective's whole window

    def streams():
        return {r: [gemm(kernel), Op(K.COLLECTIVE, stream=0, name="reduce_scatter", group=0, nbytes=256 * MiB),
                    Op(K.SYNC_DEVICE)] for r in range(8)}
    off, off_recs = run(spec, streams(), contention=False)
    on, on_recs = run(spec, streams())
    c_off, c_on = off.collectives[0], on.collectives[0]
    t_off = c_off["end"] - c_off["start"]
    t_on = c_on["end"] - c_on["start"]
    assert t_off == pytest.approx(alone, rel=1e-9)
    host_off, host_on = off.ranks[0].cpu, on.ranks[0].cpu    # the sync waits for the GEMM's stream
    if not modelled:
        assert t_on == pytest.approx(t_off, rel=1e-12) and host_on == pytest.approx(host_off, rel=1e-12)
        return
    ov = spec.gpu_spec().overlap
    assert alone < t_on <= ov.collective_slowdown * alone * (1 + 1e-9) + 1e-12
    extra = host_on - host_off
    assert 0 < extra <= (ov.compute_kernel_slowdown - 1) * t_on * (1 + 1e-9)
