"""Temporary tensors that CUDA kernels allocate through PyTorch's caching allocator while they run.

Some aten ops' CUDA implementations allocate a tensor of their own beside their outputs and free it before they
return. The fake (meta) kernels do not, so without this the simulated peak of allocated memory misses it wherever
such an op runs at the peak. What is listed here was measured (`torch.cuda.max_memory_allocated` around the op and
the allocator's history; groundtruth/insitu/softmax_chain.py, groundtruth/insitu/README.md):

- `_softmax_backward_data`: the CUDA softmax backward computes `grad_output * output` into a new tensor first
  (ATen's `softmax_backward_cuda_out`), then the backward kernel: one more tensor of `grad_output`'s size, for
  every softmax dimension and dtype measured (fp32, bf16, fp16; last dimension 64 to 16,384). `log_softmax`'s
  backward allocates none. In an unfused attention (Megatron-core's local spec) it is one more scores-sized fp32
  tensor at the peak of a step.

`nbytes(name, args, kwargs)` gives the bytes an op allocates so (0 for an op that allocates none); the interceptor
allocates a block of that size after the op's outputs and frees it once the kernel is issued, as the GPU's caching
allocator sees it.
"""

from __future__ import annotations

from typing import Any, Callable

import torch


def _softmax_backward(args: tuple, kwargs: dict) -> int:
    """_softmax_backward_data(grad_output, output, dim, input_dtype): grad_output * output."""
    grad = args[0] if args else kwargs.get("grad_output")
    out = args[1] if len(args) > 1 else kwargs.get("output")
    if not isinstance(grad, torch.Tensor) or not isinstance(out, torch.Tensor):
        return 0
    dtype = torch.result_type(grad, out)
    shape = torch.broadcast_shapes(grad.shape, out.shape)
    return shape.numel() * dtype.itemsize


SCRATCH: dict[str, Callable[[tuple, dict], int]] = {
    "_softmax_backward_data": _softmax_backward,
}
"""aten op (overload packet name) -> the bytes of the temporary tensor its CUDA kernel allocates."""


def nbytes(name: str, args: Any, kwargs: dict) -> int:
    rule = SCRATCH.get(name)
    return rule(tuple(args), kwargs or {}) if rule is not None else 0
