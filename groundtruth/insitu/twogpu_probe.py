"""What slows one GPU's kernels when a second GPU works beside it (groundtruth/insitu/README.md).

Run on a host of 2 GPUs:  torchrun --standalone --nproc-per-node 2 groundtruth/insitu/twogpu_probe.py OUT.json
Rank 0 times the same kernels (a bf16 GEMM 8192^3, flash attention of an 8B layer, an HBM-bound add) with CUDA events
in four conditions, each for a few seconds with the GPUs warm:
  alone      rank 1 idle;
  busy       rank 1 runs GEMMs of its own (no communication: shared host, power delivery, cooling);
  nccl       rank 1 idle, and rank 0 runs an all-gather of 256 MiB in a loop with rank 1 on a side stream
             (rank 1 takes part), as FSDP's prefetch does;
  both       rank 1 runs GEMMs and the all-gather loop runs as in nccl.
The JSON holds, per condition and kernel, the median and p10/p90 of the kernel time in microseconds.
"""
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F


def main() -> None:
    out = sys.argv[1]
    rank = int(os.environ["RANK"])
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    dev = torch.device("cuda")
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    q = torch.randn(2, 32, 4096, 128, device=dev, dtype=torch.bfloat16)
    kv = torch.randn(2, 8, 4096, 128, device=dev, dtype=torch.bfloat16)
    x = torch.randn(1 << 28, device=dev, dtype=torch.bfloat16)
    shard = torch.randn(1 << 27, device=dev, dtype=torch.bfloat16)
    gathered = torch.empty(2 << 27, device=dev, dtype=torch.bfloat16)
    side = torch.cuda.Stream()
    kernels = {"gemm": lambda: a @ a,
               "attention": lambda: F.scaled_dot_product_attention(q, kv, kv, is_causal=True, enable_gqa=True),
               "add": lambda: x + x}
    results = {}
    for cond in ("alone", "busy", "nccl", "both", "alone_again"):
        comm = cond in ("nccl", "both")
        busy = cond in ("busy", "both")
        dist.barrier()
        torch.cuda.synchronize()
        times = {k: [] for k in kernels}
        t_end = time.time() + 4.0
        flag = torch.zeros(1, device=dev)
        while True:
            if comm:
                with torch.cuda.stream(side):
                    dist.all_gather_into_tensor(gathered, shard)
            if rank == 0:
                for name, fn in kernels.items():
                    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    s.record()
                    fn()
                    e.record()
                    times[name].append((s, e))
            elif busy:
                for _ in range(6):
                    a @ a
            # rank 0 decides when the condition ends; both ranks agree through a tiny all-reduce
            flag.fill_(1.0 if (rank == 0 and time.time() > t_end) else 0.0)
            dist.all_reduce(flag)
            if flag.item() > 0:
                break
        torch.cuda.synchronize()
        if rank == 0:
            results[cond] = {}
            for name, evs in times.items():
                us = sorted(s.elapsed_time(e) * 1e3 for s, e in evs[3:])
                results[cond][name] = {"n": len(us), "median_us": statistics.median(us),
                                       "p10_us": us[len(us) // 10], "p90_us": us[9 * len(us) // 10]}
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "results": results}, f, indent=1)
        for cond, r in results.items():
            print(cond, {k: round(v["median_us"], 1) for k, v in r.items()}, flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
