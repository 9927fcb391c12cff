"""A functional all-reduce, then GEMMs that do not use its result, then the result: on a GPU the result is an
AsyncCollectiveTensor waited for at its first use, so the GEMMs overlap the all-reduce. Prints, as one JSON line,
the all-reduce alone, the GEMMs alone and the two together (perf_counter around synchronized regions), the result's
type and its value after `.wait()`."""
import json
import os
import time

import torch
import torch.distributed as dist
from torch.distributed import _functional_collectives as funcol

dist.init_process_group("nccl")
rank = dist.get_rank()
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
group = dist.group.WORLD
big = torch.randn(512 << 20, device="cuda", dtype=torch.bfloat16)      # 1 GiB
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)


def timed(fn):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def reduce_only():
    funcol.all_reduce(big, "sum", group).add_(1)


def gemms_only():
    for _ in range(3):
        torch.mm(a, a)


def both():
    y = funcol.all_reduce(big, "sum", group)
    gemms_only()
    y.add_(1)


for fn in (reduce_only, gemms_only, both):      # once to warm up
    timed(fn)
t = {fn.__name__: timed(fn) for fn in (reduce_only, gemms_only, both)}
small = funcol.all_reduce(torch.ones(2, device="cuda"), "sum", group)
print("RESULT " + json.dumps({"rank": rank, "times": t, "type": type(small).__name__,
                              "value": small.wait().tolist()}), flush=True)
dist.destroy_process_group()
