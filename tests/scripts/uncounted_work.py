"""A training loop whose main thread also prepares each batch with numpy (`numpy`) or does not (`plain`)."""
import sys

import numpy as np
import torch

m = torch.nn.Linear(1024, 1024, device="cuda")
opt = torch.optim.SGD(m.parameters(), lr=0.1)
rng = np.random.default_rng(0)
for step in range(4):
    if sys.argv[1] == "numpy":
        batch = rng.standard_normal((64, 3, 224, 224)).astype(np.float32)     # about 0.1-0.3 s of CPU here
        batch = (batch - batch.mean()) / batch.std()
    x = torch.randn(64, 1024, device="cuda")
    m(x).sum().backward()
    opt.step()
    opt.zero_grad()
torch.cuda.synchronize()
