"""Trains a step and saves the model's and optimizer's state with torch.save to PATH, as a training script's
checkpoint; prints, as one JSON line, the bytes of the CUDA tensors saved (each storage once) and their shapes."""
import json
import sys

import torch

model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 8)).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
model(torch.randn(4, 256, device="cuda")).sum().backward()
opt.step()
state = {"model": model.state_dict(), "opt": opt.state_dict(), "step": 1}
seen, nbytes, shapes = set(), 0, {}
for name, t in state["model"].items():
    shapes[name] = list(t.shape)
tensors = list(state["model"].values()) + [v for s in state["opt"]["state"].values() for v in s.values()
                                           if isinstance(v, torch.Tensor)]
for t in tensors:
    if t.is_cuda and t.untyped_storage()._cdata not in seen:
        seen.add(t.untyped_storage()._cdata)
        nbytes += t.numel() * t.element_size()
torch.cuda.synchronize()
torch.save(state, sys.argv[1])
print(json.dumps({"cuda_bytes": nbytes, "shapes": shapes}), flush=True)
