"""What a user reads from a run: layouts of convolutions, SDPA's input errors, lazy modules, counts from constant
tensors.
Prints one JSON line; the test compares it with plain CPU torch and with what cuDNN does on a GPU."""
import json
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

dev = sys.argv[1] if len(sys.argv) > 1 else "cuda"
out = {}

# a channels-last network stays channels-last through every convolution (cuDNN's output layout)
cl = torch.channels_last
net = nn.Sequential(nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1, groups=32),
                    nn.ConvTranspose2d(32, 16, 2, stride=2)).to(dev).to(memory_format=cl)
x = torch.randn(4, 16, 16, 16, device=dev).to(memory_format=cl).requires_grad_()
h = x
layouts = []
for m in net:
    h = m(h)
    layouts.append(h.is_contiguous(memory_format=cl))
h.sum().backward()
out["conv_channels_last"] = layouts
out["grad_channels_last"] = x.grad.is_contiguous(memory_format=cl)

# SDPA rejects what ATen's input validation rejects
q = torch.randn(2, 4, 32, 16, device=dev)
errors = {}
for name, k, mask in [("mask_length", q, torch.ones(2, 1, 1, 20, dtype=torch.bool, device=dev)),
                      ("mask_dtype", q, torch.ones(2, 1, 1, 32, dtype=torch.int32, device=dev)),
                      ("kv_dtype", q.double(), None), ("valid", q, torch.ones(2, 1, 1, 32, dtype=torch.bool,
                                                                                    device=dev))]:
    try:
        F.scaled_dot_product_attention(q, k, q, attn_mask=mask)
        errors[name] = None
    except RuntimeError as e:
        errors[name] = type(e).__name__
out["sdpa_errors"] = errors

# lazy modules: uninitialised until the first forward, moved with .to() or made on the device, then trained
from torch.nn.parameter import UninitializedParameter, is_lazy  # noqa: E402
lazy = {}
moved = nn.Sequential(nn.LazyConv2d(4, 3), nn.LazyBatchNorm2d(), nn.ReLU(), nn.Flatten(), nn.LazyLinear(5))
moved[4].weight.tag = "kept"                       # a parameter's own attribute survives .to() and the first forward
moved = moved.to(dev)
made = nn.Sequential(nn.LazyLinear(8, device=dev), nn.ReLU(), nn.LazyLinear(3, device=dev))
for name, model, x in [("moved", moved, torch.randn(2, 3, 6, 6, device=dev)),
                       ("made", made, torch.randn(4, 5, device=dev))]:
    before = [isinstance(p, UninitializedParameter) for p in model.parameters()]
    try:
        next(model.parameters()).shape
        shape_error = None
    except RuntimeError as e:
        shape_error = type(e).__name__
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(2):
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
    lazy[name] = {"uninitialized": before, "shape_error": shape_error,
                  "params": [(list(p.shape), p.device.type == x.device.type, isinstance(p, nn.Parameter), is_lazy(p),
                              p.is_leaf) for p in model.parameters()],
                  "buffers": [(list(b.shape), b.device.type == x.device.type) for b in model.buffers()],
                  "modules": [type(m).__name__ for m in model], "optimizer_state": [len(v) for v in opt.state.values()]}
lazy["attribute"] = getattr(moved[4].weight, "tag", None)
out["lazy_modules"] = lazy

# counts and sums of constant tensors of any size
mask = torch.ones(2, 128, device=dev)
out["ones_sum"] = mask.sum().item()
out["ones_mean"] = mask.mean().item()
out["host_ones_sum"] = torch.ones(4, 300).to(dev).sum().item()
z = torch.empty(3, 500, device=dev)
z.fill_(1.5)
z.mul_(2)
out["filled_sum"] = z.sum().item()
out["full_rows"] = torch.full((8, 64), 2, device=dev, dtype=torch.int64).sum(dim=1)[3].item()
part = torch.ones(4, 100, device=dev)
part[:, :10] = 0
out["partly_written_is_not_ones"] = part.sum().item() != 400.0 or dev == "cpu"
# a tensor that requires grad read into numpy: ATen refuses it, on the host as on the GPU
w = torch.ones(3, device=dev, requires_grad=True)
try:
    (w * 2).sum().cpu().numpy()
    out["numpy_requires_grad"] = None
except RuntimeError as e:
    out["numpy_requires_grad"] = type(e).__name__
print(json.dumps(out))
