"""For tests/test_live_run.py: DDP over a model with a layer the forward pass never uses (and, with argv[2] "half",
one only rank 0 uses, `part`), with find_unused_parameters as argv[1] says ("1" or "0"). Prints the gradient bytes of the
model; on a GPU the first trains (every bucket reduced each step), the second raises at its second step. After
training prints which layers' weights hold a gradient: the Reducer leaves the gradient of a parameter no rank used
as it was (None), and gives one any rank used its reduced gradient on every rank."""
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

HALF = sys.argv[2:3] == ["half"]
RAISE = sys.argv[2:3] == ["raise"]          # then a backward pass that raises, caught: it finalizes nothing


class _Fails(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        raise RuntimeError("deliberate failure in the backward pass")
dist.init_process_group("nccl")
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.unused = nn.Linear(1024, 1024), nn.Linear(1024, 1024), nn.Linear(1024, 1024)
        self.part = nn.Linear(1024, 1024)

    def forward(self, x):
        y = self.b(torch.relu(self.a(x)))
        if HALF and dist.get_rank() == 0:
            y = y + self.part(x)
        return y


model = Net().cuda()
print("GRAD_BYTES", sum(p.numel() * p.element_size() for p in model.parameters()), flush=True)
ddp = DDP(model, find_unused_parameters=sys.argv[1] == "1")
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
for step in range(3):
    ddp(torch.randn(8, 1024, device="cuda")).sum().backward()
    if step < 2:
        opt.step()
        opt.zero_grad()
if RAISE:
    try:
        _Fails.apply(ddp(torch.randn(8, 1024, device="cuda"))).sum().backward()
    except RuntimeError:
        pass
print("TRAINED", flush=True)
print("RESULT " + json.dumps({"rank": dist.get_rank(), "params": len(list(model.parameters())),
                              "grad": {n: m.weight.grad is not None for n, m in model.named_children()}}), flush=True)
