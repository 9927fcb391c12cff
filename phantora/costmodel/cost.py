"""The cost of one kernel on one GPU model: what every cost source returns."""

from __future__ import annotations

from dataclasses import dataclass

from ..engine.ops import CostSource


@dataclass(frozen=True, slots=True)
class Cost:
    duration_s: float          # GPU time of the kernel(s) of one op, seconds
    flops: float               # floating-point operations (multiply and add count as 2)
    nbytes: float              # DRAM bytes of an ideal kernel (each input read once, each output written once)
    family: str                # op family (phantora.costmodel.families)
    source: CostSource         # where the duration came from
    is_view: bool = False      # no kernel is launched (views, metadata, allocation-only ops)
    detail: str = ""           # e.g. "interpolated" when a profile was interpolated rather than matched exactly

    @property
    def duration_us(self) -> float:
        return self.duration_s * 1e6
