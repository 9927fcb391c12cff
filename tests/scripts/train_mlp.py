"""A plain PyTorch training script: an MLP on CUDA, forward + backward + AdamW, timed with perf_counter.

Usage: train_mlp.py BATCH D_IN D_HIDDEN D_OUT STEPS. Prints one JSON object.
"""

import json
import sys
import time

import torch
import torch.nn as nn

batch, d_in, d_hidden, d_out, steps = (int(v) for v in sys.argv[1:6])
torch.manual_seed(0)
device = torch.device("cuda", 0)
torch.cuda.set_device(device)
model = nn.Sequential(nn.Linear(d_in, d_hidden), nn.GELU(), nn.Linear(d_hidden, d_out)).to(device, torch.bfloat16)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
x = torch.randn(batch, d_in, device=device, dtype=torch.bfloat16)
target = torch.randn(batch, d_out, device=device, dtype=torch.bfloat16)

torch.cuda.synchronize()
t0 = time.perf_counter()
for _ in range(steps):
    opt.zero_grad(set_to_none=False)
    loss = nn.functional.mse_loss(model(x).float(), target.float())
    loss.backward()
    opt.step()
torch.cuda.synchronize()
t1 = time.perf_counter()

del x, target, loss
state_tensors = [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v) and v.is_cuda]
print(json.dumps({
    "elapsed_s": t1 - t0,
    "memory_allocated": torch.cuda.memory_allocated(),
    "max_memory_allocated": torch.cuda.max_memory_allocated(),
    "memory_reserved": torch.cuda.memory_reserved(),
    "n_params": len(list(model.parameters())),
    "n_cuda_state_tensors": len(state_tensors),
}))
