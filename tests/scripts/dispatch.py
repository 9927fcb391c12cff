"""RMSNorm, SwiGLU and grouped-query causal attention, forward and backward, in bf16 on the simulated GPU.

Prints the kernel ops the rank recorded (from PHANTORA_OPLOG, read by the test) and nothing else of interest."""

import json

import torch
import torch.nn.functional as F

torch.manual_seed(0)
B, S, H, KV, D = 2, 128, 8, 2, 64
x = torch.randn(B, S, H * D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
norm_w = torch.ones(H * D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
w1 = torch.randn(H * D, 4 * H * D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
h = F.rms_norm(x, (H * D,), norm_w, 1e-5)
g = F.silu(h @ w1)
q = h.view(B, S, H, D).transpose(1, 2)
k = h[..., : KV * D].reshape(B, S, KV, D).transpose(1, 2)
o = F.scaled_dot_product_attention(q, k, k, is_causal=True, enable_gqa=True)
(o.float().sum() + g.float().sum()).backward()
torch.cuda.synchronize()
print(json.dumps({"done": True}))
