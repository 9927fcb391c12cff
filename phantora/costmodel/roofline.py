"""Roofline cost model: duration from FLOPs, bytes and per-family efficiencies of one GPU.

    duration = max(flops / (peak(dtype) * eff_c(family, flops)), bytes / (hbm_bw * eff_m(family, bytes)))
               + launches * latency

with size-saturating efficiencies

    eff_c(W) = compute_max * W / (W + w0_flops)        eff_m(B) = memory_max * B / (B + b0_bytes)

Note that `W / (peak * compute_max * W / (W + w0))` = `(W + w0) / (peak * compute_max)`: the saturation is the same
as a fixed extra time `w0 / (peak * compute_max)` per kernel (ramp-up, tail wave, prologue), paid only by the bound
that dominates. `latency` is the GPU-side time of a kernel that does nothing (launch, ramp, drain). FLOPs of
tensor-core families (matmul, conv, attention) run at the tensor-core peak of their dtype; every other family at the
CUDA-core fp32 peak. Efficiencies never exceed 1, so a duration is never below max(flops/peak, bytes/bandwidth).

docs/cost-model.md gives the values of the default tables, where they come from, and how `fit_efficiencies` learns
them from a measured profile database.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Mapping

from ..engine.ops import CostSource
from ..errors import PhantoraError
from ..gpus import GPUSpec
from . import families as fam
from .cost import Cost
from .families import Work, work
from .signature import Signature

if TYPE_CHECKING:
    from .profiledb import ProfileDB


@dataclass(frozen=True)
class FamilyEfficiency:
    """Fractions of the datasheet peaks one family of kernels reaches."""

    compute: float            # asymptotic fraction of peak FLOP/s (large kernels)
    memory: float             # asymptotic fraction of HBM bandwidth (large kernels)
    w0_flops: float = 0.0     # FLOPs at which the compute efficiency is half of `compute`
    b0_bytes: float = 0.0     # bytes at which the memory efficiency is half of `memory`

    def validate(self, family: str) -> None:
        for name in ("compute", "memory"):
            v = getattr(self, name)
            if not (0.0 < v <= 1.0):
                raise PhantoraError(f"efficiency table: {family}.{name} = {v} must be in (0, 1]")
        if self.w0_flops < 0 or self.b0_bytes < 0:
            raise PhantoraError(f"efficiency table: {family} saturation constants must be >= 0")


PAGEABLE_SHARE = {"h2d-pageable": 0.39, "d2h-pageable": 0.30}
"""A copy between a GPU and pageable (not pinned) host memory, which the driver stages through a pinned buffer, as a
share of the pinned rate: measured on an H200 host with 1 GiB copies (`python -m phantora.probes.copyprobe`;
groundtruth/hostcpu/copies-h200.json: pinned 55.0 / 55.3 GB/s, pageable 21.4 to the GPU, 16.3 from it)."""

BLOCK_STEP_S = 0.414e-6
BLOCK_FIXED_S = 5.0e-6
"""A kernel that gives each channel one thread block (`Work.blocks`, `Work.block_steps`: SyncBatchNorm's NCHW
statistics and backward reductions) is bound by the steps its threads take in sequence, each a load from DRAM whose
latency few blocks cannot hide: `waves x steps x BLOCK_STEP_S + BLOCK_FIXED_S` at least, a wave being as many blocks
as the SMs hold (2,048 threads each). Fitted on an H200 to the reductions of inputs larger than its L2
(groundtruth/syncbn/: 406-443 ns a step over 224 to 800 steps, dtype alike); an H100, held out, takes the same
steps (its large reductions costed 0.96-1.01 of measured). The figures stand for every GPU."""


@dataclass(frozen=True)
class EfficiencyTable:
    """Per-family efficiencies of one GPU architecture plus the per-kernel latency."""

    families: Mapping[str, FamilyEfficiency]
    latency_s: float = 2.5e-6          # GPU time of an empty kernel (see module docstring)
    pcie_efficiency: float = 0.80      # fraction of the nominal host link reached by large pinned copies
    provenance: str = ""
    samples: Mapping[str, int] = field(default_factory=dict)   # measured samples behind each fitted family
    # the CUDA events' share of every time the table was fitted on (latency_s included): what they add to a kernel
    # beyond the time it holds a busy stream on the GPU the table was fitted on (the cost model subtracts it)
    event_overhead_s: float = 0.0

    def get(self, family: str) -> FamilyEfficiency:
        e = self.families.get(family)
        return e if e is not None else self.families[fam.OTHER]

    def lookup(self, w: Work) -> FamilyEfficiency:
        """The most specific entry for a kernel: 'op:<op>.<variant>', 'op:<op>', '<family>.<variant>', '<family>',
        then 'other'."""
        f = self.families
        for key in lookup_keys(w):
            e = f.get(key)
            if e is not None:
                return e
        return f[fam.OTHER]

    def validate(self) -> None:
        if fam.OTHER not in self.families:
            raise PhantoraError("efficiency table lacks the 'other' family (the fallback)")
        for k, v in self.families.items():
            v.validate(k)
        if not (0.0 <= self.latency_s < 1e-3):
            raise PhantoraError(f"efficiency table: latency {self.latency_s} s is not plausible")
        if not (0.0 < self.pcie_efficiency <= 1.0):
            raise PhantoraError("efficiency table: pcie_efficiency must be in (0, 1]")
        if not (0.0 <= self.event_overhead_s <= self.latency_s):
            raise PhantoraError(f"efficiency table: event overhead {self.event_overhead_s} s must be within its "
                                f"latency {self.latency_s} s")

    def to_dict(self) -> dict:
        return {"latency_s": self.latency_s, "pcie_efficiency": self.pcie_efficiency, "provenance": self.provenance,
                "event_overhead_s": self.event_overhead_s,
                "samples": dict(self.samples),
                "families": {k: {"compute": v.compute, "memory": v.memory, "w0_flops": v.w0_flops,
                                 "b0_bytes": v.b0_bytes} for k, v in self.families.items()}}

    @classmethod
    def from_dict(cls, d: Mapping) -> "EfficiencyTable":
        try:
            t = cls({k: FamilyEfficiency(float(v["compute"]), float(v["memory"]), float(v.get("w0_flops", 0.0)),
                                         float(v.get("b0_bytes", 0.0))) for k, v in d["families"].items()},
                    float(d.get("latency_s", 2.5e-6)), float(d.get("pcie_efficiency", 0.8)),
                    str(d.get("provenance", "")), dict(d.get("samples", {})),
                    # tables saved before the field existed were fitted on event times too
                    float(d.get("event_overhead_s",
                                min(HOPPER_EVENT_OVERHEAD_S, float(d.get("latency_s", 2.5e-6))))))
        except (KeyError, TypeError, ValueError) as e:
            raise PhantoraError(f"malformed efficiency table: {e}") from None
        t.validate()
        return t


def lookup_keys(w: Work) -> tuple[str, ...]:
    """Table keys that may hold a kernel's efficiencies, most specific first."""
    if w.variant:
        return (f"op:{w.op}.{w.variant}", f"op:{w.op}", f"{w.family}.{w.variant}", w.family)
    return (f"op:{w.op}", w.family)


# ---- default tables -----------------------------------------------------------------------------------------------
# Entry: (compute, memory, w0_flops, b0_bytes). Keys: a family, '<family>.<variant>', or 'op:<op packet name>'.

HOPPER_PROVENANCE = ("fitted by fit_efficiencies on one H100 SXM 80GB (driver 580.159.04, torch 2.11.0+cu130, "
                     "2026-11-23) from the 240 signatures of phantora.costmodel.calibrate; out of sample, the same "
                     "table predicts an H200's measurements of the calibration set with a median |error| of 6.9%")

_HOPPER: dict[str, tuple[float, float, float, float]] = {
    fam.MATMUL: (0.749, 0.775, 4.51e8, 5.72e6),
    fam.CONV: (0.333, 0.382, 9.05e9, 2.0e6),  # NCHW bf16 cuDNN convolutions: a rough fit (+-50%)
    # Convolutions by direction, layout and channels per group (families/gemm.py `conv_variant`): the conv entry
    # with both efficiencies divided by the median of measured over conv-entry time of each group's kernels in the
    # H200 profile (groundtruth/insitu/h200-conv-grid/: ResNet-50, SD 1.5 UNet and depthwise layers, bf16 and
    # fp32, NCHW and channels-last; `python groundtruth/insitu/h200-conv-grid/conv_variants.py
    # presets/profiles/h200-sxm-141gb.h5`). The H100's five calibration convolutions agree (median 0.77 / 1.16 of
    # the conv entry forward / backward, its RGB stem 6.2 / 11.1 times)
    "op:convolution": (0.474, 0.544, 9.05e9, 2.0e6),                    # 79 kernels, 0.41-1.84 of the median
    "op:convolution.channels_last": (0.819, 0.939, 9.05e9, 2.0e6),      # 24
    "op:convolution.depthwise": (0.215, 0.247, 9.05e9, 2.0e6),          # 4
    "op:convolution.depthwise.channels_last": (0.648, 0.743, 9.05e9, 2.0e6),  # 4
    "op:convolution.narrow": (0.125, 0.143, 9.05e9, 2.0e6),             # 7 (RGB stems, 4-channel latents)
    "op:convolution.narrow.channels_last": (0.2, 0.23, 9.05e9, 2.0e6),  # 4
    "op:convolution_backward": (0.351, 0.403, 9.05e9, 2.0e6),           # 85
    "op:convolution_backward.channels_last": (0.455, 0.522, 9.05e9, 2.0e6),     # 24
    "op:convolution_backward.depthwise": (0.0804, 0.0923, 9.05e9, 2.0e6),       # 4
    "op:convolution_backward.depthwise.channels_last": (0.179, 0.205, 9.05e9, 2.0e6),  # 4
    "op:convolution_backward.narrow": (0.0802, 0.092, 9.05e9, 2.0e6),           # 7
    "op:convolution_backward.narrow.channels_last": (0.0601, 0.0689, 9.05e9, 2.0e6),  # 4
    fam.ATTN_FWD: (0.367, 0.8, 4.81e9, 2.0e6),
    fam.ATTN_BWD: (0.309, 0.8, 1.51e10, 2.0e6),
    fam.ELEMENTWISE: (0.5, 0.903, 0.0, 1.69e6),
    fam.REDUCTION: (0.5, 0.857, 0.0, 2.09e7),
    fam.NORM: (0.5, 0.633, 0.0, 8.09e6),
    fam.SOFTMAX: (0.5, 0.459, 0.0, 6.07e6),
    fam.EMBEDDING: (0.5, 0.76, 0.0, 2.32e6),
    fam.LOSS: (0.5, 0.989, 0.0, 5.59e7),
    fam.OPTIMIZER: (0.5, 0.834, 0.0, 0.0),
    fam.COPY: (0.5, 0.865, 0.0, 2.06e6),
    fam.INDEX: (0.5, 0.983, 0.0, 2.45e7),
    fam.CAT: (0.5, 0.863, 0.0, 4.62e6),
    fam.OTHER: (0.3, 0.5, 0.0, 4.0e6),  # unknown ops: a deliberately pessimistic guess
    "elementwise.broadcast": (0.5, 0.476, 0.0, 2.55e6),
    "op:_fused_rms_norm": (0.5, 0.641, 0.0, 3.19e6),
    "op:_fused_rms_norm_backward": (0.5, 0.378, 0.0, 2.59e6),
    "op:_scaled_dot_product_cudnn_attention": (0.718, 0.8, 7.42e9, 2.0e6),
    "op:_scaled_dot_product_cudnn_attention_backward": (0.595, 0.8, 2.6e10, 2.0e6),
    "op:_scaled_dot_product_efficient_attention": (0.199, 0.8, 3.8e9, 2.0e6),
    "op:_scaled_dot_product_efficient_attention_backward": (0.145, 0.8, 2.64e9, 2.0e6),
    "op:_scaled_mm": (0.735, 0.775, 5.68e9, 5.72e6),
    "op:_softmax": (0.5, 0.389, 0.0, 2.58e6),
    # rows <= 2048 elements (one warp per row, one pass): [2, 32, 2048, 2048] fp32 measured 0.729 ms on one H100
    # (presets/profiles megatron signatures; 2.15 GB, 0.88 of 3.35 TB/s); the same kernel on an H200 reached 0.81
    "op:_softmax.warp": (0.5, 0.88, 0.0, 2.58e6),
    "op:_to_copy": (0.5, 0.594, 0.0, 3.94e6),
    "op:bmm": (0.749, 0.805, 4.51e8, 2.43e6),
    "op:embedding": (0.5, 0.864, 0.0, 7.21e6),
    "op:embedding_dense_backward": (0.5, 0.417, 0.0, 2.32e6),
    "op:fill_": (0.5, 0.988, 0.0, 5.78e3),
    "op:gather": (0.5, 0.143, 0.0, 3.84e6),
    "op:gelu": (0.5, 0.858, 0.0, 3.02e6),
    "op:index": (0.5, 0.898, 0.0, 8.4e6),
    "op:index_select": (0.5, 0.898, 0.0, 8.6e6),
    "op:native_layer_norm": (0.5, 0.686, 0.0, 1.01e7),
    "op:native_layer_norm_backward": (0.5, 0.373, 0.0, 2.68e6),
    "op:silu": (0.5, 0.906, 0.0, 3.58e6),
}
HOPPER_LATENCY_S = 4.0e-6    # 10th percentile of the CUDA-event times of near-empty kernels on the H100
# The H100's event overhead (its preset's event_overhead_us, presets/profiles/stream/): the table was fitted on
# CUDA-event times of that GPU
HOPPER_EVENT_OVERHEAD_S = 2.3e-6

# Ampere has no measured profile yet. Its table is Hopper's with (a) the saturation constants rescaled to the same
# ramp time on A100's peaks (w0 x 312/989.4, b0 x 2039/3350, A100 vs H100 SXM datasheets), and (b) the tensor-core
# efficiencies literature reports for A100 instead of Hopper's: dense bf16 GEMMs through cuBLAS at ~80% of peak,
# FlashAttention-2 (PyTorch's flash kernel) at up to 73% of peak forward and ~63% backward (Dao, "FlashAttention-2",
# 2023, A100 benchmarks), taken as 0.65 / 0.55 since those are its best cases; cuDNN attention taken equal to
# flash, memory-efficient attention at Hopper's measured ratio to flash (~0.54 / 0.47). Memory-bound fractions are
# Hopper's. Refit with `fit_efficiencies` once an A100 profile exists.
AMPERE_PROVENANCE = ("Hopper's fitted table adapted to Ampere from published A100 figures (cuBLAS GEMM ~80% of peak, "
                     "FlashAttention-2 paper); not fitted to a measured A100 profile")
_AMPERE_COMPUTE = {
    fam.MATMUL: 0.80, "op:bmm": 0.80,
    fam.ATTN_FWD: 0.65, fam.ATTN_BWD: 0.55,
    "op:_scaled_dot_product_cudnn_attention": 0.65, "op:_scaled_dot_product_cudnn_attention_backward": 0.55,
    "op:_scaled_dot_product_efficient_attention": 0.35,
    "op:_scaled_dot_product_efficient_attention_backward": 0.26,
}


def _ampere_from_hopper() -> dict[str, tuple[float, float, float, float]]:
    w_scale, b_scale = 312.0 / 989.4, 2039.0 / 3350.0
    out = {}
    for k, (c, m, w0, b0) in _HOPPER.items():
        if k == "op:_scaled_mm":                   # no fp8 units: the fp8 GEMM falls back to 16-bit rate
            continue
        out[k] = (_AMPERE_COMPUTE.get(k, c), m, w0 * w_scale, b0 * b_scale)
    return out


def _table(raw: Mapping[str, tuple[float, float, float, float]], latency: float, provenance: str) -> EfficiencyTable:
    return EfficiencyTable({k: FamilyEfficiency(c, m, w0, b0) for k, (c, m, w0, b0) in raw.items()}, latency,
                           provenance=provenance, event_overhead_s=HOPPER_EVENT_OVERHEAD_S)


DEFAULT_TABLES: dict[str, EfficiencyTable] = {
    "hopper": _table(_HOPPER, HOPPER_LATENCY_S, HOPPER_PROVENANCE),
    "ampere": _table(_ampere_from_hopper(), HOPPER_LATENCY_S, AMPERE_PROVENANCE),
}


def default_table(gpu: GPUSpec) -> EfficiencyTable:
    """The built-in efficiency table of the GPU's architecture (Hopper's for architectures without one)."""
    t = DEFAULT_TABLES.get(gpu.arch.lower())
    if t is not None:
        return t
    base = DEFAULT_TABLES["hopper"]
    return replace(base, provenance=f"{gpu.arch}: no table of its own; Hopper's fractions reused ({base.provenance})")


# ---- the model ----------------------------------------------------------------------------------------------------

def peak_flops(gpu: GPUSpec, key: str) -> float:
    """Peak FLOP/s of `gpu` for a peak-table key, with the fallbacks of dtypes a GPU lacks."""
    p = gpu.peak_tflops
    v = p.get(key, 0.0)
    if v > 0:
        return v * 1e12
    if key == "fp8":                          # no fp8 units (pre-Hopper): the kernel would run at 16-bit rate
        return peak_flops(gpu, "bf16")
    if key == "int8":                         # int8 tensor cores: 2x the 16-bit rate on A100 and H100
        return 2.0 * peak_flops(gpu, "bf16")
    if key in ("bf16", "fp16"):
        other = p.get("fp16" if key == "bf16" else "bf16", 0.0)
        if other > 0:
            return other * 1e12
    if key == "fp64":                         # FP64 vector rate is half the FP32 rate on A100 and H100
        return 0.5 * peak_flops(gpu, "fp32")
    return gpu.peak_flops("fp32")


class RooflineModel:
    """Costs a signature on one GPU from its FLOPs and bytes (see module docstring)."""

    def __init__(self, gpu: GPUSpec, table: EfficiencyTable | None = None, compute_slowdown: float = 1.0):
        self.gpu = gpu
        self.table = table or default_table(gpu)
        self.table.validate()
        # > 1 for a GPU held at a lower power limit than the one the efficiencies describe (costmodel/power.py)
        self.compute_slowdown = compute_slowdown
        self._bw = gpu.hbm_bytes_per_s * gpu.roofline_memory_scale
        self._pcie = gpu.pcie_gbyte_per_s * 1e9 * self.table.pcie_efficiency
        self._peaks: dict[str, float] = {}

    def peak(self, w: Work) -> float:
        key = w.dtype if w.tensor_core else ("fp64" if w.dtype == "fp64" else "fp32")
        p = self._peaks.get(key)
        if p is None:
            p = self._peaks[key] = peak_flops(self.gpu, key) / self.compute_slowdown
        return p

    def estimate(self, sig: Signature) -> Cost:
        return self.cost_of(work(sig))

    def duration(self, w: Work) -> float:
        """Seconds one kernel doing `w` takes (0 for no kernel)."""
        if w.is_view:
            return 0.0
        t = self.table
        lat = t.latency_s * w.launches
        if w.xfer:
            return w.nbytes / (self._pcie * PAGEABLE_SHARE.get(w.xfer, 1.0)) + lat
        e = t.lookup(w)
        f = w.kernel_flops
        tc = (f + e.w0_flops) / (self.peak(w) * e.compute) if f > 0 else 0.0
        tm = (w.nbytes + e.b0_bytes) / (self._bw * e.memory) if w.nbytes > 0 else 0.0
        if w.blocks:
            waves = -(-w.blocks // (self.gpu.sm_count * (2048 // w.block_threads)))
            tm = max(tm, waves * w.block_steps * BLOCK_STEP_S + BLOCK_FIXED_S)
        return max(tc, tm) + lat

    def cost_of(self, w: Work) -> Cost:
        if w.is_view:
            return Cost(0.0, 0.0, 0.0, w.family, CostSource.NONE, True)
        return Cost(self.duration(w), w.flops, w.nbytes, w.family, CostSource.ROOFLINE)

    def bound(self, w: Work) -> str:
        """'compute' or 'memory': which roof limits this kernel at the table's efficiencies."""
        e = self.table.lookup(w)
        f = w.kernel_flops
        tc = (f + e.w0_flops) / (self.peak(w) * e.compute) if f > 0 else 0.0
        tm = (w.nbytes + e.b0_bytes) / (self._bw * e.memory) if w.nbytes > 0 else 0.0
        return "compute" if tc > tm else "memory"


# ---- fitting ------------------------------------------------------------------------------------------------------

MIN_SAMPLES = 3
MIN_IMPROVEMENT = 0.05      # an op-level entry is kept when it lowers its ops' median |error| by 5 points


@dataclass(frozen=True)
class _Sample:
    family: str
    op: str
    variant: str
    ideal_c: float    # kernel flops / peak (s), 0 when no flops
    ideal_m: float    # bytes / bandwidth (s)
    inv_peak: float   # 1 / peak FLOP/s of the sample's dtype
    launches: int
    t: float          # measured median (s)


def _samples(profile_db: "ProfileDB", gpu: GPUSpec) -> list[_Sample]:
    model = RooflineModel(gpu, EfficiencyTable({fam.OTHER: FamilyEfficiency(1.0, 1.0)}, 0.0))
    out = []
    for key, rec in profile_db.items():
        w = work(Signature.from_key(key))
        if w.is_view or w.xfer or rec.median_us <= 0:
            continue
        p = model.peak(w)
        out.append(_Sample(w.family, w.op, w.variant, w.kernel_flops / p, w.nbytes / gpu.hbm_bytes_per_s, 1.0 / p,
                           w.launches, rec.median_us * 1e-6))
    return out


def _predict(s: _Sample, e: FamilyEfficiency, latency: float, inv_bw: float) -> float:
    tc = (s.ideal_c + e.w0_flops * s.inv_peak) / e.compute if s.ideal_c > 0 else 0.0
    tm = (s.ideal_m + e.b0_bytes * inv_bw) / e.memory if s.ideal_m > 0 else 0.0
    return max(tc, tm) + latency * s.launches


def _median_error(samples: list[_Sample], e: FamilyEfficiency, latency: float, inv_bw: float) -> float:
    import numpy as np

    return float(np.median([abs(_predict(s, e, latency, inv_bw) / s.t - 1.0) for s in samples]))


def _fit_roof(x: list[float], z: list[float], y: list[float], t: list[float], base_eff: float, base_const: float
              ) -> tuple[float, float]:
    """Efficiency and saturation constant of one roof.

    Per sample: x = ideal time at peak, z = 1/peak rate, y = measured time less latency, t = measured time.
    Model: y = (x + const * z) / eff, linear in (x, z) with coefficients a = 1/eff, b = const/eff, solved for the
    least absolute residual relative to the measured time t (iteratively reweighted least squares): relative, so
    that small kernels, whose y is mostly noise, weigh no more than large ones; absolute, so that a minority of
    kernels of another kind (one slow op in a family) do not drag the family's fit. With fewer than 3 samples or
    a size range under 4x only the efficiency is fitted (the median of (x + base_const*z) / y), keeping the base
    constant.
    """
    import numpy as np

    xs, zs, ys, ts = (np.asarray(v, float) for v in (x, z, y, t))
    if len(xs) >= MIN_SAMPLES and xs.max() >= 4 * xs.min():
        cx, cz = float(np.median(xs / ts)) or 1.0, float(np.median(zs / ts)) or 1.0
        A = np.stack([xs / ts / cx, zs / ts / cz], axis=1)
        rhs = ys / ts
        a, b = _irls(A, rhs)
        a, b = a / cx, b / cz
        if b < 0:                                      # no saturation visible: refit through the origin
            a, b = _irls(A[:, :1], rhs)[0] / cx, 0.0
        if a > 0 and math.isfinite(a):
            eff = min(1.0, 1.0 / a)
            return eff, max(0.0, b * eff)
    keep = ys > 0
    if not keep.any():
        return base_eff, base_const
    ratios = (xs[keep] + base_const * zs[keep]) / ys[keep]
    return min(1.0, max(1e-3, float(np.median(ratios)))), base_const


def _irls(A, rhs, iterations: int = 50) -> tuple[float, float]:
    """Least-absolute-deviation solution of A @ coef ~ rhs (1 or 2 columns) by iteratively reweighted LS."""
    import numpy as np

    coef, *_ = np.linalg.lstsq(A, rhs, rcond=None)
    for _ in range(iterations):
        w = 1.0 / np.maximum(np.abs(A @ coef - rhs), 1e-4)
        sw = np.sqrt(w)
        new, *_ = np.linalg.lstsq(A * sw[:, None], rhs * sw, rcond=None)
        if np.allclose(new, coef, rtol=1e-9, atol=0.0):
            coef = new
            break
        coef = new
    return float(coef[0]), float(coef[1]) if len(coef) > 1 else 0.0


def _fit_entry(samples: list[_Sample], base: FamilyEfficiency, latency: float, inv_bw: float,
               rounds: int = 4) -> FamilyEfficiency:
    """Fit both roofs of one table entry from its samples.

    Samples are split by the roof that binds them under the current entry (at first `base`), each roof is fitted
    on its share, and the split is redone with the new entry until it no longer changes (at most `rounds` times).
    """
    entry = base
    split: list[bool] | None = None
    for _ in range(rounds):
        comp: list[tuple[float, float, float, float]] = []
        mem: list[tuple[float, float, float, float]] = []
        new_split = []
        for s in samples:
            y = s.t - latency * s.launches
            if y <= 0:
                continue
            tc = (s.ideal_c + entry.w0_flops * s.inv_peak) / entry.compute if s.ideal_c > 0 else 0.0
            tm = (s.ideal_m + entry.b0_bytes * inv_bw) / entry.memory
            new_split.append(tc > tm)
            if tc > tm:
                comp.append((s.ideal_c, s.inv_peak, y, s.t))
            else:
                mem.append((s.ideal_m, inv_bw, y, s.t))
        if new_split == split:
            break
        split = new_split
        compute, w0, memory, b0 = entry.compute, entry.w0_flops, entry.memory, entry.b0_bytes
        if len(comp) >= MIN_SAMPLES:
            compute, w0 = _fit_roof(*map(list, zip(*comp)), base.compute, base.w0_flops)
        if len(mem) >= MIN_SAMPLES:
            memory, b0 = _fit_roof(*map(list, zip(*mem)), base.memory, base.b0_bytes)
        entry = FamilyEfficiency(compute, memory, w0, b0)
    return entry


MEMORY_SCALE_FAMILIES = (fam.ELEMENTWISE, fam.COPY, fam.CAT, fam.EMBEDDING)
MEMORY_SCALE_MIN_BYTES = 8e6


def memory_scale(profile_db: "ProfileDB", gpu: GPUSpec, table: EfficiencyTable | None = None) -> tuple[float, int]:
    """(scale, kernels) for a GPU's `roofline_memory_scale`: the median, over its profile's memory-bound kernels of
    the plain families (element-wise, copies, cat, embedding; at least 8 MB, where the bandwidth term dominates), of
    the efficiency table's time at the datasheet bandwidth over the measured time. 1.0 means the table's memory
    fractions hold on this GPU as on the one they were fitted on."""
    import statistics

    from .signature import Signature

    plain = replace(gpu, roofline_memory_scale=1.0)
    model = RooflineModel(plain, table)
    ratios = []
    for key, rec in profile_db.items():
        try:
            sig = Signature.from_key(key)
            w = work(sig)
        except PhantoraError:
            continue
        if w.is_view or w.family not in MEMORY_SCALE_FAMILIES or w.nbytes < MEMORY_SCALE_MIN_BYTES:
            continue
        if w.kernel_flops / plain.peak_flops("fp32") >= w.nbytes / plain.hbm_bytes_per_s:
            continue                                   # not memory-bound
        predicted = model.estimate(sig).duration_s * 1e6
        if predicted > 0 and rec.median_us > 0:
            ratios.append(predicted / rec.median_us)
    if len(ratios) < 20:
        raise PhantoraError(f"{profile_db.path} has {len(ratios)} memory-bound kernels of the plain families "
                            f"(at least 20 are needed to fit roofline_memory_scale)")
    return min(1.0, statistics.median(ratios)), len(ratios)


def fit_efficiencies(profile_db: "ProfileDB", gpu: GPUSpec, base: EfficiencyTable | None = None) -> EfficiencyTable:
    """Learn the efficiency table (and the per-kernel latency) of `gpu` from a measured profile database.

    1. latency: the 10th percentile of the measured times of the kernels whose ideal time at peak is under 0.2 us
       (at least 3 of them; otherwise the base table's). A low percentile, not the median: the fixed time of a
       near-empty kernel differs by family, and the difference belongs in each family's saturation constant,
       which cannot be negative;
    2. each family: both roofs fitted on its samples without a variant (`_fit_entry`, `_fit_roof`); each variant
       with at least 3 samples ('elementwise.broadcast') gets an entry of its own;
    3. each op (and op variant) with at least 3 samples gets an entry 'op:<op>' when that lowers the median
       |relative error| of its samples by at least 5 percentage points over the family entry.
    Entries without enough samples keep the base table's values.
    """
    import numpy as np

    base = base or default_table(gpu)
    samples = _samples(profile_db, gpu)
    if not samples:
        raise PhantoraError(f"profile database {profile_db.path} has no kernel samples to fit efficiencies from")
    tiny = [s.t / s.launches for s in samples if max(s.ideal_c, s.ideal_m) < 0.2e-6]
    latency = float(np.percentile(tiny, 10)) if len(tiny) >= MIN_SAMPLES else base.latency_s
    inv_bw = 1.0 / gpu.hbm_bytes_per_s
    entries: dict[str, FamilyEfficiency] = {k: v for k, v in base.families.items() if not k.startswith("op:")}
    counts: dict[str, int] = {}
    by_family: dict[str, list[_Sample]] = {}
    for s in samples:
        by_family.setdefault(s.family, []).append(s)
    for family, fs in sorted(by_family.items()):
        plain = [s for s in fs if not s.variant]
        entry = _fit_entry(plain or fs, base.get(family), latency, inv_bw)
        entries[family] = entry
        counts[family] = len(plain or fs)
        for variant in sorted({s.variant for s in fs if s.variant}):
            vs = [s for s in fs if s.variant == variant]
            if len(vs) >= MIN_SAMPLES:
                key = f"{family}.{variant}"
                entries[key] = _fit_entry(vs, entry, latency, inv_bw)
                counts[key] = len(vs)
    groups: dict[tuple[str, str], list[_Sample]] = {}
    for s in samples:
        groups.setdefault((s.op, s.variant), []).append(s)
    for (op, variant), os_ in sorted(groups.items()):
        if len(os_) < MIN_SAMPLES:
            continue
        current = entries.get(f"{os_[0].family}.{variant}") if variant else None
        current = current or entries.get(os_[0].family) or entries[fam.OTHER]
        cand = _fit_entry(os_, current, latency, inv_bw)
        if _median_error(os_, current, latency, inv_bw) - _median_error(os_, cand, latency, inv_bw) \
                >= MIN_IMPROVEMENT:
            key = f"op:{op}.{variant}" if variant else f"op:{op}"
            entries[key] = cand
            counts[key] = len(os_)
    meta = profile_db.meta
    prov = (f"fitted {datetime.now(timezone.utc).strftime('%Y-%m-%d')} from {len(samples)} samples of "
            f"{meta.get('gpu', '?')} (driver {meta.get('driver', '?')}, torch {meta.get('torch_version', '?')})")
    overhead = (gpu.event_overhead_us * 1e-6 if gpu.event_overhead_us is not None else base.event_overhead_s)
    table = EfficiencyTable(entries, latency, base.pcie_efficiency, prov, counts, min(overhead, latency))
    table.validate()
    return table
