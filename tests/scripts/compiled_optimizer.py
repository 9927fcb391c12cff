"""For tests/test_compile.py: PyTorch's compiled-optimizer recipe, `torch.compile` around `opt.step()`, with AdamW
(its moments made inside the first compiled step) or SGD (argv[1]: adamw | sgd). A torch.cuda.synchronize() after
each backward and each step separates them in the op log; each iteration starts with
`torch.compiler.cudagraph_mark_step_begin()`, as PyTorch's docs recommend for CUDA graphs. Prints the parameters' elements and the state's shapes
and devices, JSON."""
import json
import sys

import torch

kind = sys.argv[1]
model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024, device="cuda") for _ in range(4)])     # 8 tensors
opt = torch.optim.AdamW(model.parameters(), lr=torch.tensor(0.01)) if kind == "adamw" else \
    torch.optim.SGD(model.parameters(), lr=0.01)


@torch.compile
def step():
    opt.step()


for _ in range(3):
    torch.compiler.cudagraph_mark_step_begin()       # a no-op without CUDA graphs; imports CUDA-graph trees
    model(torch.randn(64, 1024, device="cuda")).sum().backward()
    torch.cuda.synchronize()
    step()
    torch.cuda.synchronize()
    opt.zero_grad()
state = [{k: [list(v.shape), str(v.device)] for k, v in s.items() if isinstance(v, torch.Tensor)}
         for s in opt.state.values()]
print(json.dumps({"params": sum(p.numel() for p in model.parameters()), "tensors": len(list(model.parameters())),
                  "state": state}))
