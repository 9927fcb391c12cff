"""An asynchronous all-reduce beside GEMMs, three ways: waited at the end, its future asked for first, or made
synchronous; prints the three times (time.perf_counter after a synchronize) as one JSON line on rank 0."""
import json
import time

import torch
import torch.distributed as dist

dist.init_process_group("nccl")
rank = dist.get_rank()
torch.cuda.set_device(rank)
grad = torch.randn(256 * 2**20, device="cuda")             # 1 GiB of fp32 gradients
x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
dist.all_reduce(grad)
out = {}
for mode in ("sync", "async", "future"):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    work = dist.all_reduce(grad, async_op=mode != "sync")
    future = work.get_future() if mode == "future" else None
    for _ in range(20):
        x @ x
    if future is not None:
        future.wait()
    elif work is not None:
        work.wait()
    torch.cuda.synchronize()
    out[mode] = time.perf_counter() - t0
if rank == 0:
    print("RESULT " + json.dumps(out), flush=True)
dist.destroy_process_group()
