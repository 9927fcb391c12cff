"""GPU presets against physics and published facts.

Every expected number below comes from a cited document or measurement, never from the preset files themselves.
"""

from __future__ import annotations

import math

import pytest

from phantora.errors import PresetError
from phantora.gpus import DTYPES, gpu_dir, list_gpus, load_gpu

PRESETS = ["h100-sxm-80gb", "h100-96gb-hbm2e", "h200-sxm-141gb", "h200-nvl",
           "a100-sxm-40gb", "a100-sxm-80gb", "rtx-3090", "b200"]
DATACENTER = [n for n in PRESETS if n != "rtx-3090"]


def rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-30)


# ------------------------------------------------------------------------------------------------------ loading
def test_every_required_preset_exists():
    assert set(PRESETS) <= set(list_gpus())


@pytest.mark.parametrize("name", PRESETS)
def test_preset_loads_and_is_complete(name):
    g = load_gpu(name)
    assert g.name == name, "the preset id inside the file must match its file name"
    assert set(DTYPES) <= set(g.peak_tflops)
    for key in ("peak_tflops", "hbm_bandwidth_gbyte_per_s", "memory_gib", "display_name"):
        assert g.sources.get(key, "").strip(), f"{name}: sources.{key} is empty"
    for key in ("l2_cache_mib", "tdp_w", "boost_clock_mhz", "pcie_gbyte_per_s"):
        assert getattr(g, key) > 0, f"{name}: {key} is not filled"
    assert g.notes.strip()
    assert g.display_name.startswith("NVIDIA "), "torch.cuda.get_device_name() names begin with 'NVIDIA '"


def test_load_by_path_equals_load_by_name():
    path = gpu_dir() / "a100-sxm-80gb.toml"
    assert load_gpu(str(path)) == load_gpu("a100-sxm-80gb")


def test_unknown_preset_lists_known_ones():
    with pytest.raises(PresetError) as exc:
        load_gpu("no-such-gpu")
    assert "h100-sxm-80gb" in str(exc.value)


# --------------------------------------------------------------------------------------------- tensor-core ratios
@pytest.mark.parametrize("name", [n for n in PRESETS if load_gpu(n).arch in ("ampere", "hopper")])
def test_ampere_hopper_fp16_equals_bf16_and_tf32_is_half(name):
    # Ampere (A100 whitepaper 2020, GA102 whitepaper 2021) and Hopper (H100 whitepaper 2022) tensor cores run FP16 and
    # BF16 (FP32 accumulate) at one rate and TF32 at half of it.
    p = load_gpu(name).peak_tflops
    assert p["fp16"] == pytest.approx(p["bf16"], rel=1e-9)
    assert p["tf32"] == pytest.approx(p["bf16"] / 2, rel=5e-3)


@pytest.mark.parametrize("name", [n for n in PRESETS if load_gpu(n).arch in ("hopper", "blackwell")])
def test_fp8_is_twice_bf16_on_hopper_and_blackwell(name):
    # H100 whitepaper: FP8 doubles the FP16/BF16 tensor rate; Blackwell datasheet likewise (FP8 9 vs BF16 4.5 PFLOPS).
    p = load_gpu(name).peak_tflops
    assert p["fp8"] == pytest.approx(2 * p["bf16"], rel=1e-3)


@pytest.mark.parametrize("name", [n for n in PRESETS if load_gpu(n).arch == "ampere"])
def test_ampere_has_no_fp8(name):
    # FP8 tensor cores arrived with Hopper (H100 whitepaper); Ampere presets write 0.0, and the cost model then falls
    # back to the FP32 peak.
    g = load_gpu(name)
    assert g.peak_tflops["fp8"] == 0.0
    assert g.peak_flops("fp8") == g.peak_flops("fp32")


def test_h100_sxm_bf16_dense_peak_is_989_tflops():
    # H100 whitepaper (2022): 989.4 dense BF16 TFLOP/s on H100 SXM5; TorchTitan get_peak_flops uses 989e12 for it.
    g = load_gpu("h100-sxm-80gb")
    assert g.peak_flops("bf16") == pytest.approx(989e12, rel=1e-3)


def test_a100_bf16_dense_peak_is_312_tflops():
    # A100 datasheet (2021): 312 TFLOP/s BF16 dense; TorchTitan get_peak_flops: 312e12.
    for name in ("a100-sxm-40gb", "a100-sxm-80gb"):
        assert load_gpu(name).peak_flops("bf16") == pytest.approx(312e12, rel=1e-3)


def test_h200_nvl_is_slower_than_h200_sxm():
    # H200 datasheet (2024): NVL column 1,671 vs SXM 1,979 BF16 TFLOPS (sparse); 600 W vs 700 W.
    sxm, nvl = load_gpu("h200-sxm-141gb"), load_gpu("h200-nvl")
    assert nvl.peak_tflops["bf16"] / sxm.peak_tflops["bf16"] == pytest.approx(1671 / 1979, rel=2e-3)
    assert nvl.tdp_w < sxm.tdp_w
    assert nvl.hbm_bandwidth_gbyte_per_s == sxm.hbm_bandwidth_gbyte_per_s


# ----------------------------------------------------------------------------------------- clock-level physics
# FP32 results per clock per SM (CUDA C++ Programming Guide, "Arithmetic Instructions" throughput table:
# 64 on compute capability 8.0, 128 on 8.6, 9.0 and 10.0); an FMA counts as 2 FLOPs.
FP32_LANES_PER_SM = {"8.0": 64, "8.6": 128, "9.0": 128, "10.0": 128}


@pytest.mark.parametrize("name", PRESETS)
def test_fp32_peak_is_sms_times_lanes_times_clock(name):
    g = load_gpu(name)
    lanes = FP32_LANES_PER_SM[g.compute_capability]
    implied = g.sm_count * lanes * 2 * g.boost_clock_mhz * 1e6
    assert rel(implied, g.peak_flops("fp32")) < 0.02


# Dense FP16 tensor FMAs per clock per SM at the boost clock where NVIDIA quotes its peaks there: GA100 1024
# (A100 whitepaper 2020, "1024 dense FP16/FP32 FMA operations per clock"), GA102 with FP32 accumulate 256
# (GA102 whitepaper 2021: 512 with FP16 accumulate, half with FP32 accumulate on GeForce).
TENSOR_FMA_PER_SM = {"8.0": 1024, "8.6": 256}


@pytest.mark.parametrize("name", ["a100-sxm-40gb", "a100-sxm-80gb", "rtx-3090"])
def test_ampere_tensor_peak_is_sms_times_fma_times_clock(name):
    g = load_gpu(name)
    implied = g.sm_count * TENSOR_FMA_PER_SM[g.compute_capability] * 2 * g.boost_clock_mhz * 1e6
    assert rel(implied, g.peak_flops("bf16")) < 0.01


def test_hopper_tensor_peak_corresponds_to_1830_mhz():
    # H100 whitepaper: 4096 dense FP16 FLOP per clock per SM (twice A100's 2048); the dense peak corresponds to
    # 1830 MHz, below the 1980 MHz maximum boost of the SXM5 part.
    g = load_gpu("h100-sxm-80gb")
    assert rel(g.sm_count * 4096 * 1830e6, g.peak_flops("bf16")) < 1e-3
    assert g.boost_clock_mhz > 1830


@pytest.mark.parametrize("name,bus_bits,mem_clock_mhz", [
    # torch.cuda.get_device_properties on the parts themselves: memory_bus_width and memory_clock_rate
    # (H100 80GB HBM3: 5120 bit, 2619 MHz; H200: 6016 bit, 3201 MHz); HBM moves 2 bits per pin and clock.
    ("h100-sxm-80gb", 5120, 2619),
    ("h200-sxm-141gb", 6016, 3201),
])
def test_hbm_bandwidth_is_bus_width_times_data_rate(name, bus_bits, mem_clock_mhz):
    implied_gbps = bus_bits * mem_clock_mhz * 1e6 * 2 / 8 / 1e9
    assert rel(implied_gbps, load_gpu(name).hbm_bandwidth_gbyte_per_s) < 0.01


def test_rtx3090_dram_bandwidth_is_bus_width_times_pin_rate():
    # GA102 whitepaper, Appendix A: 384-bit GDDR6X at 19.5 Gbps per pin.
    assert load_gpu("rtx-3090").hbm_bandwidth_gbyte_per_s == pytest.approx(384 * 19.5 / 8, rel=1e-3)


# --------------------------------------------------------------------------------------------------- memory
def test_hbm_bandwidth_ordering():
    # B200 8 TB/s (DGX B200 datasheet) > H200 4.8 (H200 datasheet) > H100 SXM 3.35 (H100 datasheet)
    # > H100 96 GB HBM2e 2.4 (TorchTitan H100 benchmark, 2024-12).
    bw = {n: load_gpu(n).hbm_bandwidth_gbyte_per_s for n in PRESETS}
    assert bw["b200"] > bw["h200-sxm-141gb"] > bw["h100-sxm-80gb"] > bw["h100-96gb-hbm2e"]
    assert bw["a100-sxm-80gb"] > bw["a100-sxm-40gb"]


@pytest.mark.parametrize("name", DATACENTER)
def test_bf16_ridge_point_is_plausible(name):
    # Data-center GPUs since V100 balance compute and HBM at roughly 100-700 FLOP per byte.
    g = load_gpu(name)
    ridge = g.peak_flops("bf16") / g.hbm_bytes_per_s
    assert 100 <= ridge <= 700


def test_ridge_point_grows_from_a100_to_h100():
    # Compute grew ~3.2x from A100 to H100 SXM, HBM bandwidth ~1.6x (datasheets): the ridge point must rise.
    a, h = load_gpu("a100-sxm-80gb"), load_gpu("h100-sxm-80gb")
    assert h.peak_flops("bf16") / h.hbm_bytes_per_s > a.peak_flops("bf16") / a.hbm_bytes_per_s


# Marketed capacity in GB, which for HBM is a binary size (H100 80 GB = 5 stacks × 16 GiB): datasheets cited in
# the presets. The driver reports about 1% less (ECC and firmware reservations).
NOMINAL_GB = {"h100-sxm-80gb": 80, "h100-96gb-hbm2e": 96, "h200-sxm-141gb": 141, "h200-nvl": 141,
              "a100-sxm-40gb": 40, "a100-sxm-80gb": 80, "rtx-3090": 24, "b200": 180}


@pytest.mark.parametrize("name", PRESETS)
def test_driver_reported_memory_is_just_below_the_nominal_capacity(name):
    g = load_gpu(name)
    assert 0.97 * NOMINAL_GB[name] <= g.memory_gib < NOMINAL_GB[name]
    assert abs(g.memory_bytes - g.memory_gib * 2**30) < 0.01 * 2**30
    assert g.memory_bytes % 2**16 == 0           # as the measured totals below: multiples of 64 KiB


@pytest.mark.parametrize("name, measured", [("h100-sxm-80gb", 85_017_493_504), ("h200-sxm-141gb", 150_109_880_320)])
def test_measured_gpus_report_their_total_memory_to_the_byte(name, measured):
    # Measured: torch total_memory on an H100 80GB HBM3 (nvidia-smi total 81559 MiB, 480 MiB reserved) and an H200
    # (143771 MiB, 616 MiB reserved), driver 580.159. A program that prints or compares it sees the same number.
    assert load_gpu(name).memory_bytes == measured


def test_a_total_in_bytes_must_agree_with_the_gib_figure(tmp_path):
    text = (gpu_dir() / "h100-sxm-80gb.toml").read_text()
    bad = tmp_path / "bad.toml"
    bad.write_text(text.replace("memory_total_bytes = 85017493504", "memory_total_bytes = 85017493504000"))
    with pytest.raises(PresetError, match="memory_total_bytes"):
        load_gpu(str(bad))


def test_torchtitan_h100_peak_memory_needs_the_96gb_part():
    # TorchTitan benchmarks/llama3_h100_202412_torchtitan.md: the 8-GPU FSDP run peaked at 82.4 GiB, more than an
    # 80 GB H100 offers and less than the 96 GB HBM2e parts it ran on.
    assert load_gpu("h100-sxm-80gb").memory_gib < 82.4 < load_gpu("h100-96gb-hbm2e").memory_gib


# -------------------------------------------------------------------------------------------------- links
# NVLink bandwidth per link and direction: NVLink3 25 GB/s (A100 whitepaper: 12 links, 600 GB/s total),
# NVLink4 25 GB/s (H100: 18 links, 900 GB/s), NVLink5 50 GB/s (Blackwell: 18 links, 1.8 TB/s).
NVLINK_PER_LINK = {"ampere": 25.0, "hopper": 25.0, "blackwell": 50.0}


@pytest.mark.parametrize("name", PRESETS)
def test_nvlink_per_direction_is_links_times_per_link_rate(name):
    g = load_gpu(name)
    assert g.nvlink_gbyte_per_s == pytest.approx(g.nvlink_links * NVLINK_PER_LINK[g.arch])


def test_nvlink_totals_match_datasheets():
    # Bidirectional totals from the datasheets: A100 600 GB/s, H100/H200 900 GB/s, B200 1.8 TB/s.
    assert 2 * load_gpu("a100-sxm-80gb").nvlink_gbyte_per_s == 600
    assert 2 * load_gpu("h100-sxm-80gb").nvlink_gbyte_per_s == 900
    assert 2 * load_gpu("h200-sxm-141gb").nvlink_gbyte_per_s == 900
    assert 2 * load_gpu("b200").nvlink_gbyte_per_s == 1800
    assert load_gpu("rtx-3090").nvlink_links == 0


@pytest.mark.parametrize("name", PRESETS)
def test_pcie_is_nominal_x16_per_direction(name):
    # PCIe 4.0 x16: 16 GT/s × 16 lanes × 128/130 ≈ 31.5 GB/s, nominal 32; PCIe 5.0 x16: nominal 64 per direction.
    # Ampere parts are PCIe 4.0 (A100, GA102 whitepapers), Hopper and B200 PCIe 5.0 (H100/H200/Blackwell datasheets).
    g = load_gpu(name)
    gen = 4 if g.arch == "ampere" else 5
    assert g.pcie_gbyte_per_s == pytest.approx(2 ** (gen - 4) * 32)
    assert g.pcie_gbyte_per_s == pytest.approx(2 ** gen * 16 * 128 / 130 / 8, rel=0.02)


def test_sm_version():
    assert load_gpu("h100-sxm-80gb").sm_version == 90
    assert load_gpu("rtx-3090").sm_version == 86
    assert load_gpu("b200").sm_version == 100


# ------------------------------------------------------------------------------------------ malformed presets
GOOD = """\
name = "x"
display_name = "NVIDIA X"
arch = "hopper"
compute_capability = "9.0"
sm_count = 132
memory_gib = 79.0
hbm_bandwidth_gbyte_per_s = 3350.0

[peak_tflops]
bf16 = 989.4
fp16 = 989.4
tf32 = 494.7
fp32 = 66.9
fp8 = 1978.9

[sources]
peak_tflops = "a"
hbm_bandwidth_gbyte_per_s = "b"
memory_gib = "c"
"""


def write(tmp_path, text, name="x.toml"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_minimal_good_preset_loads(tmp_path):
    g = load_gpu(write(tmp_path, GOOD))
    assert g.sm_count == 132 and math.isclose(g.peak_tflops["bf16"], 989.4)


@pytest.mark.parametrize("text,key", [
    (GOOD.replace("sm_count = 132", "sm_cout = 132"), "sm_cout"),                       # typo: unknown key
    (GOOD.replace("memory_gib = 79.0\n", ""), "memory_gib"),                            # missing key
    (GOOD.replace("memory_gib = 79.0", "memory_gib = -1.0"), "memory_gib"),             # not positive
    (GOOD.replace("sm_count = 132", 'sm_count = "many"'), "sm_count"),                  # wrong type
    (GOOD.replace("fp8 = 1978.9\n", ""), "peak_tflops"),                                # dtype missing
    (GOOD.replace('memory_gib = "c"\n', ""), "sources.memory_gib"),                     # figure without source
])
def test_malformed_preset_raises_preset_error_naming_the_key(tmp_path, text, key):
    path = write(tmp_path, text)
    with pytest.raises(PresetError) as exc:
        load_gpu(path)
    assert f"key '{key}'" in str(exc.value) and path in str(exc.value)


def test_invalid_toml_names_the_file(tmp_path):
    path = write(tmp_path, "name = \n")
    with pytest.raises(PresetError) as exc:
        load_gpu(path)
    assert path in str(exc.value)
