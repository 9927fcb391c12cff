"""Which CUDA ops allocate memory beyond their outputs while they run: a survey of common training ops.

For each case, its inputs (and, for a backward, its forward) are made first; then the op runs alone between two
`torch.cuda.synchronize()` and the script prints, in MiB, the peak of allocated memory above what was allocated
before (`peak`) and what is still allocated after (`kept`: the outputs). `peak - kept` is what the op held
beyond its outputs: temporaries and workspaces taken from PyTorch's caching allocator. Runs the same on a GPU host
and under `phantora run` (one GPU), so that the two outputs can be compared line by line:

    python groundtruth/insitu/op_scratch.py
    phantora run --cluster h200-1gpu -- python groundtruth/insitu/op_scratch.py
"""

import gc

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

MiB = 2**20
CASES = []


def case(fn):
    CASES.append(fn)
    return fn


def grads(out, inputs, grad=None):
    """The backward of `out` with respect to `inputs`, as autograd runs it (the gradients are the outputs; the graph
    is kept, so that it can run twice, and so its saved tensors stay allocated throughout)."""
    g = grad if grad is not None else torch.ones_like(out)
    return lambda: torch.autograd.grad(out, inputs, g, retain_graph=True)


def leaf(*shape, dtype=torch.bfloat16):
    return torch.randn(*shape, device="cuda", dtype=dtype, requires_grad=True)


@case
def softmax():
    x = leaf(64, 1024, 1024)
    return {"forward": lambda: torch.softmax(x, -1), "backward": grads(torch.softmax(x, -1), [x])}


@case
def log_softmax():
    x = leaf(64, 1024, 1024)
    return {"forward": lambda: torch.log_softmax(x, -1), "backward": grads(torch.log_softmax(x, -1), [x])}


@case
def layer_norm():
    x, w, b = leaf(16384, 4096), leaf(4096), leaf(4096)
    return {"forward": lambda: F.layer_norm(x, (4096,), w, b),
            "backward": grads(F.layer_norm(x, (4096,), w, b), [x, w, b])}


@case
def rms_norm():
    x, w = leaf(16384, 4096), leaf(4096)
    return {"forward": lambda: F.rms_norm(x, (4096,), w), "backward": grads(F.rms_norm(x, (4096,), w), [x, w])}


@case
def cross_entropy():
    logits = leaf(8192, 32768)
    target = torch.randint(0, 32768, (8192,), device="cuda")
    return {"forward": lambda: F.cross_entropy(logits, target),
            "backward": grads(F.cross_entropy(logits, target), [logits])}


@case
def cross_entropy_fp32():
    logits = leaf(8192, 32768)
    target = torch.randint(0, 32768, (8192,), device="cuda")
    return {"forward": lambda: F.cross_entropy(logits.float(), target),
            "backward": grads(F.cross_entropy(logits.float(), target), [logits])}


@case
def silu_mul():
    a, b = leaf(16384, 8192), leaf(16384, 8192)
    return {"forward": lambda: F.silu(a) * b, "backward": grads(F.silu(a) * b, [a, b])}


@case
def gelu():
    x = leaf(16384, 8192)
    return {"forward": lambda: F.gelu(x, approximate="tanh"), "backward": grads(F.gelu(x, approximate="tanh"), [x])}


@case
def dropout():
    x = leaf(16384, 8192)
    return {"forward": lambda: F.dropout(x, 0.1), "backward": grads(F.dropout(x, 0.1), [x])}


@case
def embedding():
    table = leaf(128256, 2048)
    idx = torch.randint(0, 128256, (16384,), device="cuda")
    return {"forward": lambda: F.embedding(idx, table), "backward": grads(F.embedding(idx, table), [table])}


@case
def linear():
    x, w = leaf(16384, 4096), leaf(14336, 4096)
    return {"forward": lambda: F.linear(x, w), "backward": grads(F.linear(x, w), [x, w])}


@case
def linear_fp32():
    x, w = leaf(8192, 4096, dtype=torch.float32), leaf(4096, 4096, dtype=torch.float32)
    return {"forward": lambda: F.linear(x, w), "backward": grads(F.linear(x, w), [x, w])}


@case
def bmm():
    a, b = leaf(64, 2048, 128), leaf(64, 128, 2048)
    return {"forward": lambda: torch.bmm(a, b), "backward": grads(torch.bmm(a, b), [a, b])}


@case
def sdpa_causal():
    q, k, v = leaf(2, 32, 4096, 128), leaf(2, 32, 4096, 128), leaf(2, 32, 4096, 128)
    f = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
    return {"forward": f, "backward": grads(f(), [q, k, v])}


def sdpa_with(backend):
    def make():
        q, k, v = leaf(2, 32, 4096, 128), leaf(2, 32, 4096, 128), leaf(2, 32, 4096, 128)

        def f():
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out = f()

        def backward():
            with sdpa_kernel([backend]):
                return torch.autograd.grad(out, [q, k, v], torch.ones_like(out), retain_graph=True)
        return {"forward": f, "backward": backward}
    make.__name__ = f"sdpa_{backend.name.lower().replace('_attention', '')}"
    return case(make)


for _backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
    sdpa_with(_backend)


@case
def conv2d():
    x, w = leaf(32, 64, 56, 56), leaf(64, 64, 3, 3)
    return {"forward": lambda: F.conv2d(x, w, padding=1), "backward": grads(F.conv2d(x, w, padding=1), [x, w])}


@case
def batch_norm():
    x, w, b = leaf(32, 256, 56, 56), leaf(256, dtype=torch.float32), leaf(256, dtype=torch.float32)
    rm, rv = torch.zeros(256, device="cuda"), torch.ones(256, device="cuda")
    f = lambda: F.batch_norm(x, rm, rv, w, b, training=True)  # noqa: E731
    return {"forward": f, "backward": grads(f(), [x, w, b])}


@case
def sort_topk():
    x = torch.randn(16384, 64, device="cuda")
    return {"topk": lambda: torch.topk(x, 8, dim=-1), "sort": lambda: torch.sort(x, dim=-1),
            "argsort flat": lambda: torch.argsort(x.view(-1))}


@case
def reductions():
    x = torch.randn(1 << 28, device="cuda")
    xs = [torch.randn(1 << 22, device="cuda") for _ in range(16)]
    return {"sum": lambda: x.sum(), "norm": lambda: torch.linalg.vector_norm(x),
            "foreach_norm": lambda: torch._foreach_norm(xs), "cumsum": lambda: torch.cumsum(x, 0)}


@case
def adamw_step():
    ps = [torch.randn(1 << 24, device="cuda", requires_grad=True) for _ in range(4)]
    for p in ps:
        p.grad = torch.randn_like(p)
    out = {}
    for mode in ("foreach", "fused"):
        opt = torch.optim.AdamW(ps, lr=1e-4, **{mode: True})
        opt.step()                      # the state exists before the step measured
        out[mode] = opt.step
    return out


def measure(fn):
    gc.collect()                        # what an earlier case left in reference cycles is gone
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    result = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    kept = torch.cuda.memory_allocated() - base
    del result
    return peak, kept


def report(case_name, part, fn):
    """Measure `fn` (after a first run: lazily made state, cuBLAS handles, autotuning, is not counted) and print
    its line."""
    measure(fn)
    peak, kept = measure(fn)
    print(f"{case_name:>18} {part:<13} peak {peak / MiB:10.1f} MiB  kept {kept / MiB:10.1f} MiB  "
          f"beyond {(peak - kept) / MiB:8.1f} MiB", flush=True)


def main():
    torch.manual_seed(0)
    for make in CASES:
        parts = make()
        for name, fn in parts.items():
            report(make.__name__, name, fn)
        del parts
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
