"""SDPA forward and backward time over sequence length, head dimension, mask and dropout (bf16, batch 4, model
dimension 2,048, so 2,048 / d heads): one JSON line per case with the mean forward and backward in ms (CUDA events
around 10 calls after 2 warm-up calls; the backward is `torch.autograd.grad` of one forward's output, so no
gradient accumulation is timed). The same script runs on a GPU host and under `phantora run --gpus-per-node 1`.

Masks: `causal` (is_causal=True), `none`, `bool` (a lower-triangular boolean T x T mask), `additive` (the same as a
bf16 0 / -inf T x T tensor), `padding` (a boolean B x 1 x 1 x T key-padding mask, the last eighth masked).
"""
import json
import sys

import torch
import torch.nn.functional as F

B, DM, REPS = 4, 2048, 10
SEQS = [int(s) for s in (sys.argv[1].split(",") if len(sys.argv) > 1 else "1024,2048,4096,8192".split(","))]


def timed(fn, reps=REPS):
    for _ in range(2):
        fn()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / reps


def masks(t):
    tril = torch.ones(t, t, dtype=torch.bool, device="cuda").tril()
    pad = torch.ones(B, 1, 1, t, dtype=torch.bool, device="cuda")
    pad[..., t - t // 8:] = False
    add = torch.zeros(t, t, dtype=torch.bfloat16, device="cuda").masked_fill(~tril, float("-inf"))
    return [("causal", dict(is_causal=True)), ("none", {}), ("bool", dict(attn_mask=tril)),
            ("additive", dict(attn_mask=add)), ("padding", dict(attn_mask=pad))]


def main():
    torch.manual_seed(0)
    for t in SEQS:
        for d in (64, 128, 256):
            h = DM // d
            q, k, v = [torch.randn(B, h, t, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                       for _ in range(3)]
            for name, kw in masks(t):
                for p in (0.0, 0.1):
                    f = lambda: F.scaled_dot_product_attention(q, k, v, dropout_p=p, **kw)
                    with torch.no_grad():
                        fwd = timed(f)
                    o = f()
                    g = torch.ones_like(o)
                    bwd = timed(lambda: torch.autograd.grad(o, (q, k, v), g, retain_graph=True))
                    print(json.dumps({"seq": t, "head_dim": d, "heads": h, "batch": B, "mask": name, "dropout": p,
                                      "fwd_ms": round(fwd, 4), "bwd_ms": round(bwd, 4)}), flush=True)
                    del o, g
            del q, k, v


if __name__ == "__main__":
    main()
