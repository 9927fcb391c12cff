"""How a kernel's time depends on what ran before it: the profile's way (L2 flushed, the GPU idle before the kernel)
against the kernel run back to back with itself.

    python groundtruth/insitu/l2_probe.py OUT.json

For each case (shapes of the `deepspeed` suite's pipeline rows, whose kernels the simulation costs 12-18% above
their in-situ times: groundtruth/deepspeed/README.md) it prints and writes, in microseconds:
- `profile`: phantora.costmodel.measure.measure_signature (L2 flushed, a spin before each run; the median);
- `back_to_back`: 200 runs in a row between two events, per run: inputs stay in L2 where they fit, and a kernel
  long enough to hold the GPU at its power limit runs at the limit's clock. A kernel shorter than the host's launch
  time (a few µs) measures the launches instead.
"""

from __future__ import annotations

import json
import statistics
import sys

import torch

from phantora.costmodel.measure import measure_signature
from phantora.costmodel.signature import signature_of

BF16 = torch.bfloat16
CASES = [
    ("mm 2048x3072 @ 3072x8192", torch.ops.aten.mm.default, [(2048, 3072), (3072, 8192)]),
    ("mm 2048x8192 @ 8192x3072", torch.ops.aten.mm.default, [(2048, 8192), (8192, 3072)]),
    ("mm 2048x3072 @ 3072x3072", torch.ops.aten.mm.default, [(2048, 3072), (3072, 3072)]),
    ("mm 2048x3072 @ 3072x1024", torch.ops.aten.mm.default, [(2048, 3072), (3072, 1024)]),
    ("mm 2048x3072 @ 3072x128256", torch.ops.aten.mm.default, [(2048, 3072), (3072, 128256)]),
    ("mul 1x2048x8192 (x2)", torch.ops.aten.mul.Tensor, [(1, 2048, 8192), (1, 2048, 8192)]),
    ("mul 1x2048x24x64 by 1x2048x1x64", torch.ops.aten.mul.Tensor, [(1, 2048, 24, 64), (1, 2048, 1, 64)]),
    ("add 1x2048x3072 (x2)", torch.ops.aten.add.Tensor, [(1, 2048, 3072), (1, 2048, 3072)]),
    ("mul of two scalars", torch.ops.aten.mul.Tensor, [(), ()]),
]


def timed(fn, runs: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    torch.cuda.synchronize()
    start.record()
    for _ in range(runs):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000.0 / runs


def case(name: str, op, shapes) -> dict:
    args = [torch.randn(s, device="cuda", dtype=BF16) for s in shapes]
    sig = signature_of(op, tuple(args), {})
    profile = statistics.median(measure_signature(sig, 30))
    back_to_back = timed(lambda: op(*args), 200)
    return {"case": name, "profile_us": profile, "back_to_back_us": back_to_back}


def main() -> None:
    out = [case(*c) for c in CASES]
    for r in out:
        print(f"{r['case']:36s} profile {r['profile_us']:9.2f}  back-to-back {r['back_to_back_us']:9.2f} us",
              flush=True)
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    with open(sys.argv[1], "w") as f:
        json.dump({**meta, "cases": out}, f, indent=1)


if __name__ == "__main__":
    main()
