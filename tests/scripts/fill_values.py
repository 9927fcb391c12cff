"""For tests/test_live_run.py: a small tensor whose value is unknown (a slice of a large random draw), then filled
with a known value in the ways a framework writes one (`fill_`, `zero_`, `nn.init.constant_`, a slice assigned a
number): on a GPU each reads the value written."""
import json

import torch
import torch.nn as nn

t = torch.randn(1000, device="cuda")[:4].clone()
a = t.clone()
a.fill_(3.0)
b = t.clone()
b.zero_()
lin = nn.Linear(4, 4).cuda()
nn.init.constant_(lin.bias, 0.5)
with torch.no_grad():
    c = t.clone()
    c[:] = 2
    d = t.clone()
    d.fill_(torch.tensor(1.5, device="cuda"))
print("RESULT " + json.dumps({"fill": a.tolist(), "zero": b.tolist(), "bias": lin.bias.tolist(), "slice": c.tolist(),
                              "fill_tensor": d.tolist(), "sum": (a + c).sum().item()}), flush=True)
