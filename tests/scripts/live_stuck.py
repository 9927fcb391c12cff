"""Programs for tests/test_faults_run.py: --mode wait (prints READY with its pid, then waits for real, silent: to be
stopped by a signal) | deadlock (both ranks receive from each other)."""
import argparse
import os
import threading

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--mode", required=True)
args = p.parse_args()
dist.init_process_group("nccl")
rank = dist.get_rank()
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
x = torch.ones(1024, device="cuda")
dist.all_reduce(x)
torch.cuda.synchronize()
if args.mode == "wait":
    print(f"READY {os.getpid()}", flush=True)
    threading.Event().wait()
if args.mode == "deadlock":
    dist.recv(x, src=1 - rank)
    torch.cuda.synchronize()
