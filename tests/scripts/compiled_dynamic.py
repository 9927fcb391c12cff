"""A compiled function called at new sizes (docs/compile.md): Dynamo compiles it again for the second size, with
dynamic shapes, and that graph serves the third; one optimizer step (an iteration) comes before the recompilation.
Sections of the op stream are separated by torch.cuda.synchronize(); the program's view is printed as JSON."""
import json
import time

import torch

SIZES = (1 << 20, 1 << 21, 3 << 19)        # static, then recompiled dynamic, then served by the dynamic graph


def chain(x):
    return torch.relu(x * 2 + 1)


compiled = torch.compile(chain)
weight = torch.zeros(8, device="cuda", requires_grad=True)
opt = torch.optim.SGD([weight], lr=0.1)
out = {"sizes": SIZES, "call_s": []}
torch.cuda.synchronize()                               # section 0 ends
for i, n in enumerate(SIZES):
    x = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()                           # sections 1, 3, 5: the input
    t0 = time.perf_counter()
    compiled(x)
    torch.cuda.synchronize()                           # sections 2, 4, 6: the compiled call
    out["call_s"].append(time.perf_counter() - t0)
    if i == 0:
        weight.grad = torch.ones_like(weight)
        opt.step()                                     # the first iteration ends
print(json.dumps(out), flush=True)
