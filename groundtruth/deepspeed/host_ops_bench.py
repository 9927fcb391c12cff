"""Host memory traffic of PyTorch's eager CPU ops (what ZeRO-Offload runs on the host besides CPU Adam), for the host
preset's `[host]` rate tables of ops on host tensors (`copy_gbps`, `downcast_gbps`, ...).

    OMP_NUM_THREADS=1 python groundtruth/deepspeed/host_ops_bench.py --elements 100000000

For each op over N-element tensors: 2 warm-up runs and 5 timed; prints one JSON line per op with the median time and
the traffic, bytes read plus bytes written over that time.
"""

import argparse
import json
import os
import statistics
import time

import torch


def bench(fn, reps=5):
    for _ in range(2):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--elements", type=int, default=100_000_000)
    p.add_argument("--start-at", type=float, default=0.0,
                   help="wall-clock time (time.time()) to start timing at, after the set-up (processes started "
                        "together time together)")
    p.add_argument("--tag", default="", help="a label copied into each output line (which of several processes)")
    args = p.parse_args()
    n = args.elements
    f32 = torch.randn(n)
    f32b = torch.randn(n)
    bf = torch.empty(n, dtype=torch.bfloat16)
    cases = {
        "copy_bf16_from_fp32": (lambda: bf.copy_(f32), 6 * n),
        "to_fp32_from_bf16": (lambda: bf.float(), 6 * n),
        "copy_fp32": (lambda: f32b.copy_(f32), 8 * n),
        "mul_fp32_inplace": (lambda: f32.mul_(1.0000001), 8 * n),
        "add_fp32_inplace": (lambda: f32.add_(f32b), 12 * n),
        "norm_fp32": (lambda: torch.linalg.vector_norm(f32), 4 * n),
    }
    late = max(0.0, time.time() - args.start_at) if args.start_at else 0.0   # set-up overran --start-at
    time.sleep(max(0.0, args.start_at - time.time()))
    for name, (fn, nbytes) in cases.items():
        t = bench(fn)
        print(json.dumps({"op": name, "elements": n, "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
                          "torch_threads": torch.get_num_threads(), "median_s": t, "bytes": nbytes,
                          "gbps": nbytes / t / 1e9, "tag": args.tag, "late_s": late}), flush=True)


if __name__ == "__main__":
    main()
