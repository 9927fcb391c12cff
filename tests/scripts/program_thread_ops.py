"""GPU ops on a thread the program starts (for tests/test_program_threads.py): a training step on the main thread (its
backward on the autograd engine's threads), then two matmuls on a thread named "prefetch" and one on "writer"."""
import threading

import torch

model = torch.nn.Linear(256, 256).cuda()
model(torch.randn(8, 256, device="cuda")).sum().backward()
a = torch.randn(1024, 1024, device="cuda")


def work():
    b = a @ a
    b @ a


for name in ("prefetch", "writer"):
    t = threading.Thread(target=work, name=name)
    t.start()
    t.join()
torch.cuda.synchronize()
print("done", flush=True)
