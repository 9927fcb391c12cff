"""For tests/test_live_run.py: how long copies between host and GPU hold the calling thread and the stream, pinned
and pageable, blocking and not (the same cases as phantora.probes.copyprobe measures on a GPU host). One JSON line:
per case, the time until copy_ returned and until the GPU was done; then the host's wait for a 1 MiB copy issued
behind a busy stream (GEMMs)."""
import json
import time

import torch

n = 256 * 2**20                                       # 1 GiB of fp32
gpu = torch.empty(n, device="cuda")
out = {}
for pinned in (True, False):
    host = torch.empty(n, pin_memory=pinned)
    for direction in ("h2d", "d2h"):
        dst, src = (gpu, host) if direction == "h2d" else (host, gpu)
        for nb in (False, True):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            dst.copy_(src, non_blocking=nb)
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            out[f"{direction}_{'pinned' if pinned else 'pageable'}_{'nb' if nb else 'blocking'}"] = [t1 - t0, t2 - t0]
a = torch.empty(8192, 8192, device="cuda", dtype=torch.bfloat16)
small = torch.empty(2**18, device="cuda")
for pinned in (True, False):
    host = torch.empty(2**18, pin_memory=pinned)
    for nb in (False, True):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(20):
            a @ a
        t1 = time.perf_counter()
        small.copy_(host, non_blocking=nb)
        t2 = time.perf_counter()
        torch.cuda.synchronize()
        t3 = time.perf_counter()
        out[f"busy_h2d_{'pinned' if pinned else 'pageable'}_{'nb' if nb else 'blocking'}"] = [t2 - t1, t3 - t1]
print("RESULT " + json.dumps(out), flush=True)
