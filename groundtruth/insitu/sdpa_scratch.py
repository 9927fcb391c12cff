"""What SDPA's backward holds beyond its outputs, over shapes: batch, heads, key/value heads (GQA), sequence, head dim.

groundtruth/insitu/op_scratch.py measured the SDPA backward kernels' temporaries at one shape (batch 2, 32 heads,
seq 4096, head_dim 128); the stubs scale them with the query's size (stubs/phantora_stubs/cuda_scratch.py). This
sweep checks that rule: for each shape and backend (the default, then each fused backend forced), the backward of
a causal bf16 attention runs alone and the script prints, as op_scratch.py does, its peak of allocated memory above
what was allocated before, what it keeps (the gradients) and the difference. Runs the same on a GPU host and under
`phantora run` (one GPU):

    python groundtruth/insitu/sdpa_scratch.py
    phantora run --cluster h200-1gpu -- python groundtruth/insitu/sdpa_scratch.py
"""

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from op_scratch import report

SHAPES = [  # batch, heads, kv heads, seq, head dim
    (2, 32, 32, 4096, 128),
    (1, 32, 8, 8192, 128),      # Llama 3 8B's GQA
    (4, 24, 8, 2048, 128),      # Llama 3.2 3B
    (2, 32, 8, 4096, 64),       # Llama 3.2 1B's head dim
    (8, 16, 16, 1024, 64),
    (1, 64, 8, 4096, 128),      # a 70B layer's heads on one GPU
    (2, 16, 16, 1000, 96),      # odd sequence, head dim 96
]
BACKENDS = {"default": None, "cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION}


def case(shape, backend):
    b, h, kv, s, d = shape
    gqa = kv != h
    if backend == "efficient" and gqa:
        return None                                   # memory-efficient attention takes no GQA
    q = torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(b, kv, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(b, kv, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    chosen = [BACKENDS[backend]] if BACKENDS[backend] is not None else None

    def attend():
        if chosen is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        with sdpa_kernel(chosen):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    out = attend()
    grad = torch.ones_like(out)

    def backward():
        if chosen is None:
            return torch.autograd.grad(out, [q, k, v], grad, retain_graph=True)
        with sdpa_kernel(chosen):
            return torch.autograd.grad(out, [q, k, v], grad, retain_graph=True)
    return backward


def main():
    torch.manual_seed(0)
    for shape in SHAPES:
        for backend in BACKENDS:
            fn = case(shape, backend)
            if fn is None:
                continue
            report("x".join(str(n) for n in shape), backend, fn)
            del fn
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
