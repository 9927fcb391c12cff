"""Read and write rates of a host's storage through DeepSpeed's own async I/O handle, used as ZeRO-Infinity's
optimizer swapper uses it: one pinned host tensor per request (`async_pwrite` / `async_pread` of the whole tensor,
then `wait()`), DeepSpeed's default aio settings (1 MiB blocks, queue depth 8, single_submit false, overlap_events
true) and 1, 2, 4 and 8 I/O threads (`intra_op_parallelism`). Needs DeepSpeed with its async_io extension (libaio).
Writes JSON to $OUT/aio.json (or stdout).

    OUT=DIR python groundtruth/deepspeed/aio_bench.py [FOLDER] [GIB_PER_REQUEST] [REQUESTS]
"""
import os
import sys
import time

import torch
from deepspeed.ops.op_builder import AsyncIOBuilder
from storage_bench import emit          # this folder's storage benchmark (the script's folder is on sys.path)

FOLDER = sys.argv[1] if len(sys.argv) > 1 else "."
GIB = float(sys.argv[2]) if len(sys.argv) > 2 else 1.0
REQUESTS = int(sys.argv[3]) if len(sys.argv) > 3 else 3


def main() -> None:
    aio = AsyncIOBuilder().load()
    numel = int(GIB * (1 << 30)) // 4 // (1 << 20) * (1 << 20)
    out = {"gib_per_request": numel * 4 / (1 << 30), "requests": REQUESTS, "aio": {"block_size": 1 << 20,
           "queue_depth": 8, "single_submit": False, "overlap_events": True}, "points": []}
    os.makedirs(FOLDER, exist_ok=True)
    for threads in (1, 2, 4, 8):
        handle = aio.aio_handle(block_size=1 << 20, queue_depth=8, single_submit=False, overlap_events=True,
                                intra_op_parallelism=threads)
        buf = handle.new_cpu_locked_tensor(numel, torch.empty(0, dtype=torch.float32))
        buf.uniform_()
        paths = [os.path.join(FOLDER, f"aio_bench_{i}.swp") for i in range(REQUESTS)]
        writes, reads = [], []
        for p in paths:                       # written one after another, as the swapper writes m, v and the weights
            t0 = time.perf_counter()
            assert handle.async_pwrite(buf, p, 0) == 0
            assert handle.wait() == 1
            writes.append(buf.numel() * 4 / (time.perf_counter() - t0) / 1e9)
        for p in paths:                       # then read back, as at the next optimizer step
            t0 = time.perf_counter()
            assert handle.async_pread(buf, p, 0) == 0
            assert handle.wait() == 1
            reads.append(buf.numel() * 4 / (time.perf_counter() - t0) / 1e9)
        handle.free_cpu_locked_tensor(buf)
        for p in paths:
            os.remove(p)
        point = {"threads": threads, "write_gbps": [round(w, 3) for w in writes],
                 "read_gbps": [round(r, 3) for r in reads]}
        out["points"].append(point)
        print(point, flush=True)
    emit(out, "aio.json")


if __name__ == "__main__":
    main()
