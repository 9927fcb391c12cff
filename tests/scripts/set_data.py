"""`t.data = new` on fake tensors: a CPU parameter given a CUDA tensor's data (FSDP2's `_move_states_to_device`,
accelerate, DeepSpeed), a known value replaced, and FSDP2 over a model built on the CPU (fully_shard moves it) for
two training steps. Prints one JSON line."""
import json
import os

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

dist.init_process_group("nccl")
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
lin = torch.nn.Linear(64, 64)
lin.weight.data = lin.weight.to("cuda", torch.bfloat16)
t = torch.tensor([1.0, 2.0])
t.data = torch.tensor([5.0, 6.0, 7.0], device="cuda")
u = torch.tensor([3.0])
u.data = torch.randn(1000, device="cuda")[:2]         # no known value (random, too large): the old one is forgotten
model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(3)])   # on the CPU
for layer in model:
    fully_shard(layer)
fully_shard(model)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
for _ in range(2):
    model(torch.randn(8, 256, device="cuda")).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
if dist.get_rank() == 0:
    print(json.dumps({"param": [str(lin.weight.device), str(lin.weight.dtype), lin.weight.is_leaf],
                      "value": [t.tolist(), str(t.device)], "forgotten": u.tolist(),
                      "sharded": sorted({str(p.device) for p in model.parameters()})}), flush=True)
dist.destroy_process_group()
