"""For tests/test_compile.py: a compiled function whose GEMM's result goes straight into an all-reduce (the pattern
of a tensor-parallel row-wise linear layer), through the process group (argv[1] "c10d") or as a functional
collective ("functional"), called twice on 2 ranks."""
import sys

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

kind = sys.argv[1]
dist.init_process_group("nccl")
torch.cuda.set_device(dist.get_rank())
w = torch.randn(1024, 2048, device="cuda", dtype=torch.bfloat16)


def f(x):
    y = x @ w
    if kind == "functional":
        return torch.relu(funcol.all_reduce(y, "sum", dist.group.WORLD))
    dist.all_reduce(y)
    return torch.relu(y)


f = torch.compile(f)
x = torch.randn(4096, 1024, device="cuda", dtype=torch.bfloat16)
for _ in range(2):
    f(x)
    torch.cuda.synchronize()
dist.destroy_process_group()
