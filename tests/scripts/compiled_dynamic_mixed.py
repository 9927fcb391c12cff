"""A graph compiled for dynamic shapes with a kernel whose own sizes are static (`x[:8] + 1`) beside one whose
sizes are symbols: three sizes, one graph. Prints the number of graphs Dynamo made."""
import json

import torch
import torch._dynamo
import torch.nn.functional as F


def f(x, w):
    return F.rms_norm(x, (64,), w), x[:8] + 1


g = torch.compile(f, dynamic=True)
w = torch.ones(64, device="cuda")
for n in (16, 24, 40):
    g(torch.randn(n, 64, device="cuda"), w)
torch.cuda.synchronize()
print(json.dumps({"graphs": int(torch._dynamo.utils.counters["stats"]["unique_graphs"])}))
