"""SDPA restricted to backends that refuse the inputs: a CUDA build raises "No available kernel" (it never falls
back to the math backend the program disabled). Prints RESULT {case: "ran" | error text}."""
import json

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

q32 = torch.randn(2, 8, 128, 64, device="cuda")
q16 = q32.bfloat16()
mask = torch.ones(128, 128, dtype=torch.bool, device="cuda").tril()
cases = {"flash_fp32": ([SDPBackend.FLASH_ATTENTION], q32, None),
         "flash_bf16_mask": ([SDPBackend.FLASH_ATTENTION], q16, mask),
         "flash_bf16": ([SDPBackend.FLASH_ATTENTION], q16, None),
         "flash_math_fp32": ([SDPBackend.FLASH_ATTENTION, SDPBackend.MATH], q32, None)}
out = {}
for name, (backends, q, m) in cases.items():
    with sdpa_kernel(backends):
        try:
            F.scaled_dot_product_attention(q, q, q, attn_mask=m)
            out[name] = "ran"
        except RuntimeError as e:
            out[name] = str(e)
print("RESULT " + json.dumps(out))
