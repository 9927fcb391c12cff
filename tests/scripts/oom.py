"""Allocates device memory until it runs out; prints one JSON object."""

import json

import torch

total = torch.cuda.get_device_properties(0).total_memory
out = {"total_memory": total}
first = torch.empty(int(total * 0.6), dtype=torch.uint8, device="cuda")
out["after_first"] = torch.cuda.memory_allocated()
try:
    second = torch.empty(int(total * 0.6), dtype=torch.uint8, device="cuda")  # OOM-LINE
    out["raised"] = False
except torch.OutOfMemoryError as exc:
    out["raised"] = True
    out["message"] = str(exc)
del first
third = torch.empty(int(total * 0.6), dtype=torch.uint8, device="cuda")
out["after_free_and_realloc"] = torch.cuda.memory_allocated()
print(json.dumps(out))
