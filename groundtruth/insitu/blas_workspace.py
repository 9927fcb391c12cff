"""What cuBLAS / cuBLASLt take from PyTorch's caching allocator for their workspaces, and when.

PyTorch allocates a GEMM library's workspace through its caching allocator the first time a GEMM runs on a
(handle, stream) pair and keeps it: it shows in `torch.cuda.memory_allocated()` from then on. The script runs GEMMs
of several kinds on the default stream, then on side streams and in another thread, and prints after each the
allocated memory beyond the GEMMs' own tensors (in MiB, to 1/1024). Runs the same on a GPU host and under
`phantora run` (one GPU):

    python groundtruth/insitu/blas_workspace.py
    phantora run --cluster h200-1gpu -- python groundtruth/insitu/blas_workspace.py
"""

import os
import threading

import torch
import torch.nn.functional as F

MiB = 2**20


def main():
    print(f"CUBLAS_WORKSPACE_CONFIG={os.environ.get('CUBLAS_WORKSPACE_CONFIG', '')!r} "
          f"CUBLASLT_WORKSPACE_SIZE={os.environ.get('CUBLASLT_WORKSPACE_SIZE', '')!r}")
    a = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(1024, device="cuda", dtype=torch.bfloat16)
    af, bf = a.float(), b.float()
    w = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    x = torch.randn(8, 1024, 1024, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    kept = []

    def stage(name, fn):
        out = fn()
        torch.cuda.synchronize()
        kept.append(out)              # the GEMMs' outputs stay: only what the libraries took is reported
        held = torch.cuda.memory_allocated() - base - sum(t.untyped_storage().nbytes() for t in _tensors(kept))
        print(f"{name:<28} beyond the tensors {held / MiB:9.3f} MiB", flush=True)

    stage("bf16 mm", lambda: a @ b)
    stage("bf16 mm again", lambda: a @ b)
    stage("fp32 mm", lambda: af @ bf)
    stage("bf16 addmm (linear, bias)", lambda: F.linear(a, b, bias))
    stage("bf16 bmm", lambda: torch.bmm(x, x))
    stage("linear backward", lambda: torch.autograd.grad(F.linear(a, w).sum(), [w])[0])
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        stage("bf16 mm, side stream 1", lambda: a @ b)
        stage("addmm, side stream 1", lambda: F.linear(a, b, bias))
    side2 = torch.cuda.Stream()
    with torch.cuda.stream(side2):
        stage("bf16 mm, side stream 2", lambda: a @ b)
    out = {}

    def other_thread():
        out["c"] = a @ b
        torch.cuda.synchronize()
    thread = threading.Thread(target=other_thread)
    thread.start()
    thread.join()
    stage("bf16 mm, another thread", lambda: out["c"])


def _tensors(items):
    for item in items:
        if isinstance(item, torch.Tensor):
            yield item
        elif isinstance(item, (list, tuple)):
            yield from _tensors(item)


if __name__ == "__main__":
    main()
