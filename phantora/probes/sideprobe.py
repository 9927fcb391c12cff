"""Does a collective-like side load slow the compute beside it, and the compute after it?
`python -m phantora.probes.sideprobe --out OUT.json [--loads P:BURST_MS:PERIOD_MS,...] [--seconds 3]`

One GPU, two streams. The compute stream runs random 8192³ bf16 GEMMs back to back, each timed with CUDA events.
The side stream runs, once per period (launched by a host thread on time), a burst of memory copying on a fixed
number of SMs (a Triton kernel with one program per SM, as NCCL holds one CTA per channel): the load an FSDP step's
per-layer collectives put on a GPU, without the interconnect. Every GEMM is classified by its overlap
with the bursts: inside one (at least half its time), or clear of all of them. For each load the probe reports the
GEMM's mean time inside and outside the bursts against the same GEMM with no side load, the bursts' own bandwidth,
and the SM clock and board power sampled through NVML (phantora.probes.powerprobe).

A side load that only shares SMs and memory bandwidth slows the GEMMs inside its bursts; one that also draws power
under the board's limit makes the power controller lower the clock for everything, the GEMMs between bursts too.
Changes nothing on the GPU: limits and clocks are read, never set.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

from .powerprobe import NVML, Sampler

GEMM_N = 8192
LEAD = 48                # GEMMs the host queues ahead of the GPU (about 80 ms)
DEFAULT_LOADS = "24:5:30,24:10:30,8:10:30"


def _copy_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def copy(src, dst, n, BLOCK: tl.constexpr, PROGRAMS: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        for start in range(0, n, PROGRAMS * BLOCK):
            o = start + offs
            m = o < n
            tl.store(dst + o, tl.load(src + o, mask=m), mask=m)

    return copy


class SideLoad:
    """A copy on `programs` SMs of about `burst_ms`, calibrated on the idle GPU."""

    BLOCK = 4096

    def __init__(self, torch, programs: int, burst_ms: float):
        self.torch, self.programs, self.burst_ms = torch, programs, burst_ms
        self.kernel = _copy_kernel()
        n = 64 << 20                                            # elements (bf16): 128 MiB
        self.src = torch.empty(n, device="cuda", dtype=torch.bfloat16).normal_()
        self.dst = torch.empty_like(self.src)
        ms = self._time(n)
        self.n = max(self.BLOCK * programs, min(n, int(n * burst_ms / ms)))
        if self.n == n and ms < burst_ms:                       # the buffer is too small: copy it several times
            self.repeats = max(1, round(burst_ms / ms))
        else:
            self.repeats = 1
        self.nbytes = 2 * 2 * self.n * self.repeats             # read and written

    def launch(self, n: int | None = None) -> None:
        for _ in range(1 if n is not None else self.repeats):
            self.kernel[(self.programs,)](self.src, self.dst, n or self.n, BLOCK=self.BLOCK, PROGRAMS=self.programs,
                                          num_warps=8)

    def _time(self, n: int) -> float:
        torch = self.torch
        self.launch(n)
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(5):
            self.launch(n)
        b.record()
        torch.cuda.synchronize()
        return a.elapsed_time(b) / 5


def _overlap(s: float, e: float, bursts: list[tuple[float, float]]) -> float:
    return sum(max(0.0, min(e, c) - max(s, b)) for b, c in bursts if b < e and s < c)


def measure_load(nvml: NVML, sampler: Sampler, torch, load: SideLoad | None, period_ms: float,
                 seconds: float) -> dict:
    """GEMMs back to back for `seconds`, beside the side load once per `period_ms` (or alone)."""
    a = torch.randn(GEMM_N, GEMM_N, device="cuda", dtype=torch.bfloat16)
    b = torch.randn_like(a)
    c = torch.empty_like(a)
    # FSDP2 puts its collectives on high-priority streams: their CTAs take the SMs GEMM CTAs leave first
    gemm_stream, side_stream = torch.cuda.Stream(), torch.cuda.Stream(priority=-1)
    ev = lambda: torch.cuda.Event(enable_timing=True)   # noqa: E731
    # settle: the power controller reaches its steady clock for this load
    t_end = time.perf_counter() + 1.0
    while time.perf_counter() < t_end:
        with torch.cuda.stream(gemm_stream):
            for _ in range(8):
                torch.mm(a, b, out=c)
        torch.cuda.synchronize()
    periods = max(1, int(seconds * 1e3 / period_ms))
    base = ev()
    gemms, bursts = [], []
    e0, t0 = nvml.energy_mj(), time.perf_counter()
    with torch.cuda.stream(gemm_stream):
        base.record()
    side_stream.wait_stream(gemm_stream)
    side_done = threading.Event()

    def side_loop():            # a burst every period, launched by the host (a spinning kernel would hold an SM)
        try:
            t_next = time.perf_counter()
            with torch.cuda.stream(side_stream):
                for _ in range(periods):
                    s, e = ev(), ev()
                    s.record()
                    load.launch()
                    e.record()
                    bursts.append((s, e))
                    t_next += period_ms * 1e-3
                    time.sleep(max(0.0, t_next - time.perf_counter()))
                bursts[-1][1].synchronize()
        finally:
            side_done.set()

    side = None
    if load is not None:
        side = threading.Thread(target=side_loop, daemon=True)
        side.start()
    # GEMMs back to back until the side load is over (or for `seconds`): the host keeps the stream fed
    t_stop = time.perf_counter() + seconds
    with torch.cuda.stream(gemm_stream):
        while True:
            if len(gemms) >= LEAD:
                gemms[-LEAD][1].synchronize()       # the host stays LEAD GEMMs ahead, not more
            for _ in range(8):
                s, e = ev(), ev()
                s.record()
                torch.mm(a, b, out=c)
                e.record()
                gemms.append((s, e))
            over = side_done.is_set() if side is not None else time.perf_counter() >= t_stop
            if over:
                break
    t1, e1 = time.perf_counter(), nvml.energy_mj()
    torch.cuda.synchronize()
    g = [(base.elapsed_time(s), base.elapsed_time(e)) for s, e in gemms]
    w = [(base.elapsed_time(s), base.elapsed_time(e)) for s, e in bursts]
    end = min(g[-1][1], w[-1][1]) if w else g[-1][1]
    g = [x for x in g if x[1] <= end]                       # only while the side load still ran
    inside = [e - s for s, e in g if _overlap(s, e, w) >= 0.5 * (e - s)]
    outside = [e - s for s, e in g if _overlap(s, e, w) == 0.0]
    rec = {"gemm_ms": statistics.fmean(e - s for s, e in g), "gemms": len(g),
           "gemm_inside_ms": statistics.fmean(inside) if inside else None, "gemms_inside": len(inside),
           "gemm_outside_ms": statistics.fmean(outside) if outside else None, "gemms_outside": len(outside),
           "power_w": (e1 - e0) / 1000.0 / (t1 - t0), "seconds": t1 - t0, "temperature_c": nvml.temperature_c()}
    if w:
        busy = sum(e - s for s, e in w)
        rec.update({"side_duty": busy / (w[-1][1] - w[0][0]), "side_burst_ms": busy / len(w),
                    "side_gbyte_per_s": load.nbytes / (busy / len(w) * 1e-3) / 1e9, "side_programs": load.programs,
                    "period_ms": (w[-1][0] - w[0][0]) / max(1, len(w) - 1)})
    rec.update(sampler.window(t0, t1))
    return rec


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="JSON file for the results")
    p.add_argument("--loads", default=DEFAULT_LOADS, metavar="P:BURST_MS:PERIOD_MS,...",
                   help=f"side loads: P programs (SMs) copying for BURST_MS every PERIOD_MS (default {DEFAULT_LOADS})")
    p.add_argument("--seconds", type=float, default=3.0, help="measured seconds per load")
    args = p.parse_args(argv)
    import torch

    nvml = NVML(0)
    sampler = Sampler(nvml)
    sampler.start()
    info = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "power_limit_w": nvml.limit_w(),
            "command": " ".join(["python", "-m", "phantora.probes.sideprobe"] + (argv or sys.argv[1:]))}
    print(json.dumps(info), flush=True)
    results = []
    loads = [tuple(float(x) for x in spec.split(":")) for spec in args.loads.split(",") if spec]
    runs = [("alone", None, 30.0)] + [(f"side_p{int(pr)}_{bm:g}of{pm:g}ms", (int(pr), bm), pm) for pr, bm, pm in loads]
    runs.append(("alone_again", None, 30.0))              # the GPU's drift over the session
    for name, spec, period in runs:
        load = SideLoad(torch, *spec) if spec else None
        rec = {"probe": name, **measure_load(nvml, sampler, torch, load, period, args.seconds)}
        results.append(rec)
        print(json.dumps(rec), flush=True)
        del load
        torch.cuda.empty_cache()
        time.sleep(1.0)
    sampler.stop()
    Path(args.out).write_text(json.dumps({"info": info, "probes": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
