"""Flex attention inside a compiled region (docs/compile.md): a block with causal flex attention trained eagerly,
then compiled with fullgraph=True, as TorchTitan compiles its flex-attention models. Sections of the op stream are
separated by torch.cuda.synchronize(); what the program sees is printed as JSON."""
import json

import torch
import torch._dynamo
import torch.nn as nn
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

B, H, S, D = 2, 8, 1024, 64


def causal(b, h, q, kv):
    return q >= kv


class Block(nn.Module):
    def __init__(self, d=H * D):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.o = nn.Linear(d, d, bias=False)

    def forward(self, x, mask):
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, H, D).permute(2, 0, 3, 1, 4)
        a = flex_attention(q, k, v, block_mask=mask)
        return x + self.o(a.transpose(1, 2).reshape(b, s, d))


mask = create_block_mask(causal, B, None, S, S, device="cuda")
x = torch.randn(B, S, H * D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
torch.cuda.synchronize()                                   # section 0 ends
out = {}
for name in ("eager", "compiled"):
    block = Block().cuda().bfloat16()
    if name == "compiled":
        block.compile(fullgraph=True)
    for _ in range(2):
        block(x, mask).float().pow(2).mean().backward()
        torch.cuda.synchronize()                           # sections 1-2 eager, 3-4 compiled
out["graph_breaks"] = sum(torch._dynamo.utils.counters["graph_break"].values())
print(json.dumps(out))
