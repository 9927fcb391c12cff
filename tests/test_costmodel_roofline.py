"""Roofline model: physical bounds, ridge-point physics, monotonicity, and efficiency fitting."""

from dataclasses import replace

import pytest
import torch

from phantora.costmodel import families as fam
from phantora.probes.calibrate import calibration_signatures
from phantora.costmodel.families import work
from phantora.costmodel.profiledb import ProfileDB
from phantora.costmodel.roofline import (DEFAULT_TABLES, EfficiencyTable, FamilyEfficiency, RooflineModel,
                                         default_table, fit_efficiencies, peak_flops)
from phantora.costmodel.signature import Signature, signature_of
from phantora.engine.ops import CostSource
from phantora.errors import PhantoraError

from test_costmodel_gpus import A100, H100, MAX_PEAK

aten = torch.ops.aten
BF, F32 = torch.bfloat16, torch.float32


def T(*shape, dtype=BF):
    return torch.empty(shape, dtype=dtype, device="meta")


def S(op, *args, **kwargs):
    return signature_of(op, args, kwargs)


@pytest.fixture(scope="module")
def corpus():
    """Signatures of every family over six orders of magnitude of size."""
    return calibration_signatures()


@pytest.mark.parametrize("gpu", [H100, A100], ids=lambda g: g.name)
def test_duration_never_beats_the_hardware(gpu, corpus):
    model = RooflineModel(gpu)
    for sig in corpus:
        c = model.estimate(sig)
        floor = max(c.flops / MAX_PEAK[gpu.name], c.nbytes / gpu.hbm_bytes_per_s)
        assert c.duration_s >= floor, sig.key()
        assert c.source == CostSource.ROOFLINE and c.duration_s > 0


def test_bound_holds_for_any_valid_table(corpus):
    """Even the most optimistic table (every efficiency 1, no latency) cannot beat the datasheet."""
    ideal = EfficiencyTable({fam.OTHER: FamilyEfficiency(1.0, 1.0)}, latency_s=0.0)
    model = RooflineModel(H100, ideal)
    for sig in corpus:
        c = model.estimate(sig)
        assert c.duration_s >= max(c.flops / MAX_PEAK[H100.name], c.nbytes / H100.hbm_bytes_per_s) * (1 - 1e-12)


def test_ridge_point_physics_on_h100():
    model = RooflineModel(H100)
    ridge = H100.peak_tflops["bf16"] * 1e12 / H100.hbm_bytes_per_s      # ~295 FLOP/byte
    n = 4096
    mm_intensity = 2 * n ** 3 / (3 * n * n * 2)                         # 2N^3 FLOPs over 3 N^2 bf16 matrices
    assert mm_intensity > ridge
    assert model.bound(work(S(aten.mm.default, T(n, n), T(n, n)))) == "compute"
    add_intensity = 1 / (3 * 2)                                         # 1 FLOP per 3 bf16 elements moved
    assert add_intensity < ridge
    assert model.bound(work(S(aten.add.Tensor, T(1 << 24), T(1 << 24)))) == "memory"


def test_large_matmul_runs_near_but_below_peak():
    n = 8192
    c = RooflineModel(H100).estimate(S(aten.mm.default, T(n, n), T(n, n)))
    achieved = c.flops / c.duration_s
    assert 0.5 * 989.4e12 < achieved < 989.4e12


def test_large_copy_runs_near_but_below_bandwidth():
    n = 1 << 28
    c = RooflineModel(H100).estimate(S(aten.copy_.default, T(n), T(n)))
    achieved = c.nbytes / c.duration_s
    assert 0.5 * 3350e9 < achieved < 3350e9


@pytest.mark.parametrize("make", [
    lambda n: S(aten.mm.default, T(n, n), T(n, n)),
    lambda n: S(aten.add.Tensor, T(n * n), T(n * n)),
    lambda n: S(aten._softmax.default, T(n, 4 * n), -1, False),
    lambda n: S(aten._scaled_dot_product_flash_attention.default, *(T(1, 8, 4 * n, 64),) * 3, 0.0, True),
    lambda n: S(aten._fused_rms_norm.default, T(n, 4096), [4096], T(4096), 1e-5),
])
def test_duration_grows_with_size(make):
    model = RooflineModel(H100)
    durations = [model.estimate(make(n)).duration_s for n in (64, 128, 256, 512, 1024, 2048)]
    assert all(a < b for a, b in zip(durations, durations[1:]))


def test_small_matmuls_are_far_below_peak():
    model = RooflineModel(H100)
    eff = {}
    for n in (128, 512, 2048, 8192):
        c = model.estimate(S(aten.mm.default, T(n, n), T(n, n)))
        eff[n] = c.flops / c.duration_s / (989.4e12)
    assert eff[128] < 0.01 < eff[512] < eff[2048] < eff[8192]


def test_views_cost_nothing():
    model = RooflineModel(H100)
    for sig in (S(aten.view.default, T(4, 6), [24]), S(aten.t.default, T(4, 6)),
                S(aten.expand.default, T(1, 6), [8, 6]), S(aten.empty.memory_format, [1 << 30])):
        c = model.estimate(sig)
        assert c.is_view and c.duration_s == 0 and c.source == CostSource.NONE


def test_tiny_kernel_costs_the_launch_latency():
    model = RooflineModel(H100)
    c = model.estimate(S(aten.add.Tensor, T(1), T(1)))
    lat = model.table.latency_s
    assert lat <= c.duration_s < lat + 1e-6
    assert 1e-6 <= lat <= 10e-6                      # a few microseconds, as measured with CUDA events


def test_compute_bound_kernels_scale_with_peak_and_memory_bound_with_bandwidth():
    """Same table on two GPUs: a big GEMM slows by the bf16 peak ratio, a big copy by the bandwidth ratio."""
    table = default_table(H100)
    h, a = RooflineModel(H100, table), RooflineModel(A100, table)
    gemm = S(aten.mm.default, T(16384, 16384), T(16384, 16384))
    copy = S(aten.copy_.default, T(1 << 30), T(1 << 30))
    peak_ratio = 989.4 / 312.0
    bw_ratio = 3350.0 / 2039.0
    assert a.estimate(gemm).duration_s / h.estimate(gemm).duration_s == pytest.approx(peak_ratio, rel=0.03)
    assert a.estimate(copy).duration_s / h.estimate(copy).duration_s == pytest.approx(bw_ratio, rel=0.03)


def test_host_transfers_use_the_pcie_link():
    from test_costmodel_signature import _fake_cuda

    n = 1 << 26
    sig = signature_of(aten.copy_.default, (_fake_cuda(n), torch.empty(n)))
    c = RooflineModel(H100).estimate(sig)
    assert c.duration_s >= 4 * n / (H100.pcie_gbyte_per_s * 1e9)       # slower than the link at full speed
    assert c.duration_s > 10 * 2 * 4 * n / H100.hbm_bytes_per_s        # far slower than an on-device copy


def test_missing_dtype_falls_back_sensibly():
    assert peak_flops(A100, "fp8") == A100.peak_tflops["bf16"] * 1e12      # A100 has no fp8 units
    assert peak_flops(H100, "fp64") == H100.peak_tflops["fp32"] * 1e12 / 2


def test_default_tables_are_valid_and_documented():
    for arch, table in DEFAULT_TABLES.items():
        table.validate()
        assert table.provenance
    assert default_table(replace(H100, arch="blackwell")).provenance.startswith("blackwell")


def test_invalid_efficiency_is_rejected():
    bad = EfficiencyTable({fam.OTHER: FamilyEfficiency(1.2, 0.5)})
    with pytest.raises(PhantoraError, match="efficiency"):
        RooflineModel(H100, bad)
    with pytest.raises(PhantoraError):
        EfficiencyTable({fam.MATMUL: FamilyEfficiency(0.5, 0.5)}).validate()      # no 'other' fallback


def test_table_dict_round_trip():
    t = default_table(H100)
    assert EfficiencyTable.from_dict(t.to_dict()) == t


# ---- fitting ---------------------------------------------------------------------------------------------------------

def _synthetic_db(tmp_path, truth: EfficiencyTable, sigs) -> ProfileDB:
    model = RooflineModel(H100, truth)
    db = ProfileDB.create(tmp_path / "synthetic.h5", gpu=H100.name)
    for sig in sigs:
        c = model.estimate(sig)
        if not c.is_view:
            us = c.duration_s * 1e6
            db.add(sig, [us * 0.99, us, us * 1.01])
    return db


def test_fit_recovers_known_efficiencies(tmp_path, corpus):
    truth = EfficiencyTable({
        fam.MATMUL: FamilyEfficiency(0.62, 0.7, 1.5e9, 0.0),
        fam.ELEMENTWISE: FamilyEfficiency(0.5, 0.77, 0.0, 2.0e6),
        fam.COPY: FamilyEfficiency(0.5, 0.66, 0.0, 1.0e6),
        fam.OTHER: FamilyEfficiency(0.4, 0.55, 0.0, 3.0e6),
    }, latency_s=3.0e-6)
    db = _synthetic_db(tmp_path, truth, corpus)
    fitted = fit_efficiencies(db, H100)
    # the latency is only identifiable together with the smallest kernels' saturation terms: it lies between the
    # true latency and the true time of a near-empty kernel
    tiny = max(e.b0_bytes / (H100.hbm_bytes_per_s * e.memory) for e in truth.families.values())
    assert 3.0e-6 * 0.99 <= fitted.latency_s <= (3.0e-6 + tiny) * 1.01
    mm, ew, cp = fitted.get(fam.MATMUL), fitted.get(fam.ELEMENTWISE), fitted.get(fam.COPY)
    assert mm.compute == pytest.approx(0.62, rel=0.05)
    assert mm.w0_flops == pytest.approx(1.5e9, rel=0.25)
    assert ew.memory == pytest.approx(0.77, rel=0.05)
    assert cp.memory == pytest.approx(0.66, rel=0.05)
    # the fitted table reproduces the synthetic measurements (the fit is robust, so a few kernels off the
    # majority's trend, e.g. fp32 GEMMs in a bf16 family, may miss by more than the median)
    fitted_model, true_model = RooflineModel(H100, fitted), RooflineModel(H100, truth)
    errors = sorted(abs(fitted_model.estimate(s).duration_s / true_model.estimate(s).duration_s - 1) for s in corpus)
    assert errors[len(errors) // 2] < 0.02 and errors[-1] < 0.2
    assert "h100-sxm-80gb" in fitted.provenance


def test_fit_adds_an_op_entry_only_where_an_op_differs(tmp_path):
    """One op twice as slow as its family gets an 'op:' entry; its well-behaved siblings do not."""
    truth = EfficiencyTable({fam.OTHER: FamilyEfficiency(0.5, 0.8, 0.0, 0.0)}, latency_s=3e-6)
    model = RooflineModel(H100, truth)
    db = ProfileDB.create(tmp_path / "p.h5", gpu=H100.name)
    for n in (1 << 16, 1 << 18, 1 << 20, 1 << 22, 1 << 24, 1 << 26):
        for op in (aten.add.Tensor, aten.mul.Tensor):
            sig = S(op, T(n), T(n))
            db.add(sig, [model.estimate(sig).duration_s * 1e6])
        slow = S(aten.silu.default, T(n))
        t = model.estimate(slow).duration_s
        db.add(slow, [(3e-6 + 2 * (t - 3e-6)) * 1e6])
    fitted = fit_efficiencies(db, H100)
    assert "op:silu" in fitted.families
    assert fitted.families["op:silu"].memory == pytest.approx(0.4, rel=0.05)
    assert "op:add" not in fitted.families and "op:mul" not in fitted.families
    assert fitted.get(fam.ELEMENTWISE).memory == pytest.approx(0.8, rel=0.05)


def test_fit_needs_samples(tmp_path):
    db = ProfileDB.create(tmp_path / "empty.h5", gpu=H100.name)
    with pytest.raises(PhantoraError, match="no kernel samples"):
        fit_efficiencies(db, H100)


def test_generic_family_signature_from_trace_costs_something():
    sig = Signature("myns.custom_kernel.default", ((4096, 4096),), ("bfloat16",), ((4096, 1),))
    c = RooflineModel(H100).estimate(sig)
    assert c.family == fam.OTHER and c.duration_s > 2 * 2 * 4096 * 4096 / H100.hbm_bytes_per_s


def test_short_row_softmax_runs_near_bandwidth_as_measured():
    """Megatron's unfused attention softmax, [2, 32, 2048, 2048] fp32 over the last dim, measured on one H100:
    0.729 ms alone (`phantora profile`) and 0.78 ms inside the step (torch.profiler, 64 calls in 50.0 ms); rows of
    2048 run as one pass, so the estimate lies within 10% of both. Long rows (a vocabulary's) take several passes."""
    model = RooflineModel(H100)
    short = model.estimate(S(aten._softmax.default, T(2, 32, 2048, 2048, dtype=torch.float32), -1, False))
    assert 0.9 * 0.729e-3 < short.duration_s < 1.1 * 0.781e-3
    long = model.estimate(S(aten._softmax.default, T(64, 128256, dtype=torch.float32), -1, False))
    assert long.nbytes / long.duration_s < 0.6 * short.nbytes / short.duration_s


def test_a_gpu_s_memory_scale_slows_memory_bound_kernels_only():
    """roofline_memory_scale divides the bandwidth the table's memory fractions apply to: a big copy takes 1/scale
    as long, a big GEMM (compute-bound) is unchanged."""
    from phantora.gpus import load_gpu
    h200 = load_gpu("h200-sxm-141gb")
    assert h200.roofline_memory_scale < 1.0
    plain = RooflineModel(replace(h200, roofline_memory_scale=1.0))
    scaled = RooflineModel(h200)
    copy = S(aten.copy_.default, T(1 << 30), T(1 << 30))
    gemm = S(aten.mm.default, T(16384, 16384), T(16384, 16384))
    assert scaled.estimate(copy).duration_s / plain.estimate(copy).duration_s == pytest.approx(
        1 / h200.roofline_memory_scale, rel=0.01)
    assert scaled.estimate(gemm).duration_s == pytest.approx(plain.estimate(gemm).duration_s, rel=1e-9)


@pytest.mark.parametrize("name", ["h100-sxm-80gb", "h200-sxm-141gb"])
def test_memory_scales_of_the_presets_are_what_their_profiles_measure(name):
    """The presets' roofline_memory_scale agrees with the median of their own measured memory-bound kernels: the
    H100 (whose profile the Hopper table was fitted on) at 1, the H200 below it (its kernels draw less of its
    datasheet bandwidth)."""
    from phantora.costmodel.roofline import memory_scale
    from phantora.costmodel.select import profiles_dir
    from phantora.gpus import load_gpu
    gpu = load_gpu(name)
    fitted, n = memory_scale(ProfileDB.open(profiles_dir() / f"{name}.h5"), gpu)
    assert n >= 500
    assert gpu.roofline_memory_scale == pytest.approx(fitted, abs=0.02)


def test_memory_scale_above_one_is_refused(tmp_path):
    from phantora.errors import PresetError
    from phantora.gpus import gpu_dir, load_gpu
    text = (gpu_dir() / "h200-sxm-141gb.toml").read_text()
    assert "roofline_memory_scale = 0.897" in text
    bad = tmp_path / "g.toml"
    bad.write_text(text.replace("roofline_memory_scale = 0.897", "roofline_memory_scale = 1.2"))
    with pytest.raises(PresetError, match="roofline_memory_scale"):
        load_gpu(str(bad))
