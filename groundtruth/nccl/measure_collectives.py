"""Measure NCCL collectives through torch.distributed the way nccl-tests does, for Phantora's network calibration.

Run one process per GPU with torchrun, e.g.::

    torchrun --nproc-per-node 2 groundtruth/nccl/measure_collectives.py --out results/

For every op and size (1 KiB .. 1 GiB by default, step x2) it runs warm-up iterations, then many back-to-back
iterations timed with CUDA events on the current stream (out-of-place buffers), and reports the mean time per
iteration (the slowest rank's), algbw = size / time and busbw = algbw x nccl-tests' bus factor
(nccl-tests doc/PERFORMANCE.md). Sizes follow nccl-tests: the all_reduce buffer, the gathered output of all_gather,
the input of reduce_scatter, the send buffer of all_to_all, the message of send/recv.

Ops:
- all_reduce (sum), all_gather (all_gather_into_tensor), reduce_scatter (reduce_scatter_tensor, sum),
  all_to_all (all_to_all_single);
- sendrecv: nccl-tests' sendrecv, every rank sends to the next rank and receives from the previous one at once
  (batch_isend_irecv), bus factor 1;
- send_recv: one direction only, rank 0 sends to the last rank, the others idle, bus factor 1;
- all_to_all_skew<H> (H = 2, 4, 8): all_to_all_single with uneven split sizes, as an expert-parallel dispatch with
  one hot expert rank: every rank sends rank 0 H units of its send buffer and every other rank 1 unit (the size
  is the send buffer, as for all_to_all; bus factor (n-1)/n of that size, for comparison only).

`--graph` captures the timed iterations in a CUDA graph, which removes PyTorch's per-call host overhead (the time is
then the GPU's alone). `--probe` runs each op once per size and nothing else (for NCCL_DEBUG=INFO logs of NCCL's
choices). Writes `<op>.csv` (with `# key: value` header lines) and `<op>.json` (meta + rows) per op, and `meta.json`.
`--backend gloo --device cpu` runs the same code on CPU (for checking the script, not for measurement).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import socket
import subprocess
import sys
import time
import warnings

import torch
import torch.distributed as dist

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "sendrecv", "send_recv", "all_to_all_skew2",
       "all_to_all_skew4", "all_to_all_skew8")
SKEW_PREFIX = "all_to_all_skew"


def busbw_factor(op: str, n: int) -> float:
    """nccl-tests' busbw / algbw (doc/PERFORMANCE.md)."""
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all") or op.startswith(SKEW_PREFIX):
        return (n - 1) / n
    return 1.0


def parse_size(text: str) -> int:
    text = text.strip().upper()
    mult = {"K": 2**10, "M": 2**20, "G": 2**30}
    if text and text[-1] in mult:
        return int(float(text[:-1]) * mult[text[-1]])
    return int(text)


def size_list(lo: int, hi: int, factor: int) -> list[int]:
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= factor
    return out


def shell(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        return f"unavailable: {exc}"


def collect_meta(args, world: int, device: torch.device) -> dict:
    meta = {
        "host": socket.gethostname(),
        "world_size": world,
        "backend": args.backend,
        "mode": "graph" if args.graph else ("probe" if args.probe else "eager"),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "dtype": "float32",
        "warmup_iters": args.warmup,
        "target_ms_per_size": args.target_ms,
        "min_iters": args.min_iters,
        "max_iters": args.max_iters,
        "time": "mean per iteration over back-to-back iterations, CUDA events on the current stream; the slowest rank",
        "nccl_env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(("NCCL_", "TORCH_NCCL", "TORCH_SYMM"))},
        "argv": sys.argv,
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if device.type == "cuda":
        meta["gpu"] = torch.cuda.get_device_name(device)
        meta["cuda_runtime"] = torch.version.cuda
        v = torch.cuda.nccl.version()
        meta["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        meta["driver"] = shell(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]).splitlines()[:1]
        meta["driver"] = meta["driver"][0] if meta["driver"] else "unknown"
        meta["nvidia_smi_topo"] = shell(["nvidia-smi", "topo", "-m"])
        meta["nvlink_status"] = shell(["nvidia-smi", "nvlink", "-s", "-i", "0"])
        props = torch.cuda.get_device_properties(device)
        meta["sm_count"] = props.multi_processor_count
        meta["capability"] = f"{props.major}.{props.minor}"
    return meta


class Bench:
    """Buffers and one callable per op for one size."""

    def __init__(self, op: str, size: int, rank: int, world: int, device: torch.device):
        self.op, self.size, self.rank, self.world = op, size, rank, world
        numel = max(size // 4, world)
        numel -= numel % world
        self.numel = numel
        f = dict(dtype=torch.float32, device=device)
        if op == "all_reduce":
            self.inp, self.out = torch.ones(numel, **f), torch.zeros(numel, **f)
        elif op == "all_gather":
            self.inp, self.out = torch.ones(numel // world, **f), torch.empty(numel, **f)
        elif op == "reduce_scatter":
            self.inp, self.out = torch.ones(numel, **f), torch.empty(numel // world, **f)
        elif op.startswith(SKEW_PREFIX):
            hot = int(op[len(SKEW_PREFIX):])
            unit = max(64, numel // (hot + world - 1) // 64 * 64)     # chunks 256-byte aligned, as NCCL wants
            self.in_splits = [hot * unit] + [unit] * (world - 1)
            self.out_splits = [self.in_splits[rank]] * world
            self.numel = sum(self.in_splits)
            self.inp, self.out = torch.ones(self.numel, **f), torch.empty(sum(self.out_splits), **f)
        else:
            self.inp, self.out = torch.ones(numel, **f), torch.empty(numel, **f)

    def __call__(self) -> None:
        op = self.op
        if op == "all_reduce":
            # torch reduces in place; in- and out-of-place times agree in nccl-tests. Zeros keep the sums finite.
            dist.all_reduce(self.out)
        elif op == "all_gather":
            dist.all_gather_into_tensor(self.out, self.inp)
        elif op == "reduce_scatter":
            dist.reduce_scatter_tensor(self.out, self.inp)
        elif op == "all_to_all":
            dist.all_to_all_single(self.out, self.inp)
        elif op.startswith(SKEW_PREFIX):
            dist.all_to_all_single(self.out, self.inp, self.out_splits, self.in_splits)
        elif op == "sendrecv":
            nxt, prv = (self.rank + 1) % self.world, (self.rank - 1) % self.world
            reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, self.inp, nxt), dist.P2POp(dist.irecv, self.out, prv)])
            for r in reqs:
                r.wait()
        elif op == "send_recv":
            last = self.world - 1
            if self.rank == 0:
                dist.send(self.inp, last)
            elif self.rank == last:
                dist.recv(self.out, 0)
        else:
            raise ValueError(op)


class Timer:
    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def start(self):
        if self.cuda:
            self.e0, self.e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self.e0.record()
        else:
            self.t0 = time.perf_counter()

    def stop(self) -> float:
        """Seconds since start, after the work queued in between has finished."""
        if self.cuda:
            self.e1.record()
            self.e1.synchronize()
            return self.e0.elapsed_time(self.e1) * 1e-3
        return time.perf_counter() - self.t0


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def choose_iters(b: Bench, timer: Timer, device, args) -> int:
    """Iterations so that the timed loop lasts about target_ms, agreed on by all ranks (the max)."""
    timer.start()
    for _ in range(3):
        b()
    est = timer.stop() / 3
    t = torch.tensor([est], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    est = max(float(t.item()), 1e-7)
    return int(min(args.max_iters, max(args.min_iters, args.target_ms * 1e-3 / est)))


def time_eager(b: Bench, iters: int, timer: Timer, device) -> float:
    dist.barrier()
    sync(device)
    timer.start()
    for _ in range(iters):
        b()
    return timer.stop() / iters


def time_graph(b: Bench, iters: int, timer: Timer, device) -> float:
    """Capture `per` calls in a CUDA graph and replay it; seconds per call."""
    per = max(1, min(iters, 100))
    reps = max(1, iters // per)
    s = torch.cuda.Stream(device)
    s.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(s):
        for _ in range(2):
            b()
    torch.cuda.current_stream(device).wait_stream(s)
    sync(device)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(per):
            b()
    g.replay()
    sync(device)
    dist.barrier()
    sync(device)
    timer.start()
    for _ in range(reps):
        g.replay()
    t = timer.stop() / (reps * per)
    del g
    return t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder for the result files (rank 0 writes)")
    ap.add_argument("--ops", default=",".join(OPS), help=f"comma-separated subset of {','.join(OPS)}")
    ap.add_argument("-b", "--min-bytes", default="1K")
    ap.add_argument("-e", "--max-bytes", default="1G")
    ap.add_argument("-f", "--step-factor", type=int, default=2)
    ap.add_argument("-w", "--warmup", type=int, default=5)
    ap.add_argument("--target-ms", type=float, default=60.0, help="length of each timed loop")
    ap.add_argument("--min-iters", type=int, default=5)
    ap.add_argument("--max-iters", type=int, default=500)
    ap.add_argument("--graph", action="store_true", help="time CUDA-graph replays (no host launch overhead)")
    ap.add_argument("--probe", action="store_true", help="one call per op and size, no timing (for NCCL logs)")
    ap.add_argument("--backend", default="nccl")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    args = ap.parse_args()
    warnings.filterwarnings("ignore", category=FutureWarning)  # *_tensor collectives renamed in newer torch

    local = int(os.environ.get("LOCAL_RANK", "0"))
    if args.device == "cuda":
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
        dist.init_process_group(args.backend, device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    if world < 2:
        raise SystemExit("needs at least 2 ranks (torchrun --nproc-per-node N, N >= 2)")
    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    for o in ops:
        if o not in OPS:
            raise SystemExit(f"unknown op {o!r}; choose from {', '.join(OPS)}")
    sizes = size_list(parse_size(args.min_bytes), parse_size(args.max_bytes), args.step_factor)
    meta = collect_meta(args, world, device)
    timer = Timer(device)
    if rank == 0:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "meta.json"), "w") as fh:
            json.dump(meta, fh, indent=1)
        print(f"# {meta.get('gpu', 'cpu')} x{world}, torch {meta['torch']}, NCCL {meta.get('nccl', '-')}, "
              f"driver {meta.get('driver', '-')}, mode {meta['mode']}", flush=True)
    for op in ops:
        rows = []
        if rank == 0:
            print(f"# {op}\n# {'size':>11} {'iters':>6} {'time_us':>11} {'algbw':>8} {'busbw':>8}", flush=True)
        for size in sizes:
            b = Bench(op, size, rank, world, device)
            nbytes = b.numel * 4
            for _ in range(args.warmup if not args.probe else 1):
                b()
            sync(device)
            if args.probe:
                dist.barrier()
                continue
            iters = choose_iters(b, timer, device, args)
            t = (time_graph if args.graph else time_eager)(b, iters, timer, device)
            tt = torch.tensor([t], dtype=torch.float64, device=device)
            gathered = [torch.zeros_like(tt) for _ in range(world)]
            dist.all_gather(gathered, tt)
            per_rank = [float(x.item()) for x in gathered]
            tmax = max(per_rank)
            algbw = nbytes / tmax / 1e9
            row = {"size_bytes": nbytes, "count": b.numel, "iters": iters, "time_us": tmax * 1e6,
                   "algbw_gbs": algbw, "busbw_gbs": algbw * busbw_factor(op, world),
                   "time_us_min_rank": min(per_rank) * 1e6}
            rows.append(row)
            if rank == 0:
                print(f"  {nbytes:>11} {iters:>6} {row['time_us']:>11.2f} {algbw:>8.2f} {row['busbw_gbs']:>8.2f}",
                      flush=True)
            del b
        if rank == 0 and rows:
            op_meta = dict(meta, op=op, busbw_factor=busbw_factor(op, world))
            op_meta.pop("nvidia_smi_topo", None)
            op_meta.pop("nvlink_status", None)
            with open(os.path.join(args.out, f"{op}.json"), "w") as fh:
                json.dump({"meta": op_meta, "rows": rows}, fh, indent=1)
            with open(os.path.join(args.out, f"{op}.csv"), "w", newline="") as fh:
                for k in ("op", "gpu", "world_size", "driver", "nccl", "torch", "cuda_runtime", "mode", "dtype",
                          "busbw_factor", "nccl_env", "date_utc"):
                    if k in op_meta:
                        fh.write(f"# {k}: {json.dumps(op_meta[k]) if isinstance(op_meta[k], dict) else op_meta[k]}\n")
                w = csv.DictWriter(fh, fieldnames=list(rows[0]))
                w.writeheader()
                w.writerows(rows)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
