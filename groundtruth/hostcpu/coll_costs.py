"""What a collective and FSDP2's copy ops cost the host: loops timed on a two-GPU host and under `phantora run`.

The companion of op_costs.py for the ops FSDP2 adds to a step: each case is a loop, on every rank, that issues one
op on tiny CUDA tensors (an asynchronous all-reduce, all-gather and reduce-scatter through the process group, a
functional all-reduce and its wait as DTensor issues them, `torch._chunk_cat` as FSDP2's reduce-scatter copy-in
calls it, `torch.split_with_sizes_copy` as its all-gather copy-out does, and an element-wise add for reference).
Each case's time per op is the median of repeats of `time.perf_counter` around the loop alone, the GPU idle
before it (a collective's kernels may take longer than its issue: the host's time is what is measured, not the
GPU's); rank 0 writes the result. Under `phantora run` the clock is the rank's simulated one.

    torchrun --standalone --nproc-per-node 2 groundtruth/hostcpu/coll_costs.py OUT.json       # on a GPU host
    phantora run --gpus-per-node 2 --quiet --no-trace -- python groundtruth/hostcpu/coll_costs.py SIM.json
    python groundtruth/hostcpu/op_costs.py --compare OUT.json SIM.json                         # side by side

`coll_costs.py OUT.json NUMEL` issues the same ops on tensors of NUMEL elements (256 by default; the nine
gradients and the split's nine outputs NUMEL / 9 elements each, rounded): whether an op's host time grows with its
size.
"""

from __future__ import annotations

import json
import os
import statistics
import sys

import time

from op_costs import REPEATS      # this folder's (the script's own folder is on sys.path)

N = 200              # ops per timed loop


def _cases(numel: int = 256) -> dict:
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    dev = "cuda"
    world = dist.get_world_size()
    x = torch.ones(numel, device=dev)
    y = torch.ones(numel, device=dev)
    gathered = torch.empty(numel * world, device=dev)
    scattered = torch.empty(numel // world, device=dev)
    rows = max(1, numel // (9 * 32 * world)) * world if numel > 256 else 64
    grads = [torch.ones(rows, 32, device=dev) for _ in range(9)]         # nine gradients, as a block's
    rs_input = torch.empty(world, 9 * rows * 32 // world, device=dev)
    sizes = [max(1, numel // 9) if numel > 256 else 512] * 9
    flat = torch.ones(sum(sizes), device=dev)
    outs = [torch.empty(512, device=dev) for _ in sizes]
    group = dist.group.WORLD

    def add(n):
        for _ in range(n):
            torch.add(x, y, out=x)

    def all_reduce(n):
        for _ in range(n):
            dist.all_reduce(x, async_op=True)

    def all_gather_into_tensor(n):
        for _ in range(n):
            dist.all_gather_into_tensor(gathered, x, async_op=True)

    def reduce_scatter_tensor(n):
        for _ in range(n):
            dist.reduce_scatter_tensor(scattered, x, async_op=True)

    def funcol_all_reduce(n):
        for _ in range(n):
            funcol.wait_tensor(funcol.all_reduce(x, "sum", group))

    def chunk_cat9(n):
        for _ in range(n):
            torch._chunk_cat(grads, dim=0, num_chunks=world, out=rs_input)

    def split_with_sizes_copy9(n):
        for _ in range(n):
            torch.split_with_sizes_copy(flat, sizes, dim=0, out=outs)

    return {f.__name__: f for f in (add, all_reduce, all_gather_into_tensor, reduce_scatter_tensor,
                                    funcol_all_reduce, chunk_cat9, split_with_sizes_copy9)}


def _time(fn, n: int) -> float:
    import torch
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn(n)
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n


def measure(numel: int = 256) -> dict:
    import torch
    import torch.distributed as dist
    from conversions_bench import cpu_model

    out = {}
    for name, fn in _cases(numel).items():
        _time(fn, N)
        dist.barrier()
        times = [_time(fn, N) for _ in range(REPEATS)]
        out[name] = {"us_per_op": statistics.median(times) * 1e6, "min_us": min(times) * 1e6,
                     "max_us": max(times) * 1e6, "ops": N, "repeats": REPEATS}
        if dist.get_rank() == 0:
            print(f"{name:24s} {out[name]['us_per_op']:8.2f} us per op", flush=True)
    return {"cases": out, "torch": torch.__version__, "python": sys.version.split()[0],
            "gpu": torch.cuda.get_device_name(0), "cpu": cpu_model(), "world_size": dist.get_world_size(),
            "numel": numel}


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    import torch
    import torch.distributed as dist
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl")
    result = measure(int(sys.argv[2]) if len(sys.argv) == 3 else 256)
    if dist.get_rank() == 0:
        with open(sys.argv[1], "w") as f:
            json.dump(result, f, indent=1)
    dist.destroy_process_group()
