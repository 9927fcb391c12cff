"""For tests/test_compile.py: a compiled function with nothing to compute (Megatron's `@jit_fuser` on a router's
optional bias, switched off), then one with an op. Prints the host time each first call took, JSON."""
import json
import time

import torch


@torch.compile
def nothing(x, flag: bool = False):
    if flag:
        return x + 1
    return x


@torch.compile
def something(x):
    return torch.relu(x) * 2


x = torch.randn(1024, device="cuda")
t0 = time.perf_counter()
nothing(x)
torch.cuda.synchronize()
t1 = time.perf_counter()
something(x)
torch.cuda.synchronize()
t2 = time.perf_counter()
print(json.dumps({"empty_s": t1 - t0, "graph_s": t2 - t1}))
