"""torch.autograd.grad's gradients are freed at `del`: allocated memory after each `del` is what it was before the
call. Prints one RESULT line (JSON): the allocated MiB before the loop and after each `del`."""

import json

import torch

MiB = 2**20
x = torch.randn(64, 1024, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
y = torch.softmax(x, -1)
ones = torch.ones_like(y)
base = torch.cuda.memory_allocated() / MiB
after = []
for _ in range(12):
    g = torch.autograd.grad(y, [x], ones, retain_graph=True)
    del g
    after.append(torch.cuda.memory_allocated() / MiB)
print("RESULT " + json.dumps({"base": base, "after": after}))
