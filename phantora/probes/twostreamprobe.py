"""How much two kernels running side by side on two streams of one GPU slow each other (device tool).

    python -m phantora.probes.twostreamprobe --out OUT.json [--window-ms 40] [--repeats 5]

A training step's streams share one GPU: FSDP copies the next block's weights on its all-gather stream while the
compute stream runs the current block, DeepSpeed reduces on a side stream, a program overlaps two GEMMs by hand.
Two kernels that each fill the GPU's SMs or its memory bandwidth cannot both run at their full speed. For each
pair of kernel kinds (a large bf16 GEMM, which is compute-bound; a large copy and a large element-wise add,
memory-bound; a small GEMM and a small add that fill a part of the GPU) the probe measures, on one GPU:

- each kind alone: back-to-back launches on one stream, over a window of about `--window-ms`, per-launch time;
- the pair: kind A back to back on one stream over the window, and kind B on another stream for two and a half
  windows, so that B runs beside A all the time A runs (the launches enqueued while the GPU spins, so both streams
  start together); A's span by CUDA events.

`slowdown[A][B]` is A's per-launch time beside B over its time alone (the median of `--repeats` runs): 1 when B
takes nothing from A, 2 when the two share the GPU evenly. Inputs rotate through a pool larger than the L2 cache.
Nothing is changed on the GPU (no clock or power setting).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time


def _kinds(torch, dev, l2_bytes: int) -> dict:
    """kind -> (callables launching one kernel each, FLOPs, bytes moved) on inputs rotating beyond the L2."""
    bf16 = torch.bfloat16
    pool_bytes = 3 * max(l2_bytes, 50 << 20)

    def pool(make, nbytes):
        return [make() for _ in range(max(1, min(16, -(-pool_bytes // max(nbytes, 1)))))]

    out = {}
    for name, m in (("gemm_8192", 8192), ("gemm_1024", 1024)):
        mats = pool(lambda m=m: (torch.randn(m, m, device=dev, dtype=bf16), torch.randn(m, m, device=dev, dtype=bf16),
                                 torch.empty(m, m, device=dev, dtype=bf16)), 3 * 2 * m * m)
        out[name] = ([lambda p=p: torch.mm(p[0], p[1], out=p[2]) for p in mats], 2 * m ** 3, 3 * 2 * m * m)
    for name, n in (("copy_256m", 1 << 27), ("add_256m", 1 << 27), ("add_1m", 1 << 19)):
        k = 3 if name.startswith("add") else 2
        bufs = pool(lambda n=n: [torch.randn(n, device=dev, dtype=bf16) for _ in range(k)], k * 2 * n)
        if name.startswith("copy"):
            fns = [lambda b=b: b[1].copy_(b[0]) for b in bufs]
        else:
            fns = [lambda b=b: torch.add(b[0], b[1], out=b[2]) for b in bufs]
        out[name] = (fns, n if k == 3 else 0, k * 2 * n)
    return out


def _spin(torch, stream, us: float, per_us: int) -> None:
    with torch.cuda.stream(stream):
        torch.cuda._sleep(int(us * per_us))


def _spin_rate(torch) -> int:
    """Cycles of torch.cuda._sleep per microsecond on this GPU."""
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    torch.cuda._sleep(10_000_000)
    b.record()
    b.synchronize()
    return max(1, int(10_000_000 / (a.elapsed_time(b) * 1e3)))


def _run(torch, plan: list, per_us: int) -> list[float]:
    """Launch each (stream, callables, count) of `plan` behind one spin, all streams together; per-launch ms each."""
    main = torch.cuda.current_stream()
    start = torch.cuda.Event()
    _spin(torch, main, 250_000, per_us)         # the host enqueues everything before the GPU starts
    start.record(main)
    spans = []
    for stream, fns, count in plan:
        stream.wait_event(start)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(stream):
            a.record()
            for i in range(count):
                fns[i % len(fns)]()
            b.record()
        spans.append((a, b, count))
    torch.cuda.synchronize()
    return [a.elapsed_time(b) / count for a, b, count in spans]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m phantora.probes.twostreamprobe", description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--window-ms", type=float, default=10.0)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)

    import torch
    if not torch.cuda.is_available():
        print("twostreamprobe: needs a CUDA GPU", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    kinds = _kinds(torch, dev, getattr(props, "L2_cache_size", 50 << 20))
    per_us = _spin_rate(torch)
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    for fns, _, _ in kinds.values():              # warm-up: cuBLAS handles and heuristics of both streams
        for s in (s1, s2):
            with torch.cuda.stream(s):
                fns[0]()
    torch.cuda.synchronize()

    alone, counts = {}, {}
    for name, (fns, _, _) in kinds.items():
        one = statistics.median(_run(torch, [(s1, fns, 8)], per_us)[0] for _ in range(3))
        counts[name] = min(4000, max(8, int(args.window_ms / one)))
        alone[name] = statistics.median(_run(torch, [(s1, fns, counts[name])], per_us)[0]
                                        for _ in range(args.repeats))
    slowdown: dict[str, dict[str, float]] = {a: {} for a in kinds}
    for a in kinds:
        for b in kinds:
            ratios_a = []
            cover = int(2.5 * counts[a] * alone[a] / alone[b]) + 1
            for _ in range(args.repeats):
                ta, _tb = _run(torch, [(s1, kinds[a][0], counts[a]), (s2, kinds[b][0], cover)], per_us)
                ratios_a.append(ta / alone[a])
            slowdown[a][b] = round(statistics.median(ratios_a), 4)
            print(f"{a:>10} beside {b:<10} x{slowdown[a][b]:.3f}  (runs {min(ratios_a):.3f}-{max(ratios_a):.3f})",
                  flush=True)
    result = {
        "gpu": torch.cuda.get_device_name(dev), "torch": torch.__version__, "time": time.strftime("%Y-%m-%d %H:%M"),
        "window_ms": args.window_ms, "repeats": args.repeats,
        "alone_ms": {k: round(v, 6) for k, v in alone.items()},
        "kinds": {k: {"flops": f, "bytes": n, "launches": counts[k]} for k, (_, f, n) in kinds.items()},
        "slowdown": slowdown,
    }
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result["alone_ms"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
