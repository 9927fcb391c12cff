"""torch.compile over a DistributedDataParallel model (as the Hugging Face Trainer's `torch_compile` does it):
Dynamo traces DDP's forward, which calls what is C++ in torch (`dist._broadcast_coalesced`, DDP's logger). Three
training steps of a small MLP; rank 0 prints "trained"."""
import os

import torch
import torch.distributed as dist

dist.init_process_group("nccl")
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.GELU(), torch.nn.Linear(256, 128)).cuda()
model.register_buffer("scale", torch.ones(128, device="cuda"))      # buffers are broadcast before each forward
ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[torch.cuda.current_device()])
compiled = torch.compile(ddp)
opt = torch.optim.AdamW(ddp.parameters(), lr=1e-4)
for _ in range(3):
    compiled(torch.randn(32, 128, device="cuda")).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
if dist.get_rank() == 0:
    print("trained", flush=True)
dist.destroy_process_group()
