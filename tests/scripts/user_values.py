"""What a user reads from a run: layouts of convolutions, SDPA's input errors.
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

print(json.dumps(out))
