"""GPU presets: the datasheet figures a cost model needs, each with its source.

One TOML file per GPU model in presets/gpus/. `load_gpu("h100-sxm-80gb")` returns a `GPUSpec`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from .errors import PresetError
from .paths import presets_dir
from .tomlconf import build, check_number, read_toml

DTYPES = ("bf16", "fp16", "tf32", "fp32", "fp8")


@dataclass(frozen=True)
class PowerSpec:
    """How a GPU's board power depends on its SM clock, measured at its default power limit (`[power]` of a GPU
    preset; `python -m phantora.probes.powerprobe` measures it). phantora.costmodel.power uses it to cost the
    same silicon at another power limit."""
    base_w: float                  # power that does not follow the SM clock (the idle GPU's draw)
    dynamic_exponent: float        # under a fixed load, power - base_w grows as (SM clock)^dynamic_exponent
    memory_bound_w: float          # board power while HBM-bound kernels run (SM clock barely matters to them)
    step_power_w: float            # a reference training step at the default limit: average board power
    step_clock_mhz: float          # ... its mean SM clock
    step_compute_share: float      # ... the share of its kernel time in compute-bound kernels
    tensor_clock_mhz: float        # the highest SM clock sustained under tensor-core load, power permitting

    def validate(self) -> None:
        for key in ("base_w", "dynamic_exponent", "memory_bound_w", "step_power_w", "step_clock_mhz",
                    "tensor_clock_mhz"):
            check_number(getattr(self, key), f"power.{key}", positive=True)
        check_number(self.step_compute_share, "power.step_compute_share")
        if not 0.0 < self.step_compute_share <= 1.0:
            raise PresetError("must be in (0, 1]", key="power.step_compute_share")
        if not self.base_w < self.memory_bound_w < self.step_power_w:
            raise PresetError("expected base_w < memory_bound_w < step_power_w", key="power")


@dataclass(frozen=True)
class GPUSpec:
    name: str                      # preset id, e.g. "h100-sxm-80gb"
    display_name: str              # what torch.cuda.get_device_name() should say, e.g. "NVIDIA H100 80GB HBM3"
    arch: str                      # "ampere" | "hopper" | "blackwell" | ...
    compute_capability: str        # "9.0"
    sm_count: int
    memory_gib: float              # usable device memory as the driver reports it, GiB
    hbm_bandwidth_gbyte_per_s: float   # peak DRAM bandwidth, GB/s (10^9 B/s)
    peak_tflops: dict[str, float]  # dense tensor-core / FMA peaks per dtype (bf16, fp16, tf32, fp32, fp8); 0 = unsupported
    nvlink_links: int = 0          # NVLink links per GPU (0: none)
    nvlink_gbyte_per_s: float = 0.0    # total NVLink bandwidth per GPU and direction, GB/s (nominal)
    pcie_gbyte_per_s: float = 32.0     # host link per direction, GB/s (nominal)
    l2_cache_mib: float = 0.0
    tdp_w: float = 0.0
    boost_clock_mhz: float = 0.0
    power: PowerSpec | None = None     # measured power behaviour (GPUs with a kernel profile)
    # the fraction of its architecture's efficiency-table memory rates this GPU's kernels reach, measured on its
    # profile (costmodel.roofline.memory_scale); 1.0 for the GPU the table was fitted on and unmeasured GPUs
    roofline_memory_scale: float = 1.0
    # what CUDA events add to a kernel timed alone on this GPU (the profile's way) beyond the time it holds a busy
    # stream, µs (phantora.probes.streamprobe); None where not measured: the efficiency table's (docs/cost-model.md)
    event_overhead_us: float | None = None
    # the driver's total memory to the byte (torch's total_memory) where measured; 0: memory_gib's bytes, aligned
    # down to the 64 KiB that measured totals are multiples of
    memory_total_bytes: int = 0
    sources: dict[str, str] = field(default_factory=dict)   # field name -> citation
    notes: str = ""

    def validate(self) -> None:
        missing = [d for d in DTYPES if d not in self.peak_tflops]
        if missing:
            raise PresetError(f"peak_tflops lacks {', '.join(missing)} (write 0.0 where the GPU lacks the dtype)",
                              key="peak_tflops")
        for key in ("sm_count", "memory_gib", "hbm_bandwidth_gbyte_per_s", "pcie_gbyte_per_s"):
            check_number(getattr(self, key), key, positive=True)
        for key in ("nvlink_links", "nvlink_gbyte_per_s", "l2_cache_mib", "tdp_w", "boost_clock_mhz"):
            check_number(getattr(self, key), key, nonnegative=True)
        check_number(self.roofline_memory_scale, "roofline_memory_scale", positive=True)
        if self.roofline_memory_scale > 1.0:
            raise PresetError("roofline_memory_scale is a fraction of the efficiency table's rates, at most 1",
                              key="roofline_memory_scale")
        if self.event_overhead_us is not None:
            check_number(self.event_overhead_us, "event_overhead_us", nonnegative=True)
            if self.event_overhead_us >= 20.0:
                raise PresetError("an event overhead is a few microseconds; this is not plausible",
                                  key="event_overhead_us")
        if self.memory_total_bytes:
            check_number(self.memory_total_bytes, "memory_total_bytes", positive=True)
            if abs(self.memory_total_bytes / 2**30 - self.memory_gib) > 0.01:
                raise PresetError(f"{self.memory_total_bytes:,} B is {self.memory_total_bytes / 2**30:.3f} GiB, not "
                                  f"memory_gib = {self.memory_gib:g}", key="memory_total_bytes")
        for dtype, value in self.peak_tflops.items():
            check_number(value, f"peak_tflops.{dtype}", nonnegative=True)
        check_number(self.peak_tflops["fp32"], "peak_tflops.fp32", positive=True)   # the fallback of every dtype
        if self.peak_tflops["bf16"] <= 0 and self.peak_tflops["fp16"] <= 0:
            raise PresetError("a GPU needs a bf16 or fp16 peak", key="peak_tflops")
        if self.power is not None and self.tdp_w <= 0:
            raise PresetError("a [power] table needs tdp_w, the power limit it was measured at", key="tdp_w")
        for key in ("peak_tflops", "hbm_bandwidth_gbyte_per_s", "memory_gib"):
            if key not in self.sources:
                raise PresetError("every datasheet figure needs a source", key=f"sources.{key}")

    @property
    def memory_bytes(self) -> int:
        """Device memory as torch's `total_memory` reports it."""
        if self.memory_total_bytes:
            return int(self.memory_total_bytes)
        return device_bytes(self.memory_gib)

    @property
    def hbm_bytes_per_s(self) -> float:
        return self.hbm_bandwidth_gbyte_per_s * 1e9

    def peak_flops(self, dtype: str) -> float:
        """Peak FLOP/s for a dtype name ('bf16', 'fp32', ...), falling back to fp32 where unsupported."""
        v = self.peak_tflops.get(dtype, 0.0)
        if v <= 0:
            v = self.peak_tflops["fp32"]
        return v * 1e12

    @property
    def sm_version(self) -> int:
        major, minor = self.compute_capability.split(".")
        return int(major) * 10 + int(minor)


def device_bytes(gib: float) -> int:
    """A device memory size given in GiB as a driver reports one: aligned down to 64 KiB (the measured totals of an
    H100 and an H200 are multiples of 64 KiB, not of 1 MiB)."""
    return (int(gib * 2**30) >> 16) << 16


def same_device(a: str, b: str) -> bool:
    """Whether two device names (a preset's display_name, torch.cuda.get_device_name()) name the same GPU: case,
    spacing and the "NVIDIA" prefix aside."""
    def key(s: str) -> str:
        return " ".join(s.lower().replace("nvidia", "").split())
    return key(a) == key(b)


def gpu_dir() -> Path:
    return presets_dir() / "gpus"


def list_gpus() -> list[str]:
    return sorted(p.stem for p in gpu_dir().glob("*.toml"))


@lru_cache(maxsize=None)
def _load(path: str) -> GPUSpec:
    table = read_toml(Path(path))
    return build(GPUSpec, table, file=path)


def load_gpu(name_or_path: str) -> GPUSpec:
    """A GPU preset by name (`h100-sxm-80gb`) or by path to a TOML file."""
    p = Path(name_or_path)
    if p.suffix == ".toml" and p.exists():
        return _load(str(p.resolve()))
    path = gpu_dir() / f"{name_or_path}.toml"
    if not path.exists():
        known = ", ".join(list_gpus()) or "(none)"
        raise PresetError(f"unknown GPU preset '{name_or_path}'; known: {known}")
    return _load(str(path))
