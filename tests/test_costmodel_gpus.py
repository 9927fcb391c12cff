"""GPU specs for the cost-model tests, built directly from datasheets (independent of presets/).

H100 SXM5 80GB — NVIDIA H100 Tensor Core GPU datasheet (nvidia.com, "H100 SXM" column): BF16/FP16 tensor
1,979 TFLOPS and FP8 3,958 TFLOPS *with sparsity* (so 989.4 / 1,978.9 dense), TF32 tensor 989 with sparsity
(494.7 dense), FP32 67 TFLOPS (66.9), GPU memory 80 GB HBM3 at 3.35 TB/s, 132 SMs (H100 SXM5 in NVIDIA's Hopper
architecture whitepaper), 50 MB L2.

A100 SXM4 80GB — NVIDIA A100 Tensor Core GPU datasheet: BF16/FP16 tensor 312 TFLOPS dense, TF32 156, FP32 19.5,
no FP8, 80 GB HBM2e at 2,039 GB/s, 108 SMs.
"""

from phantora.gpus import GPUSpec

_SRC = {"peak_tflops": "NVIDIA datasheet", "hbm_bandwidth_gbyte_per_s": "NVIDIA datasheet",
        "memory_gib": "NVIDIA datasheet"}

H100 = GPUSpec(name="h100-sxm-80gb", display_name="NVIDIA H100 80GB HBM3", arch="hopper", compute_capability="9.0",
               sm_count=132, memory_gib=79.1, hbm_bandwidth_gbyte_per_s=3350.0,
               peak_tflops={"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9, "fp8": 1978.9},
               nvlink_gbyte_per_s=450.0, pcie_gbyte_per_s=64.0, l2_cache_mib=50.0, sources=_SRC)

A100 = GPUSpec(name="a100-sxm-80gb", display_name="NVIDIA A100-SXM4-80GB", arch="ampere", compute_capability="8.0",
               sm_count=108, memory_gib=79.2, hbm_bandwidth_gbyte_per_s=2039.0,
               peak_tflops={"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5, "fp8": 0.0},
               nvlink_gbyte_per_s=300.0, pcie_gbyte_per_s=32.0, l2_cache_mib=40.0, sources=_SRC)

MAX_PEAK = {g.name: max(g.peak_tflops.values()) * 1e12 for g in (H100, A100)}


def test_specs_are_valid():
    for g in (H100, A100):
        g.validate()
        # datasheet consistency: dense bf16 is twice dense tf32 on both parts
        assert abs(g.peak_tflops["bf16"] / g.peak_tflops["tf32"] - 2.0) < 0.01

