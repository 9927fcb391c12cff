"""Reads `p.data` 1,000 times between two synchronisations (a C getter in a real run: no Python runs)."""
import torch

p = torch.nn.Parameter(torch.empty(4096, 1024, device="cuda", dtype=torch.bfloat16))
torch.cuda.synchronize()
for _ in range(1000):
    d = p.data
torch.cuda.synchronize()
