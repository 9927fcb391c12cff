"""Allocates SIZE_MIB on the device before and after the process group's first collective (tests/test_devmem.py).

Prints `RESULT {"before": ok, "after": ok, "free_after": bytes}`; ok is False where torch.OutOfMemoryError was raised.
"""
import json
import os
import sys

import torch
import torch.distributed as dist

size = int(float(sys.argv[1]) * 2 ** 20)
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group("nccl")


def try_alloc() -> bool:
    try:
        x = torch.empty(size, dtype=torch.uint8, device="cuda")
        del x
        torch.cuda.empty_cache()
        return True
    except torch.OutOfMemoryError:
        return False


before = try_alloc()
t = torch.ones(4, device="cuda")
dist.all_reduce(t)
torch.cuda.synchronize()
after = try_alloc()
free_after = torch.cuda.mem_get_info()[0]
if dist.get_rank() == 0:
    print("RESULT " + json.dumps({"before": before, "after": after, "free_after": free_after}), flush=True)
dist.destroy_process_group()
