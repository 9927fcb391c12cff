"""Boolean-mask indexing, the loss-masking idiom: x[mask] and x[mask] = v with a mask whose value the rank knows
(labels drawn from host data) and one it does not (a comparison of large activations); x[mask] = a host scalar.
Prints the shapes as JSON."""
import json

import torch

labels = torch.randint(0, 10, (1000,), device="cuda")
labels[::7] = -100                                   # 143 ignored positions
x = torch.randn(1000, 64, device="cuda", requires_grad=True)
known = x[labels != -100]
known.sum().backward()
activations = torch.randn(8192, 256, device="cuda")
unknown = activations[activations[:, 0] > 0]
grid = torch.randn(4, 100, 16, device="cuda")
middle = grid[:, torch.arange(100, device="cuda") % 2 == 0]
activations[activations > 0] = 0.0
small = torch.tensor([1.0, 2.0, 3.0], device="cuda")
small[small > 1.5] = 0.0
grid[:, torch.arange(100, device="cuda") % 2 == 0] = 1.0
print(json.dumps({"known": list(known.shape), "grad": list(x.grad.shape), "unknown": list(unknown.shape),
                  "middle": list(middle.shape), "put": list(activations.shape), "small": small.tolist(),
                  "grid": list(grid.shape)}), flush=True)
