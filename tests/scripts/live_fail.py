"""Failing programs for tests/test_live_run.py: --mode raise | raise-slow (rank 1's process takes 6 s more to end
after its program has left, as on a loaded machine) | mismatch | hang | exit | recv (rank 0 receives a small tensor
that rank 1, in a barrier, never sends: a deadlock)."""
import argparse
import os
import sys

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--mode", required=True)
args = p.parse_args()
dist.init_process_group("nccl")
rank = dist.get_rank()
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
x = torch.ones(1024 * (1 + rank if args.mode == "mismatch" else 1), device="cuda")
dist.all_reduce(x)
if rank == 1 and args.mode == "raise-slow":
    class _SlowExit:
        def __del__(self):          # at the interpreter's shutdown, after the stubs have said goodbye
            t0 = os.times().elapsed
            while os.times().elapsed - t0 < 6.0:
                pass
    _slow = _SlowExit()
if rank == 1 and args.mode in ("raise", "raise-slow"):
    raise ValueError("deliberate failure on rank 1")
if rank == 1 and args.mode == "exit":
    os._exit(0)
if rank == 1 and args.mode == "hang":
    while True:
        sum(range(10000))
if args.mode == "recv":
    if rank == 0:
        small = torch.empty(4, device="cuda")
        dist.recv(small, src=1)
        print(small)
    else:
        dist.barrier()
dist.all_reduce(x)
torch.cuda.synchronize()
sys.exit(0)
