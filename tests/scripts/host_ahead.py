"""For tests/test_live_run.py: 22 GEMMs of 8192^3 an iteration (20 forward, the loss's and its weight gradient),
the host issuing iterations ahead of the GPU unless `sync` makes it wait at the end of each one."""
import sys

import torch

sync = len(sys.argv) > 1 and sys.argv[1] == "sync"
w = torch.nn.Parameter(torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16))
x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
opt = torch.optim.SGD([w], lr=0.1)
for step in range(6):
    for _ in range(20):
        y = x @ w
    (x @ w).sum().backward()
    opt.step()
    opt.zero_grad()
    if sync:
        torch.cuda.synchronize()
