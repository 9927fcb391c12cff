"""Power limits: how much slower compute-bound kernels run when the same GPU has a lower power limit.

A GPU under a power limit lowers its SM clock until its board power, averaged over tens of milliseconds (many
kernels of a training step), is at the limit. Measured on an H100 (presets/profiles/power/, the GPU preset's
`[power]` table):

- a compute-bound kernel's throughput is proportional to the SM clock (bf16 GEMM: 0.48-0.49 TFLOP/s per MHz from
  1,380 to 1,665 MHz), while HBM-bound kernels do not depend on it;
- under a fixed load, board power = base + dynamic x f^gamma: gamma = 2.54 from one GEMM run in bursts of
  different duty cycles (the controller then settles at different clocks for the same kernel);
- a training step (Llama 3 8B layers, sequence 8192) holds the limit: 684 W at 1,570 MHz under 700 W.

The step is modelled as two kinds of kernel time: a share x that is compute-bound (its time scales as f0/f, its
power as base + D (f/f0)^gamma) and the rest, HBM-bound, at a fixed power P_m. The average power over the step is

    P(f) = [x r (base + D r^-gamma) + (1 - x) P_m] / [x r + (1 - x)],    r = f0 / f,

with D fixed by the measured step (P(f0) = step power). The clock under limit C solves P(f) = C (at most the
highest clock measured under tensor-core load); compute-bound kernels measured under limit C0 then take
f(C0) / f(C) times as long under C. Under a limit close to P_m the HBM-bound phases exceed it and the compute
phases make up for them: the controller holds the average, not each kernel.

Approximations: the step's compute share is the reference step's; HBM-bound kernels keep their speed and the
power measured on the profiled GPU's memory (for an H100 with HBM2e instead of HBM3 that power is not measured:
scaling its dynamic part and the HBM-bound time with the bandwidth would give a 1.16x instead of a 1.23x slowdown
at 500 W).
"""

from __future__ import annotations

from ..errors import PhantoraError
from ..gpus import GPUSpec, PowerSpec


def _dynamic_w(p: PowerSpec) -> float:
    """D: the compute-bound kernels' dynamic power at the reference step's clock."""
    x = p.step_compute_share
    compute_w = (p.step_power_w - (1.0 - x) * p.memory_bound_w) / x
    return compute_w - p.base_w


def sustained_clock_mhz(p: PowerSpec, limit_w: float) -> float:
    """The SM clock a training step settles at under `limit_w` (see the module docstring)."""
    if limit_w <= p.base_w:
        raise PhantoraError(f"a {limit_w:.0f} W power limit is at or below the GPU's idle power "
                            f"({p.base_w:.0f} W): no clock could hold it")
    x, g, base, pm = p.step_compute_share, p.dynamic_exponent, p.base_w, p.memory_bound_w
    d = _dynamic_w(p)

    def excess(r: float) -> float:     # energy balance; decreasing in r (slower clock, less power)
        return x * d * r ** (1.0 - g) - x * r * (limit_w - base) - (1.0 - x) * (limit_w - pm)

    lo, hi = 1e-3, 1e3
    for _ in range(200):
        mid = (lo * hi) ** 0.5
        if excess(mid) > 0.0:
            lo = mid
        else:
            hi = mid
    return min(p.step_clock_mhz / hi, p.tensor_clock_mhz)


def compute_slowdown(measured: GPUSpec, target: GPUSpec) -> float:
    """How many times longer a compute-bound kernel measured on `measured` (at its preset power limit) takes on
    `target`, the same silicon at `target.tdp_w`. 1.0 where the limits agree, either is unknown, the GPUs differ
    in architecture, or `measured` has no measured power table."""
    p = measured.power
    if (p is None or measured.tdp_w <= 0 or target.tdp_w <= 0 or target.tdp_w == measured.tdp_w
            or measured.arch.lower() != target.arch.lower() or measured.sm_count != target.sm_count):
        return 1.0
    return sustained_clock_mhz(p, measured.tdp_w) / sustained_clock_mhz(p, target.tdp_w)
