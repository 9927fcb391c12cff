"""What a copy between host and GPU costs the host and the stream, pinned and pageable (device tool).

    python -m phantora.probes.copyprobe --out OUT.json [--repeats 7]

For each direction (host to device, device to host), host memory (pinned by `pin_memory=True`, or pageable),
`copy_(src, non_blocking=...)` and size (64 KiB to 1 GiB), on one GPU and with the GPU idle first:

- `return_ms`: how long `copy_` held the calling thread (a blocking copy waits for its stream; a non-blocking one
  from or to pageable memory is staged by the driver and holds the thread too);
- `done_ms`: until the stream had finished it (`torch.cuda.synchronize()` after the call);
- `gbps`: bytes over `done_ms`.

Then what a blocking and a non-blocking copy of 1 MiB each make the host wait when the stream is busy with a
`busy_ms` kernel (a spin) enqueued before them (`after_busy_*`): a blocking copy waits for the stream's earlier work
(PyTorch synchronizes the stream after a blocking copy), a non-blocking pinned one does not. Medians of `--repeats`
runs after one warm-up. Nothing is changed on the GPU (no clock or power setting).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

SIZES = (64 << 10, 1 << 20, 16 << 20, 256 << 20, 1 << 30)


def _time(torch, fn, repeats: int) -> tuple[float, float]:
    """(median seconds until `fn` returns, median seconds until the GPU is done), after one warm-up."""
    back, done = [], []
    for i in range(repeats + 1):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        if i:
            back.append(t1 - t0)
            done.append(t2 - t0)
    return statistics.median(back), statistics.median(done)


def measure(repeats: int = 7, busy_ms: float = 50.0) -> dict:
    import torch
    dev = torch.device("cuda")
    rows = []
    for nbytes in SIZES:
        n = nbytes // 4
        gpu = torch.empty(n, device=dev)
        for pinned in (True, False):
            host = torch.empty(n, pin_memory=pinned)
            for direction in ("h2d", "d2h"):
                dst, src = (gpu, host) if direction == "h2d" else (host, gpu)
                for non_blocking in (False, True):
                    back, done = _time(torch, lambda: dst.copy_(src, non_blocking=non_blocking), repeats)
                    rows.append({"direction": direction, "pinned": pinned, "non_blocking": non_blocking,
                                 "bytes": nbytes, "return_ms": back * 1e3, "done_ms": done * 1e3,
                                 "gbps": nbytes / done / 1e9})
                    print(f"{direction} {'pinned  ' if pinned else 'pageable'} "
                          f"{'non_blocking' if non_blocking else 'blocking    '} {nbytes:>11,d} B  returns "
                          f"{back * 1e3:9.3f} ms  done {done * 1e3:9.3f} ms  {nbytes / done / 1e9:6.2f} GB/s",
                          flush=True)
        del gpu
    # the host's wait behind a busy stream
    khz = getattr(torch.cuda.get_device_properties(0), "clock_rate", 0) or 1_980_000   # SM clock, kHz
    cycles = int(busy_ms * 1e-3 * khz * 1e3)
    gpu = torch.empty((1 << 20) // 4, device=dev)
    busy = {}
    for pinned in (True, False):
        host = torch.empty(gpu.numel(), pin_memory=pinned)
        for direction in ("h2d", "d2h"):
            dst, src = (gpu, host) if direction == "h2d" else (host, gpu)
            for non_blocking in (False, True):
                def fn():
                    torch.cuda._sleep(cycles)
                    dst.copy_(src, non_blocking=non_blocking)
                back, done = _time(torch, fn, repeats)
                key = f"after_busy_{direction}_{'pinned' if pinned else 'pageable'}_" \
                      f"{'non_blocking' if non_blocking else 'blocking'}"
                busy[key] = {"return_ms": back * 1e3, "done_ms": done * 1e3}
                print(f"{key:45s} returns {back * 1e3:8.3f} ms  done {done * 1e3:8.3f} ms", flush=True)
    return {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "repeats": repeats,
            "busy_ms": busy_ms, "copies": rows, "behind_busy_stream": busy}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m phantora.probes.copyprobe", description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args(argv)
    try:
        import torch
        if not torch.cuda.is_available():
            print("copyprobe: no CUDA GPU here (it measures a real one)", file=sys.stderr)
            return 2
    except ImportError:
        print("copyprobe: torch is not installed", file=sys.stderr)
        return 2
    result = measure(args.repeats)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
