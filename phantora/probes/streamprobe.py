"""How long a kernel holds a busy stream, against what the profile's CUDA events say it takes (device tool).

    python -m phantora.probes.streamprobe --out OUT.json [--launches 256]

The profile databases time each kernel alone between two CUDA events, after an L2 flush and a spin
(phantora/costmodel/measure.py, `time_on_gpu`). In a training step most kernels run back to back on a stream whose
queue the host keeps full; what a kernel adds to that stream is its own time and the GPU's gap before the next one.
For kernels from a one-element fill to multi-millisecond GEMMs this probe measures, on one GPU:

- `profile_us`: the profile's way (median over timed runs);
- `stream_us`: one of `--launches` launches enqueued while the GPU spins, then run back to back (CUDA events around
  the whole batch, divided by the number of launches; median of 5 batches). Consecutive launches read different
  inputs from a pool larger than the L2, so no launch finds its inputs in the L2 that the one before left;
- `kernel_us` and `gap_us`: the medians of the batch's kernel durations and of the gaps between them, as
  torch.profiler (CUPTI) records them.

`profile_us - stream_us` is what the profile's events add to a kernel on a busy stream. The cost model subtracts it
from every event-timed cost (the GPU preset's `event_overhead_us`, docs/cost-model.md). Nothing is changed on the
GPU (no clock or power setting).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time


def _cases(torch, dev, l2_bytes: int):
    """name -> list of callables: each launches one kernel, on inputs that rotate through a pool beyond the L2."""
    bf16 = torch.bfloat16
    pool_bytes = 3 * max(l2_bytes, 50 << 20)
    out = {}

    def pool(make, nbytes):
        k = max(1, min(64, -(-pool_bytes // max(nbytes, 1))))
        return [make() for _ in range(k)]

    one = torch.zeros(1, device=dev)
    out["fill_1"] = [lambda: one.fill_(1.0)]
    for n in (1 << 10, 1 << 16, 1 << 20, 1 << 22, 1 << 24):
        pairs = pool(lambda n=n: (torch.randn(n, device=dev, dtype=bf16), torch.randn(n, device=dev, dtype=bf16),
                                  torch.empty(n, device=dev, dtype=bf16)), 3 * 2 * n)
        out[f"add_bf16_{n}"] = [lambda p=p: torch.add(p[0], p[1], out=p[2]) for p in pairs]
    for n in (1 << 20, 1 << 24):
        xs = pool(lambda n=n: (torch.randn(n // 2048, 2048, device=dev, dtype=bf16),
                               torch.empty(n // 2048, 2048, device=dev, dtype=bf16)), 2 * 2 * n)
        out[f"softmax_bf16_{n}"] = [lambda p=p: torch.softmax(p[0], -1) for p in xs]
    for m in (256, 1024, 2048, 4096, 8192):
        mats = pool(lambda m=m: (torch.randn(m, m, device=dev, dtype=bf16), torch.randn(m, m, device=dev, dtype=bf16),
                                 torch.empty(m, m, device=dev, dtype=bf16)), 3 * 2 * m * m)
        out[f"mm_bf16_{m}"] = [lambda p=p: torch.mm(p[0], p[1], out=p[2]) for p in mats]
    return out


def _stream_us(torch, dev, fns, launches: int, spin_per_us: int) -> tuple[float, float]:
    """(per-launch time of a back-to-back batch, host time to enqueue it in µs)."""
    for f in fns:
        f()
    torch.cuda.synchronize(dev)
    h0 = time.perf_counter()
    for i in range(launches):
        fns[i % len(fns)]()
    host_us = (time.perf_counter() - h0) * 1e6
    torch.cuda.synchronize(dev)
    spin = int(spin_per_us * (2.0 * host_us + 1000.0))
    got = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(spin)
        a.record()
        for i in range(launches):
            fns[i % len(fns)]()
        b.record()
        torch.cuda.synchronize(dev)
        got.append(a.elapsed_time(b) * 1000.0 / launches)
    return statistics.median(got), host_us


def _cupti(torch, dev, fns, launches: int, spin: int) -> tuple[float, float, int]:
    """(median kernel duration, median gap between consecutive kernels, kernels seen) of one batch, by CUPTI."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        torch.cuda._sleep(spin)
        for i in range(launches):
            fns[i % len(fns)]()
        torch.cuda.synchronize(dev)
    ev = [e for e in prof.events() if getattr(e, "device_type", None) is not None
          and str(e.device_type).endswith("CUDA") and "sleep" not in e.name.lower() and "spin" not in e.name.lower()
          and not e.name.lower().startswith(("memcpy", "memset"))]
    iv = sorted((e.time_range.start, e.time_range.end) for e in ev)
    if len(iv) < 2:
        return float("nan"), float("nan"), len(iv)
    durs = [e - s for s, e in iv]
    gaps = [iv[i + 1][0] - iv[i][1] for i in range(len(iv) - 1)]
    return statistics.median(durs), statistics.median(gaps), len(iv)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--launches", type=int, default=256)
    a = p.parse_args(argv)

    import torch

    from ..costmodel.measure import _SPIN_CYCLES_PER_US, require_cuda, time_on_gpu

    require_cuda()
    dev = torch.device("cuda", torch.cuda.current_device())
    props = torch.cuda.get_device_properties(dev)
    rows = {}
    print(f"# {props.name}, torch {torch.__version__}; µs per kernel", file=sys.stderr)
    print(f"{'kernel':18s} {'profile':>9s} {'noflush':>9s} {'stream':>9s} {'cupti':>9s} {'gap':>6s} "
          f"{'profile-stream':>14s}")
    with torch.no_grad():
        for name, fns in _cases(torch, dev, int(getattr(props, "L2_cache_size", 0) or 0)).items():
            prof_us = statistics.median(time_on_gpu(fns[0], dev, 30))
            noflush_us = statistics.median(time_on_gpu(fns[0], dev, 30, flush_l2=False))
            stream_us, host_us = _stream_us(torch, dev, fns, a.launches, _SPIN_CYCLES_PER_US)
            k_us, gap_us, seen = _cupti(torch, dev, fns, a.launches,
                                        int(_SPIN_CYCLES_PER_US * (2.0 * host_us + 1000.0)))
            rows[name] = {"profile_us": prof_us, "profile_noflush_us": noflush_us, "stream_us": stream_us,
                          "kernel_us": k_us, "gap_us": gap_us, "kernels_seen": seen, "pool": len(fns),
                          "host_enqueue_us": host_us / a.launches}
            print(f"{name:18s} {prof_us:9.2f} {noflush_us:9.2f} {stream_us:9.2f} {k_us:9.2f} {gap_us:6.2f} "
                  f"{prof_us - stream_us:14.2f}", flush=True)
    small = [r["profile_us"] - r["stream_us"] for r in rows.values() if r["stream_us"] < 50.0]
    out = {"device": props.name, "torch": torch.__version__, "cuda": torch.version.cuda, "launches": a.launches,
           "kernels": rows, "event_overhead_us_median_small": statistics.median(small) if small else None,
           "command": "python -m phantora.probes.streamprobe " + " ".join(argv if argv is not None else sys.argv[1:])}
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
    print(f"# profile - stream, kernels under 50 µs on a stream: median {out['event_overhead_us_median_small']:.2f} µs")


if __name__ == "__main__":
    main()
