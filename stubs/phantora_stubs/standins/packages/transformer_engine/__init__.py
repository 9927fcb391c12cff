"""Transformer Engine as a simulated rank imports it (`phantora run --transformer-engine VERSION`).

TE's kernels are CUDA code that a rank can neither load nor run on tensors that hold no data. This package has TE's
Python API (the part Megatron-core and other frameworks call) and issues, in place of each TE kernel, the torch ops
that read and write the same tensors, so the cost model costs them like the kernels TE launches (docs/megatron.md,
"Transformer Engine"):

- `pytorch.Linear`, `pytorch.LayerNormLinear`: cuBLAS GEMMs (dgrad, wgrad; the wgrad accumulated into `main_grad`
  when fused), the fused RMSNorm / LayerNorm kernels, and TE's tensor-parallel collectives (sequence-parallel
  all-gather and reduce-scatter, all-reduce), with TE's choice of what backward keeps and re-gathers;
- `pytorch.LayerNorm`, `pytorch.RMSNorm`: the fused norm kernels;
- `pytorch.DotProductAttention`: cuDNN fused attention (flash attention where cuDNN's constraints fail);
- `pytorch.optimizers`: FusedAdam, FusedSGD and the multi-tensor helpers (standins/kernels.py).

FP8 (`fp8_autocast(enabled=True)`), context parallelism inside attention, the grouped GEMM of MoE and TE's
communication-overlap user buffers are not modelled: they raise an error naming the feature.
"""

import os as _os

__version__ = _os.environ.get("PHANTORA_TRANSFORMER_ENGINE") or "2.9.0"
__phantora_stub__ = True

from . import common, pytorch  # noqa: E402,F401
