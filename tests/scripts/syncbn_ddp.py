"""A small conv + SyncBatchNorm network (nn.SyncBatchNorm.convert_sync_batchnorm of BatchNorm2d layers) trained with
DistributedDataParallel, for tests/test_syncbn.py: steps in train mode (forward, backward, SGD), then forward passes
in eval mode. Rank 0 prints, as one JSON line, the number of SyncBatchNorm layers, the shapes and dtypes of the
outputs, of the first SyncBatchNorm's gradients and running mean, the sum of its running variance and its
num_batches_tracked."""
import argparse
import json
import os

import torch
import torch.distributed as dist
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=3)
p.add_argument("--eval-steps", type=int, default=2)
p.add_argument("--batch", type=int, default=16)
p.add_argument("--size", type=int, default=32)
p.add_argument("--channels", type=int, default=64)
p.add_argument("--dtype", default="float32")
args = p.parse_args()
dtype = getattr(torch, args.dtype)

dist.init_process_group("nccl")
rank = dist.get_rank()
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
c = args.channels
model = nn.Sequential(
    nn.Conv2d(3, c, 3, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU(),
    nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU(),
    nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, 10))
model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
layers = sum(isinstance(m, nn.SyncBatchNorm) for m in model.modules())
model = model.to(device="cuda", dtype=dtype)
model = nn.parallel.DistributedDataParallel(model, device_ids=[torch.cuda.current_device()])
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
x = torch.randn(args.batch, 3, args.size, args.size, device="cuda", dtype=dtype)
y = torch.randint(0, 10, (args.batch,), device="cuda")
bn = next(m for m in model.modules() if isinstance(m, nn.SyncBatchNorm))
model.train()
for _ in range(args.steps):
    out = model(x)
    loss = nn.functional.cross_entropy(out.float(), y)
    loss.backward()
    grads = {"weight": [list(bn.weight.grad.shape), str(bn.weight.grad.dtype)],
             "bias": [list(bn.bias.grad.shape), str(bn.bias.grad.dtype)]}
    opt.step()
    opt.zero_grad()
torch.cuda.synchronize()
model.eval()
with torch.no_grad():
    for _ in range(args.eval_steps):
        out_eval = model(x)
torch.cuda.synchronize()
if rank == 0:
    print("RESULT " + json.dumps({
        "layers": layers, "steps": args.steps, "out": [list(out.shape), str(out.dtype)],
        "out_eval": [list(out_eval.shape), str(out_eval.dtype)], "grads": grads,
        "running_mean": [list(bn.running_mean.shape), str(bn.running_mean.dtype)],
        "running_var_sum": float(bn.running_var.float().sum()),
        "tracked": int(bn.num_batches_tracked.item())}), flush=True)
dist.destroy_process_group()
