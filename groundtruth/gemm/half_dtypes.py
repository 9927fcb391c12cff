"""fp16 against bf16 GEMMs on one GPU: the same shapes timed in both dtypes, alone, with CUDA events.

    python groundtruth/gemm/half_dtypes.py OUT.json

For each (m, n, k) of a set of training shapes (square, tall-skinny, a transformer block's projections), the median
over 20 timed runs (after 5 warm-up runs) of `a @ b` in torch.float16 and torch.bfloat16, each run after a write of
256 MiB that flushes the L2 cache; printed and written as JSON with the GPU's name and torch's version.
"""

import json
import statistics
import sys

import torch

SHAPES = [(8192, 8192, 8192), (4096, 4096, 4096), (2048, 2048, 2048), (1024, 1024, 1024), (16384, 4096, 4096),
          (8192, 14336, 4096), (8192, 4096, 14336), (8192, 128256, 4096), (4096, 1024, 4096), (512, 4096, 4096),
          (2048, 2048, 8192), (8192, 2048, 2048)]


def time_mm(m: int, n: int, k: int, dtype: torch.dtype, flush: torch.Tensor) -> float:
    a = torch.randn(m, k, device="cuda", dtype=dtype)
    b = torch.randn(k, n, device="cuda", dtype=dtype)
    times = []
    for i in range(25):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ b
        end.record()
        end.synchronize()
        if i >= 5:
            times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def main(out: str) -> None:
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    rows = []
    for m, n, k in SHAPES:
        row = {"m": m, "n": n, "k": k}
        for name, dtype in (("fp16_us", torch.float16), ("bf16_us", torch.bfloat16)):
            row[name] = time_mm(m, n, k, dtype, flush)
        row["fp16_over_bf16"] = row["fp16_us"] / row["bf16_us"]
        rows.append(row)
        print(f"{m:>6} {n:>6} {k:>6}  fp16 {row['fp16_us']:9.1f} us  bf16 {row['bf16_us']:9.1f} us  "
              f"ratio {row['fp16_over_bf16']:.3f}", flush=True)
    with open(out, "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
