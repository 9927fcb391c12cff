"""Float8 training under simulation (torchao's convert_to_float8_training, tensorwise recipe): one linear layer's
forward and backward, eager then compiled, sections separated by torch.cuda.synchronize()."""
import json

import torch
import torch.nn as nn
from torchao.float8 import Float8LinearConfig, convert_to_float8_training

M, K, N = 8192, 4096, 8192
out = {}
layer = nn.Sequential(nn.Linear(K, N, bias=False)).cuda().bfloat16()
convert_to_float8_training(layer, config=Float8LinearConfig.from_recipe_name("tensorwise"))
out["converted"] = type(layer[0]).__name__
x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, requires_grad=True)
torch.cuda.synchronize()                                   # section 0: set-up
layer(x).sum().backward()
torch.cuda.synchronize()                                   # section 1: eager
compiled = torch.compile(layer)
compiled(x).sum().backward()
torch.cuda.synchronize()                                   # section 2: compiled, first call
compiled(x).sum().backward()
torch.cuda.synchronize()                                   # section 3: compiled
out["grad_dtype"] = str(layer[0].weight.grad.dtype)
print(json.dumps(out))
