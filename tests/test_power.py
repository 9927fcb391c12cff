"""The power-limit model (phantora/costmodel/power.py) against the H100 power measurement it is built on
(presets/profiles/power/h100-sxm-80gb.json) and against the physics it assumes."""

from __future__ import annotations

import dataclasses
import json
import statistics

import pytest

from phantora.costmodel.model import CostModel
from phantora.costmodel.power import compute_slowdown, sustained_clock_mhz
from phantora.probes.powerprobe import GEMM_CLOCK_PROBES, power_table
from phantora.costmodel.profiledb import ProfileDB
from phantora.costmodel.select import profiles_dir
from phantora.costmodel.signature import Signature
from phantora.engine.ops import CostSource
from phantora.errors import PhantoraError, PresetError
from phantora.gpus import GPUSpec, load_gpu
from phantora.paths import presets_dir
from phantora.tomlconf import build, to_table

MEASURED = presets_dir() / "profiles" / "power" / "h100-sxm-80gb.json"


@pytest.fixture(scope="module")
def data() -> dict:
    return json.loads(MEASURED.read_text())


@pytest.fixture(scope="module")
def h100() -> GPUSpec:
    return load_gpu("h100-sxm-80gb")


def _probes(data):
    return {p["probe"]: p for p in data["probes"]}


def test_measurement_was_taken_at_the_presets_limit(data, h100):
    assert data["info"]["power_limit_w"] == h100.tdp_w
    assert data["info"]["gpu"] == h100.display_name


def test_gemm_throughput_follows_the_sm_clock(data):
    """The model's premise: a compute-bound kernel's speed is proportional to the SM clock. The same GEMM with
    inputs that toggle fewer bits draws less power and runs at a higher clock; TFLOP/s per MHz must not move."""
    p = _probes(data)
    clocks = [p[n]["sm_clock_mean_mhz"] for n in GEMM_CLOCK_PROBES]
    assert max(clocks) / min(clocks) > 1.15            # the probes do span different clocks
    per_mhz = [p[n]["tflops"] / p[n]["sm_clock_mean_mhz"] for n in GEMM_CLOCK_PROBES]
    assert max(per_mhz) / min(per_mhz) < 1.03


def test_memory_bound_kernels_run_at_full_clock_under_the_limit(data, h100):
    """HBM-bound kernels draw less than the limit and reach the datasheet bandwidth's order: not throttled."""
    p = _probes(data)
    for n in ("copy_2GiB", "add_2GiB"):
        assert p[n]["power_w"] < h100.tdp_w
        assert p[n]["sm_clock_mhz"] == data["info"]["max_sm_clock_mhz"]
        assert 0.8 < p[n]["gbyte_per_s"] / h100.hbm_bandwidth_gbyte_per_s <= 1.0


def test_a_burst_load_runs_the_same_gemm_faster(data):
    """The power controller averages: the lower the GEMM's duty cycle, the higher the clock it is left."""
    duty = sorted((p for p in data["probes"] if p["probe"].startswith("duty_") and "x40" not in p["probe"]),
                  key=lambda p: -p["gemm_share"])
    speeds = [p["gemm_tflops"] for p in duty]
    assert all(b >= a * 0.99 for a, b in zip(speeds, speeds[1:]))
    assert speeds[-1] > 1.1 * speeds[0]


def test_preset_power_table_is_derived_from_the_measurement(data, h100):
    """Each measured field of the preset read straight from the raw probes (the exponent refitted with numpy);
    power_table must give the same."""
    import numpy as np

    p, probes = h100.power, _probes(data)
    assert p.base_w == pytest.approx(data["info"]["idle_power_w"], abs=0.05)
    assert p.memory_bound_w == pytest.approx((probes["copy_2GiB"]["power_w"] + probes["add_2GiB"]["power_w"]) / 2,
                                             abs=0.05)
    assert p.step_power_w == pytest.approx(probes["step"]["power_w"], abs=0.05)
    assert p.step_clock_mhz == pytest.approx(probes["step"]["sm_clock_mean_mhz"], abs=0.5)
    assert p.tensor_clock_mhz == pytest.approx(max(probes[n]["sm_clock_mean_mhz"]
                                                   for n in ("gemm8192_zeros", "gemm8192_sign")), abs=0.5)
    per_mhz = np.mean([probes[n]["tflops"] / probes[n]["sm_clock_mean_mhz"] for n in GEMM_CLOCK_PROBES])
    duty = [q for q in data["probes"] if q["probe"].startswith("duty_")]
    f = np.array([q["gemm_tflops"] / per_mhz for q in duty])
    share = np.array([q["gemm_share"] for q in duty])
    spin = probes["spin"]
    spin_w = p.base_w + (spin["power_w"] - p.base_w) * (f / spin["sm_clock_mean_mhz"]) ** 2.5
    gemm_w = (np.array([q["power_w"] for q in duty]) - (1 - share) * spin_w) / share
    gamma = np.polyfit(np.log(f), np.log(gemm_w - p.base_w), 1)[0]
    assert p.dynamic_exponent == pytest.approx(gamma, abs=0.01)
    table = power_table(data, p.step_compute_share)
    assert {k: v for k, v in table.items() if k != "step_compute_share"} == pytest.approx(
        {k: v for k, v in to_table(p).items() if k != "step_compute_share"}, rel=0.005)


def test_power_rises_steeper_than_the_clock(h100):
    """Dynamic power grows faster than linearly with the clock (the voltage rises with it): CMOS physics."""
    assert 2.0 <= h100.power.dynamic_exponent <= 3.5


def test_model_reproduces_the_measured_step(h100):
    """The step drew 684.5 W at 1,570 MHz: the model solves back to that clock at that power, and under the full
    700 W limit (a little more power) to a slightly higher clock, still under the tensor-load clock."""
    p = h100.power
    assert sustained_clock_mhz(p, p.step_power_w) == pytest.approx(p.step_clock_mhz, rel=1e-6)
    f = sustained_clock_mhz(p, h100.tdp_w)
    assert p.step_clock_mhz < f <= p.tensor_clock_mhz


def test_lower_limits_give_lower_clocks_and_the_tensor_clock_caps_them(h100):
    p = h100.power
    limits = [300, 400, 500, 600, 700, 800, 2000]
    clocks = [sustained_clock_mhz(p, c) for c in limits]
    assert all(a < b or b == p.tensor_clock_mhz for a, b in zip(clocks, clocks[1:]))
    assert clocks[-1] == p.tensor_clock_mhz
    # energy balance at the clock found: the step's average power equals the limit
    x, g = p.step_compute_share, p.dynamic_exponent
    d = (p.step_power_w - (1 - x) * p.memory_bound_w) / x - p.base_w
    for c, f in zip(limits[:5], clocks[:5]):
        r = p.step_clock_mhz / f
        avg = (x * r * (p.base_w + d * r ** -g) + (1 - x) * p.memory_bound_w) / (x * r + 1 - x)
        assert avg == pytest.approx(c, rel=1e-6)


def test_limit_at_idle_power_is_refused(h100):
    with pytest.raises(PhantoraError, match="idle power"):
        sustained_clock_mhz(h100.power, h100.power.base_w)


def test_slowdown_only_for_the_same_silicon_at_another_limit(h100):
    assert compute_slowdown(h100, h100) == 1.0
    assert compute_slowdown(h100, load_gpu("a100-sxm-80gb")) == 1.0            # another architecture
    hbm2e = load_gpu("h100-96gb-hbm2e")
    assert compute_slowdown(hbm2e, h100) == 1.0         # same silicon, other limit, but no [power] table measured
    s = compute_slowdown(h100, hbm2e)
    assert s == pytest.approx(sustained_clock_mhz(h100.power, 700) / sustained_clock_mhz(h100.power, 500))
    assert 1.05 < s < 1.5
    faster = dataclasses.replace(hbm2e, tdp_w=800.0)
    assert compute_slowdown(h100, faster) < 1.0


def test_cross_gpu_costs_slow_compute_not_memory(h100):
    """Costed across from the 700 W H100's profile, the 500 W HBM2e H100 runs a big GEMM slower by the clock
    ratio and a copy slower by the bandwidth ratio, whatever the profile says of either."""
    hbm2e = load_gpu("h100-96gb-hbm2e")
    db = ProfileDB.open(profiles_dir() / "h100-sxm-80gb.h5")
    model = CostModel(hbm2e, fallback_gpu_db=db)
    s = compute_slowdown(h100, hbm2e)
    assert s > 1.05                                   # premise: the 500 W part is slowed at all
    assert model.power_slowdown == s
    compute_rows = memory_rows = 0
    for key, rec in db.items():
        sig = Signature.from_key(key)
        if rec.median_us < 200:
            continue
        c = model.estimate(sig)
        if c.source != CostSource.CROSS_GPU or c.detail:
            continue
        ratio = c.duration_s * 1e6 / rec.median_us
        bound = model.fallback_roofline.bound(_work(sig))
        if c.family == "matmul" and bound == "compute":
            assert ratio == pytest.approx(s, rel=0.02)
            compute_rows += 1
        elif c.family in ("copy", "elementwise") and bound == "memory":
            assert ratio == pytest.approx(h100.hbm_bandwidth_gbyte_per_s / hbm2e.hbm_bandwidth_gbyte_per_s,
                                          rel=0.05)
            memory_rows += 1
    assert compute_rows >= 10 and memory_rows >= 10


def test_fallback_profile_is_the_same_architectures_closest_memory():
    """A GPU without a profile is costed from the measured GPU of its architecture whose memory is closest in
    bandwidth: the HBM2e H100 from the HBM3 H100 (and so with its power table), the H200 NVL from the H200 SXM."""
    from phantora.costmodel.select import fallback_gpu

    assert fallback_gpu(load_gpu("h100-96gb-hbm2e")) == "h100-sxm-80gb"
    assert fallback_gpu(load_gpu("h200-nvl")) == "h200-sxm-141gb"
    assert fallback_gpu(load_gpu("h100-sxm-80gb")) is None


def _work(sig):
    from phantora.costmodel.families import work

    return work(sig)


def test_power_table_needs_the_limit_it_was_measured_at(h100):
    table = to_table(h100)
    table["tdp_w"] = 0.0
    with pytest.raises(PresetError, match="tdp_w"):
        build(GPUSpec, table)


def test_power_table_rejects_implausible_values(h100):
    table = to_table(h100)
    table["power"]["step_compute_share"] = 1.5
    with pytest.raises(PresetError, match="step_compute_share"):
        build(GPUSpec, table)
    table = to_table(h100)
    table["power"]["memory_bound_w"] = 10.0
    with pytest.raises(PresetError, match="base_w < memory_bound_w"):
        build(GPUSpec, table)


def test_step_measurement_is_steady(data):
    """The reference step was sampled over a steady window (several seconds, power held under the limit)."""
    step = _probes(data)["step"]
    assert step["returncode"] == 0 and step["seconds"] > 5
    assert step["power_w"] <= data["info"]["power_limit_w"]
    assert "sw_power_cap" in step["throttle"]
    assert statistics.fmean([step["power_w"], step["power_sampled_w"]]) == pytest.approx(step["power_w"], rel=0.02)


def _step_trace(path, kernels, marks):
    """A one-rank trace of kernels given as (signature key, start, end), with iteration marks."""
    from phantora.engine.ops import OpKind
    from phantora.trace import schema as S
    from phantora.trace.writer import TraceWriter

    rows = S.empty_ops(len(kernels))
    with TraceWriter(path, {"ranks": [0]}) as w:
        for i, (key, start, end) in enumerate(kernels):
            rows[i]["kind"] = int(OpKind.KERNEL)
            rows[i]["sig"] = w.add_signature(key)
            rows[i]["issue"] = rows[i]["start"] = start
            rows[i]["end"] = end
        w.append_ops(0, rows)
        for t in marks:
            w.mark_iteration(0, t)
    return path


def test_step_compute_share_classifies_kernels_by_the_roofline(tmp_path):
    """The share the [power] table needs, read from a trace: an 8192^3 GEMM (arithmetic intensity ~2,700 FLOP/B,
    far above the H100's ~300) counts as compute-bound, an element-wise add (1/6 FLOP/B) as memory-bound, each with
    its recorded time; kernels outside the whole iterations do not count."""
    from phantora.probes.powerprobe import step_compute_share

    gemm = Signature("aten.mm.default", ((8192, 8192), (8192, 8192)), ("bfloat16",) * 2, ((8192, 1),) * 2).key()
    add = Signature("aten.add.Tensor", ((1 << 28,), (1 << 28,)), ("bfloat16",) * 2, ((1,), (1,))).key()
    kernels = [(add, 0.0, 5.0),                           # before the first mark: not counted
               (gemm, 10.0, 13.0), (add, 13.0, 14.0), (gemm, 14.0, 16.0), (add, 16.0, 20.0)]
    trace = _step_trace(tmp_path / "step.h5", kernels, marks=[10.0, 20.0])
    assert step_compute_share(trace, "h100-sxm-80gb") == pytest.approx(5.0 / 10.0)


def test_h100_power_table_is_reproduced_from_a_simulated_step(tmp_path, capsys):
    """The preset's step_compute_share (0.70) came from Phantora's trace of the probe's step command; the tool
    recomputes it from a fresh simulation of that command (one GPU), and `--table` prints the preset's whole table
    as TOML that reads back."""
    import tomllib

    from phantora.probes.powerprobe import main, step_compute_share
    from test_live_run import DETERMINISTIC, phantora_run

    trace = tmp_path / "step.h5"
    done = phantora_run("--cluster", "h100-hgx", "--nodes", "1", "--gpus-per-node", "1", *DETERMINISTIC,
                        "--trace", str(trace), "--", "python", "presets/workloads/llama.py", "--model", "llama3-8b",
                        "--layers", "8", "--seq", "8192", "--batch", "2", "--ac", "selective", "--steps", "2",
                        timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    h100 = load_gpu("h100-sxm-80gb")
    assert step_compute_share(trace, "h100-sxm-80gb") == pytest.approx(h100.power.step_compute_share, abs=0.02)
    assert main(["--table", str(MEASURED), "--trace", str(trace), "--gpu", "h100-sxm-80gb"]) == 0
    printed = tomllib.loads(capsys.readouterr().out)["power"]
    assert printed == pytest.approx(to_table(h100.power), abs=0.02)
