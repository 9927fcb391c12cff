"""For tests/test_live_run.py: an FP8 GEMM (`torch._scaled_mm`), which needs compute capability 8.9 or later."""
import json

import torch

a = torch.randn(64, 64, device="cuda").to(torch.float8_e4m3fn)
b = torch.randn(64, 64, device="cuda").to(torch.float8_e4m3fn).t()
one = torch.tensor(1.0, device="cuda")
try:
    torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    result = "ran"
except RuntimeError as e:
    result = str(e)
print("RESULT " + json.dumps({"rank": 0, "result": result}), flush=True)
