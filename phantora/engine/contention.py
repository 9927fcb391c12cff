"""NCCL's kernels and compute kernels sharing one GPU: how much each slows the other.

A collective runs as a CUDA kernel on some of the GPU's SMs and moves its data through the GPU's memory; compute
kernels beside it on other streams lose SM time and memory bandwidth to it, and it to them. Measured on an H200
(`torchrun -m phantora.costmodel.overlapprobe`, presets/profiles/overlap/), a GEMM or attention kernel takes about
9% longer while an all-gather, reduce-scatter or all-reduce runs beside it, an HBM-bound kernel about 15%, and the
collective takes 1.3 to 2.2 times as long beside them. A GPU preset's `[overlap]` table holds the three factors
(gpus.OverlapSpec); without one, the engine runs collectives and kernels side by side at full speed.

The engine (core.py) applies them, one code path for live runs and replay:
- a kernel placed on a stream is lengthened by (factor - 1) x the time it overlaps the collectives of its rank
  (started ones, with their estimated end until they finish), the factor by whether the kernel is compute- or
  HBM-bound (its FLOPs per byte against the GPU's ridge point);
- a collective starting on the network moves its bytes 1 + (collective_slowdown - 1) x busy times slower, where
  busy is the share of its idle-network time that compute already queued on its ranks' streams covers (the
  busiest rank's).
First-order: a kernel's stretch does not re-enter the overlap it is computed from, and work queued after a
collective started does not slow it.
"""

from __future__ import annotations

from ..gpus import GPUSpec, OverlapSpec
from .ops import Op

QUANTUM = 0.05     # collective factors are rounded to this step (plans are cached per factor)


class Contention:
    def __init__(self, spec: OverlapSpec, ridge_flops_per_byte: float):
        self.compute = spec.compute_kernel_slowdown - 1.0
        self.memory = spec.memory_kernel_slowdown - 1.0
        self.collective = spec.collective_slowdown - 1.0
        self.ridge = ridge_flops_per_byte

    @classmethod
    def of(cls, gpu: GPUSpec) -> "Contention | None":
        """The GPU's contention model, or None where its preset has no `[overlap]` table."""
        if gpu.overlap is None:
            return None
        return cls(gpu.overlap, gpu.peak_flops("bf16") / gpu.hbm_bytes_per_s)

    def extra(self, op: Op) -> float:
        """Slowdown - 1 of a kernel while a collective runs beside it."""
        nbytes = op.nbytes
        if nbytes > 0 and op.flops / nbytes < self.ridge:
            return self.memory
        return self.compute if op.flops > 0 else self.memory

    @staticmethod
    def overlap(windows: list, start: float, end: float) -> float:
        """Seconds of [start, end] covered by the collective windows ([start, end] lists)."""
        total = 0.0
        for ws, we in windows:
            if we > start and ws < end:
                total += (we if we < end else end) - (ws if ws > start else start)
        return total

    def collective_factor(self, busy: float) -> float:
        """Time factor of a collective whose idle-network time is `busy` (0..1) covered by compute."""
        if busy <= 0.0 or self.collective <= 0.0:
            return 1.0
        f = 1.0 + self.collective * min(busy, 1.0)
        return round(f / QUANTUM) * QUANTUM
