"""Time SyncBatchNorm's CUDA kernels on one GPU (the ops torch/nn/modules/_functions.py calls) against the bytes each
must move, for the shapes of ResNet-50's batch norms at 32 images per GPU.

    python groundtruth/syncbn/syncbn_kernels.py OUT.json [--reps 50]

Each op is timed alone with CUDA events around `reps` back-to-back calls (after warm-up); the JSON holds, per op,
shape and dtype: the median time of one call (over 5 rounds), the bytes it reads and writes (its tensor arguments
and results, the large ones counted once), and the rate those bytes give."""
import argparse
import json
import statistics

import torch

SHAPES = [(32, 64, 112, 112), (32, 256, 56, 56), (32, 512, 28, 28), (32, 1024, 14, 14), (32, 2048, 7, 7),
          (8, 64, 56, 56)]
WORLD = 8        # statistics gathered from this many ranks (a gather of per-rank means)


def timed(fn, reps):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    rounds = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            fn()
        b.record()
        b.synchronize()
        rounds.append(a.elapsed_time(b) / reps * 1e3)          # us per call
    return statistics.median(rounds)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--reps", type=int, default=50)
    a = p.parse_args()
    dev = torch.device("cuda")
    rows = []
    for dtype in (torch.bfloat16, torch.float32):
        for shape in SHAPES:
            c = shape[1]
            x = torch.randn(shape, device=dev, dtype=dtype)
            g = torch.randn(shape, device=dev, dtype=dtype)
            w = torch.ones(c, device=dev)
            b = torch.zeros(c, device=dev)
            rm, rv = torch.zeros(c, device=dev), torch.ones(c, device=dev)
            big = x.numel() * x.element_size()
            mean, invstd = torch.batch_norm_stats(x, 1e-5)
            means, invstds = mean.repeat(WORLD, 1), invstd.repeat(WORLD, 1)
            counts = torch.full((WORLD,), x.numel() // c, device=dev, dtype=torch.float32)
            gmean, ginvstd = torch.batch_norm_gather_stats_with_counts(x, means, invstds, rm, rv, 0.1, 1e-5, counts)
            sum_dy, sum_dy_xmu, gw, gb = torch.batch_norm_backward_reduce(g, x, gmean, ginvstd, w, True, True, True)
            small = 4 * c
            ops = {
                "batch_norm_stats": (lambda: torch.batch_norm_stats(x, 1e-5), big + 2 * small),
                "batch_norm_gather_stats_with_counts": (
                    lambda: torch.batch_norm_gather_stats_with_counts(x, means, invstds, rm, rv, 0.1, 1e-5, counts),
                    2 * WORLD * small + 4 * small + 4 * WORLD),
                "batch_norm_elemt": (lambda: torch.batch_norm_elemt(x, w, b, gmean, ginvstd, 1e-5),
                                     2 * big + 4 * small),
                "batch_norm_backward_reduce": (
                    lambda: torch.batch_norm_backward_reduce(g, x, gmean, ginvstd, w, True, True, True),
                    2 * big + 7 * small),
                "batch_norm_backward_elemt": (
                    lambda: torch.batch_norm_backward_elemt(g, x, gmean, ginvstd, w, sum_dy, sum_dy_xmu, counts.int()),
                    3 * big + 5 * small),
            }
            for name, (fn, nbytes) in ops.items():
                us = timed(fn, a.reps)
                rows.append({"op": name, "shape": list(shape), "dtype": str(dtype).removeprefix("torch."),
                             "us": round(us, 3), "bytes": nbytes, "gbps": round(nbytes / us / 1e3, 1)})
                print(json.dumps(rows[-1]), flush=True)
    json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "world": WORLD, "rows": rows},
              open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
