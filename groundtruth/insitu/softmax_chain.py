"""How much memory the backward of Megatron-core's unfused softmax holds at once, in plain PyTorch.

The chain of `FusedScaleMaskSoftmax.forward_torch_softmax` on bf16 scores (cast to fp32, scale, masked_fill_ in
place, softmax, cast back to bf16), run forward and backward: its first steps alone, the whole chain alone
("plain"), inside a reentrant checkpoint (as Megatron's full recompute runs it) and inside a non-reentrant one. Prints, for each, the peak of allocated memory above what
was allocated before, in units of one fp32 tensor of the scores' size. Runs the same on a GPU host and under
`phantora run` (one GPU):

    python groundtruth/insitu/softmax_chain.py [--heads 8 --seq 4096]
    phantora run --cluster h200-1gpu -- python groundtruth/insitu/softmax_chain.py

With `--sweep`, instead: softmax's and log_softmax's backward alone on 2^28 elements, fp32, bf16 and fp16, last
dimension 64 to 16,384, each backward's peak of allocated memory above what was allocated before it, in units of
the input's size.
"""

import argparse

import torch
import torch.utils.checkpoint


def chain(scores, mask):
    x = scores.float()
    x = x * 0.125
    x.masked_fill_(mask, -10000.0)
    probs = torch.nn.Softmax(dim=-1)(x)
    return probs.bfloat16()


def sweep():
    n = 1 << 28
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for dim in (64, 512, 1024, 1025, 2048, 4096, 16384):
            for fn in ("softmax", "log_softmax"):
                x = torch.randn(n // dim, dim, device="cuda", dtype=dtype, requires_grad=True)
                unit = x.numel() * x.element_size()
                out = getattr(torch, fn)(x, -1)
                grad = torch.ones_like(out)
                torch.cuda.synchronize()
                base = torch.cuda.memory_allocated()
                torch.cuda.reset_peak_memory_stats()
                out.backward(grad)
                torch.cuda.synchronize()
                print(f"{str(dtype):>15} dim {dim:>6} {fn:>12}: backward peak "
                      f"{(torch.cuda.max_memory_allocated() - base) / unit:.2f} x input", flush=True)
                del x, out, grad


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--sweep", action="store_true", help="softmax and log_softmax backward alone, by dimension")
    args = parser.parse_args()
    if args.sweep:
        return sweep()
    unit = args.heads * args.seq * args.seq * 4
    mask = torch.ones(1, 1, args.seq, args.seq, dtype=torch.bool, device="cuda").triu(1)
    runs = {
        "softmax": lambda x: torch.nn.Softmax(dim=-1)(x.float()).bfloat16(),
        "scale, softmax": lambda x: torch.nn.Softmax(dim=-1)(x.float() * 0.125).bfloat16(),
        "scale, masked_fill, softmax": lambda x: torch.nn.Softmax(dim=-1)(
            (x.float() * 0.125).masked_fill(mask, -10000.0)).bfloat16(),
        "plain": lambda x: chain(x, mask),
        "reentrant checkpoint": lambda x: torch.utils.checkpoint.checkpoint(chain, x, mask, use_reentrant=True),
        "non-reentrant checkpoint": lambda x: torch.utils.checkpoint.checkpoint(chain, x, mask, use_reentrant=False),
    }
    for name, run in runs.items():
        for _ in range(2):
            scores = torch.randn(1, args.heads, args.seq, args.seq, device="cuda", dtype=torch.bfloat16,
                                 requires_grad=True)
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            out = run(scores)
            forward = torch.cuda.max_memory_allocated() - base
            out.backward(torch.ones_like(out))
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated() - base
            del out, scores
        print(f"{name:>26}: forward peak {forward / unit:.2f}, step peak {peak / unit:.2f} fp32 score tensors "
              f"({peak / 2**20:.0f} MiB)", flush=True)


if __name__ == "__main__":
    main()
