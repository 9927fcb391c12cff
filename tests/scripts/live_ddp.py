"""Data parallelism for tests/test_live_run.py and tests/test_ddp_live.py: a stack of square bf16 linear layers,
gradients all-reduced after backward by hand (or, with --ddp, by torch's DistributedDataParallel), SGD; prints the
step times the script itself measures (time.perf_counter after a synchronize), as one JSON line on rank 0."""
import argparse
import json
import os
import time

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--dim", type=int, default=2048)
p.add_argument("--layers", type=int, default=2)
p.add_argument("--batch", type=int, default=4096)
p.add_argument("--steps", type=int, default=4)
p.add_argument("--ddp", action="store_true", help="wrap the model in DistributedDataParallel")
p.add_argument("--find-unused", action="store_true", help="with --ddp: find_unused_parameters=True")
p.add_argument("--static-graph", action="store_true", help="with --ddp: static_graph=True")
args = p.parse_args()

dist.init_process_group("nccl")
rank = dist.get_rank()
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
model = torch.nn.Sequential(*[torch.nn.Linear(args.dim, args.dim, bias=False) for _ in range(args.layers)])
model = model.to(device="cuda", dtype=torch.bfloat16)
if args.ddp:
    from torch.nn.parallel import DistributedDataParallel
    model = DistributedDataParallel(model, find_unused_parameters=args.find_unused, static_graph=args.static_graph)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(args.batch, args.dim, device="cuda", dtype=torch.bfloat16)
times = []
for step in range(args.steps):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    model(x).float().pow(2).mean().backward()
    if not args.ddp:
        for prm in model.parameters():
            dist.all_reduce(prm.grad)
    opt.step()
    opt.zero_grad()
    torch.cuda.synchronize()
    times.append(time.perf_counter() - t0)
if rank == 0:
    print("RESULT " + json.dumps({"step_times": times}), flush=True)
dist.destroy_process_group()
