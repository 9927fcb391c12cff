"""For tests/test_compile.py: CUDA graphs asked for through Inductor's config (not a mode), then an FP8 GEMM of two
e5m2 operands, which an H100 refuses. Prints one RESULT line."""
import json

import torch
import torch._inductor.config as inductor_config

inductor_config.triton.cudagraphs = True
model = torch.compile(torch.nn.Linear(256, 256, device="cuda"))
for _ in range(2):
    model(torch.randn(16, 256, device="cuda")).sum().backward()
a = torch.randn(64, 64, device="cuda").to(torch.float8_e5m2)
b = torch.randn(64, 64, device="cuda").to(torch.float8_e5m2).t()
one = torch.tensor(1.0, device="cuda")
try:
    torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16)
    e5m2 = "ran"
except ValueError as e:
    e5m2 = str(e)
print("RESULT " + json.dumps({"e5m2": e5m2}), flush=True)
