"""A model split over two devices in one process (`split`), or one device used throughout (`one`)."""
import sys

import torch

a = torch.nn.Linear(256, 256, device="cuda:0")
x = torch.randn(8, 256, device="cuda:0")
if sys.argv[1] == "split":
    b = torch.nn.Linear(256, 256, device="cuda:1")
    y = b(a(x).to("cuda:1"))
else:
    y = a(a(x))
y.sum().backward()
torch.cuda.synchronize()
