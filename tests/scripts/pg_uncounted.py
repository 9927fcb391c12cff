"""The same all-reduce loop twice (2 ranks): on a small tensor whose value is known (the stubs exchange it) and on a
large one (nothing to exchange). The framework's work is the same; tests/test_hostcpu.py compares what was counted."""

import os

import torch
import torch.distributed as dist

torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group("nccl")
small = torch.ones(4, device="cuda")
large = torch.empty(1 << 20, device="cuda")


def loop(t):
    for _ in range(20):
        dist.all_reduce(t)


torch.cuda.synchronize()
loop(small)
torch.cuda.synchronize()
loop(large)
torch.cuda.synchronize()
dist.destroy_process_group()
