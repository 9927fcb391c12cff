"""Optimizers stepping in turns or one after another: `turns` steps two optimizers each training step (a GAN's
discriminator and generator); `phases` trains with one optimizer, then replaces it with a new one (a new phase).
Prints RESULT {"steps": N} with the number of optimizer steps taken."""
import json
import sys

import torch

mode = sys.argv[1]
torch.manual_seed(0)
a = torch.nn.Linear(64, 64, device="cuda")
b = torch.nn.Linear(64, 64, device="cuda")
x = torch.randn(8, 64, device="cuda")
steps = 0


def step(model, opt):
    global steps
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()
    steps += 1


if mode == "turns":
    opt_a, opt_b = torch.optim.SGD(a.parameters(), lr=0.1), torch.optim.SGD(b.parameters(), lr=0.1)
    for _ in range(3):
        step(a, opt_a)
        step(b, opt_b)
else:
    for phase in range(3):
        opt = torch.optim.AdamW(a.parameters(), lr=1e-3)      # re-created each phase, while the old one lives
        for _ in range(2):
            step(a, opt)
print("RESULT " + json.dumps({"steps": steps}))
