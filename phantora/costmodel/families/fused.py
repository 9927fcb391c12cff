"""Kernels that Inductor generated for a compiled region (`torch.compile`): one fused Triton kernel per signature.

The signature carries what Inductor's scheduler knew of the kernel (stubs/phantora_stubs/compiled.py): `kind`
(`inductor.pointwise` or `inductor.reduction`), the kernel's descriptive name (the aten ops it fuses), its element
counts (`numel`, and `rnumel` for the reduced dimension) and the DRAM bytes Inductor counts for it
(`get_read_write_buffers_sizes`: each buffer read or written once). FLOPs are one per element of each fused op, on
CUDA cores: these kernels are memory-bound and their FLOPs only matter to the roofline when they are not.
"""

from __future__ import annotations

from ..signature import Signature
from .common import Work, _packet


def _fused(sig: Signature, family: str) -> Work:
    _, kind, _ = _packet(sig.op)
    return Work(family=family, flops=float(sig.scalar("flops") or 0), nbytes=float(sig.scalar("bytes") or 0),
                dtype="fp32", op=kind)
