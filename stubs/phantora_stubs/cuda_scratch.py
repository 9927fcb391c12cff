"""Temporary tensors that CUDA kernels allocate through PyTorch's caching allocator while they run.

Some aten ops' CUDA implementations allocate a tensor of their own beside their outputs and free it before they
return. The fake (meta) kernels do not, so without this the simulated peak of allocated memory misses it wherever
such an op runs at the peak. What is listed here was measured (`torch.cuda.max_memory_allocated` around the op and
the allocator's history; groundtruth/insitu/softmax_chain.py and op_scratch.py, groundtruth/insitu/README.md):

- `_softmax_backward_data`: the CUDA softmax backward computes `grad_output * output` into a new tensor first
  (ATen's `softmax_backward_cuda_out`), then the backward kernel: one more tensor of `grad_output`'s size, for
  every softmax dimension and dtype measured (fp32, bf16, fp16; last dimension 64 to 16,384). `log_softmax`'s
  backward allocates none. In an unfused attention (Megatron-core's local spec) it is one more scores-sized fp32
  tensor at the peak of a step.
- the SDPA backward kernels (flash, cuDNN, memory-efficient): fp32 accumulators of the query's size and softmax
  statistics, 257, 130 and 129 MiB for batch 2, 32 heads, seq 4096, head_dim 128, proportional to the query over
  seven shapes (groundtruth/insitu/sdpa_scratch.py); with grouped-query attention flash and cuDNN also hold dk and
  dv expanded to the query's heads, in the inputs' dtype (cuDNN 258 MiB against 130 without them for Llama 3 8B's
  32 query and 8 key heads at seq 8192).
- `embedding_dense_backward`: the sort-and-segment path's tables and fp32 partial sums (141.6 MiB for 16,384
  indices into a 2,048-wide table).

Measured but not modelled (groundtruth/insitu/op_scratch.py on an H200, `h200-scratch/`): cuDNN's convolution
workspace (25-26 MiB for a 3x3 convolution of 32 x 64 x 56 x 56, which depends on the algorithm cuDNN picks),
cuDNN BatchNorm's reserve space (1 MiB there), CUB's radix-sort and scan temporaries (20 MiB for an argsort of 2^20
floats, 1.1 MiB for a cumsum of 2^28).

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


def _attention_backward(q_fp32_copies: int, stats: int, flash: bool = False,
                        blocks: tuple[int, int] = (1, 1)) -> Callable[[tuple, dict], int]:
    """An SDPA backward kernel (query, key = args 1, 2; tensors batch x heads x seq x head_dim) whose workspace is
    `q_fp32_copies` fp32 tensors of the query's size (dq accumulators) and `stats` fp32 vectors of batch x heads x
    seq_q (softmax sums); FlashAttention-2 rounds seq_q up to 128 and head_dim up to 32, the memory-efficient kernel
    its dq accumulator's seq_q and head_dim up to its `blocks` (64, 64: seq 1000 x head_dim 96 holds 1024 x 128).
    Where the key has fewer heads than the query (GQA; flash and cuDNN) the kernel also holds dk and dv expanded to
    the query's heads. Measured on an H200 (bf16, causal) at batch 2, 32 heads, seq 4096, head_dim 128 (flash 257
    MiB, cuDNN 130, memory-efficient 129) and over seven shapes with and without GQA
    (groundtruth/insitu/sdpa_scratch.py)."""
    def rule(args: tuple, kwargs: dict) -> int:
        q, k = args[1], args[2]
        b, h, sq, d = q.shape
        stat_rows = sq
        if flash:
            sq = -(-sq // 128) * 128
            d = -(-d // 32) * 32 if d <= 192 else 256
            stat_rows = sq
        sq, d = -(-sq // blocks[0]) * blocks[0], -(-d // blocks[1]) * blocks[1]
        total = (q_fp32_copies * b * sq * h * d + stats * b * h * stat_rows) * 4
        if k.shape[1] != h:
            total += 2 * b * k.shape[2] * h * q.shape[3] * q.element_size()
        return total
    return rule


_NROWS_PER_THREAD = 10        # ATen's EmbeddingBackwardKernel.cu


def _embedding_backward(args: tuple, kwargs: dict) -> int:
    """embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq): beyond 3,072
    indices (or with scale_grad_by_freq) CUDA sorts the indices and sums the gradient rows per segment: the sorted
    and original indices, segment tables (int64) and the per-segment partial sums in fp32 (the accumulation type),
    (indices / 10 + segments) rows of the embedding's width."""
    grad, indices, num_weights = args[0], args[1], int(args[2])
    by_freq = bool(args[4]) if len(args) > 4 else bool(kwargs.get("scale_grad_by_freq", False))
    n = indices.numel()
    if n <= 3072 and not by_freq:
        return 0
    width = grad.shape[-1]
    segments = min(n, num_weights)
    partial = n // _NROWS_PER_THREAD + segments
    acc = 8 if grad.dtype == torch.float64 else 4
    return partial * width * acc + 8 * (n + 2 * segments + partial) + 16 * n


SCRATCH: dict[str, Callable[[tuple, dict], int]] = {
    "_softmax_backward_data": _softmax_backward,
    "_scaled_dot_product_flash_attention_backward": _attention_backward(2, 1, flash=True),
    "_scaled_dot_product_cudnn_attention_backward": _attention_backward(1, 2),
    "_scaled_dot_product_efficient_attention_backward": _attention_backward(1, 1, blocks=(64, 64)),
    "embedding_dense_backward": _embedding_backward,
}
"""aten op (overload packet name) -> the bytes of the temporary tensor its CUDA kernel allocates."""


def nbytes(name: str, args: Any, kwargs: dict) -> int:
    rule = SCRATCH.get(name)
    return rule(tuple(args), kwargs or {}) if rule is not None else 0
