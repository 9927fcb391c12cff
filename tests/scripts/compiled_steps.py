"""Compiled regions under simulation (docs/compile.md): a pointwise chain, a block trained compiled and eager, the
same block with activation checkpointing, a graph break. Sections of the op stream are separated by
torch.cuda.synchronize(); what the program sees is printed as JSON."""
import json
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

out = {}
N = 1 << 24


def chain(x):
    return torch.relu(x * 2 + 1)


x = torch.randn(N, device="cuda", dtype=torch.bfloat16)
torch.cuda.synchronize()                                   # section 0 ends
compiled_chain = torch.compile(chain)
t0 = time.perf_counter()
compiled_chain(x)
torch.cuda.synchronize()                                   # section 1: first call (compiles)
out["first_call_s"] = time.perf_counter() - t0
t0 = time.perf_counter()
y = compiled_chain(x)
torch.cuda.synchronize()                                   # section 2: second call
out["second_call_s"] = time.perf_counter() - t0
out["chain_shape"] = list(y.shape)
chain(x)
torch.cuda.synchronize()                                   # section 3: eager


class Block(nn.Module):
    def __init__(self, d, heads, ac=False):
        super().__init__()
        self.heads, self.ac = heads, ac
        self.norm = nn.RMSNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.o = nn.Linear(d, d, bias=False)
        self.w1 = nn.Linear(d, 4 * d, bias=False)
        self.w2 = nn.Linear(4 * d, d, bias=False)

    def attend(self, h):
        b, s, d = h.shape
        q, k, v = self.qkv(h).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(a.transpose(1, 2).reshape(b, s, d))

    def forward(self, x):
        h = x + (checkpoint(self.attend, self.norm(x), use_reentrant=False) if self.ac else self.attend(self.norm(x)))
        return h + self.w2(F.silu(self.w1(self.norm(h))))


def train(block, steps=2):
    inp = torch.randn(4, 1024, 1024, device="cuda", dtype=torch.bfloat16)
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    for _ in range(steps):
        block(inp).float().pow(2).mean().backward()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


torch.manual_seed(0)
eager = Block(1024, 8).cuda().bfloat16()
compiled = Block(1024, 8).cuda().bfloat16()
compiled.compile()
out["eager_peak"] = train(eager)                           # section 4
out["compiled_peak"] = train(compiled)                     # section 5
ac = Block(1024, 8, ac=True).cuda().bfloat16()
ac.compile()
train(ac)                                                  # section 6


def with_break(t):
    t = t * 3
    torch._dynamo.graph_break()
    return t + 1


torch.compile(with_break)(x)
torch.cuda.synchronize()                                   # section 7
a = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
mm_only = torch.compile(lambda m: m @ m)                   # a region of one extern kernel, no generated one
mm_only(a)
torch.cuda.synchronize()
t0 = time.perf_counter()
mm_only(a)
out["extern_only_call_s"] = time.perf_counter() - t0       # section 8: the second call (host time: nothing waits)
torch.cuda.synchronize()
from phantora_stubs import compiled as _c                  # noqa: E402 - what the run summary line says
out["report"] = _c.report()
print(json.dumps(out))
