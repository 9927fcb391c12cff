"""Op families and the work of one kernel (FLOPs, DRAM bytes), computed from a `Signature` alone.

Nothing here touches tensors: replay re-costs a trace from its signature table. A Signature holds inputs only, so the
output of every op is inferred per family from its inputs (shapes, dtypes and the kept scalars); docs/cost-model.md
lists the rules. Bytes are the DRAM traffic of an ideal kernel: each input read once, each output written once.
An input broadcast with stride 0 along some dims is counted by the elements it really stores ("touched" elements).

This module is the package's face: `work(sig)` hands a signature to its family's counter, and the public names of
the modules below are re-exported here.
- `common`: family names, `Work`, dtype sizes, shape and byte helpers, the generic fallback rule;
- `classification`: op name -> family (`classify`);
- `gemm`: matmul and convolution; `attention`: fused attention; `pointwise`: elementwise ops and reductions;
  `norm`: norms and softmax; `fused`: Inductor's generated kernels (torch.compile); `fastpath`: the fused inference
  fast paths of nn.TransformerEncoderLayer and nn.MultiheadAttention; `indexing`: index / gather / scatter, embedding, nll_loss; `optimizer`: `_foreach_*`
  and fused optimizers; `movement`: views, allocations, copies, concatenation.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from ..signature import Signature
from .attention import BACKWARD_FLOP_RATIO, CAUSAL_FRACTION, MASK_OVERHEAD_KEYS, _attention, attention_fraction
from .classification import classify
from .common import (ALLOC, ATTN_BWD, ATTN_FWD, CAT, COLLECTIVE, CONV, COPY, ELEMENTWISE, EMBEDDING, FAMILIES,
                     INDEX, ITEMSIZE, LOSS, MATMUL, NO_KERNEL, NORM, OPTIMIZER, OTHER, REDUCTION, SOFTMAX,
                     TENSOR_CORE_FAMILIES, VIEW, Work, _other, _packet, broadcast, is_contiguous, itemsize, numel,
                     peak_key, touched)
from .fastpath import FAST_PATHS, _fast_path
from .fused import _fused
from .gemm import _conv, _matmul
from .indexing import _embedding, _index, _loss
from .movement import _cat, _copy, _no_kernel, _view
from .norm import _norm, _softmax
from .optimizer import _optimizer
from .pointwise import _elementwise, _reduction

__all__ = [
    "ALLOC", "ATTN_BWD", "ATTN_FWD", "BACKWARD_FLOP_RATIO", "CAT", "CAUSAL_FRACTION", "COLLECTIVE", "CONV", "COPY",
    "ELEMENTWISE", "EMBEDDING", "FAMILIES", "INDEX", "ITEMSIZE", "LOSS", "MASK_OVERHEAD_KEYS", "MATMUL", "NO_KERNEL",
    "NORM", "OPTIMIZER", "OTHER", "REDUCTION", "SOFTMAX", "TENSOR_CORE_FAMILIES", "VIEW", "Work",
    "attention_fraction", "broadcast", "classify", "is_contiguous", "itemsize", "numel", "peak_key", "touched", "work",
]


# ---- work per family ----------------------------------------------------------------------------------------------

def work(sig: Signature) -> Work:
    """FLOPs, bytes, arithmetic dtype and launch count of one kernel with this signature."""
    family = classify(sig.op)
    if sig.op.startswith("inductor."):
        fn = _fused
    elif _packet(sig.op)[1] in FAST_PATHS:
        fn = _fast_path
    else:
        fn = _COUNTERS.get(family, _other)
    try:
        w = fn(sig, family)
    except (IndexError, TypeError, ValueError, ZeroDivisionError):
        # A signature the family's rule cannot read (unexpected arity): cost it with the generic rule.
        w = _other(sig, OTHER)
    return replace(w, op=_packet(sig.op)[1])


_COUNTERS: dict[str, Callable[[Signature, str], Work]] = {
    VIEW: _view, ALLOC: _no_kernel, COLLECTIVE: _no_kernel, MATMUL: _matmul, CONV: _conv, ATTN_FWD: _attention,
    ATTN_BWD: _attention, ELEMENTWISE: _elementwise, REDUCTION: _reduction, NORM: _norm, SOFTMAX: _softmax,
    EMBEDDING: _embedding, LOSS: _loss, OPTIMIZER: _optimizer, COPY: _copy, INDEX: _index, CAT: _cat,
    OTHER: _other,
}
