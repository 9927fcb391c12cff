"""For tests/test_live_run.py: DDP over a model with a layer the forward pass never uses, with
find_unused_parameters as argv[1] says ("1" or "0"). Prints the gradient bytes of the model; on a GPU the first
trains (every bucket reduced each step), the second raises at its second step."""
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("nccl")
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.unused = nn.Linear(1024, 1024), nn.Linear(1024, 1024), nn.Linear(1024, 1024)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


model = Net().cuda()
print("GRAD_BYTES", sum(p.numel() * p.element_size() for p in model.parameters()), flush=True)
ddp = DDP(model, find_unused_parameters=sys.argv[1] == "1")
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
for step in range(3):
    ddp(torch.randn(8, 1024, device="cuda")).sum().backward()
    opt.step()
    opt.zero_grad()
print("TRAINED", flush=True)
