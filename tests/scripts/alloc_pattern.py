"""Allocates a pattern whose reserved memory PyTorch's caching allocator settings change (tests/test_live_run.py)."""

import json

import torch

MiB = 1 << 20
a = torch.empty(3 * MiB, dtype=torch.uint8, device="cuda")
b = torch.empty(12 * MiB, dtype=torch.uint8, device="cuda")
del a, b
c = torch.empty(25 * MiB, dtype=torch.uint8, device="cuda")
print("RESULT " + json.dumps({"reserved": torch.cuda.max_memory_reserved(),
                              "allocated": torch.cuda.max_memory_allocated()}), flush=True)
