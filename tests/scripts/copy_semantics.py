"""For tests/test_live_run.py: how long copies between host and GPU hold the calling thread and the stream, pinned
and pageable, blocking and not (the same cases as phantora.probes.copyprobe measures on a GPU host). One JSON line:
per case, the time until copy_ returned and until the GPU was done; then the host's wait for a 1 MiB copy issued
behind a busy stream (GEMMs)."""
import json
import time

import torch

def timed(dst, src, nb, before=None):
    """(seconds until copy_ returned, until the GPU was done), from after `before` (work queued first) returned."""
    torch.cuda.synchronize()
    if before is not None:
        before()
    t0 = time.perf_counter()
    dst.copy_(src, non_blocking=nb)
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return [t1 - t0, time.perf_counter() - t0]


def label(pinned, nb):
    return f"{'pinned' if pinned else 'pageable'}_{'nb' if nb else 'blocking'}"


n = 256 * 2**20                                       # 1 GiB of fp32
gpu = torch.empty(n, device="cuda")
a = torch.empty(8192, 8192, device="cuda", dtype=torch.bfloat16)
dev_small = torch.empty(2**18, device="cuda")
out = {}
for pinned in (True, False):
    host, small_host = torch.empty(n, pin_memory=pinned), torch.empty(2**18, pin_memory=pinned)
    for nb in (False, True):
        out[f"h2d_{label(pinned, nb)}"] = timed(gpu, host, nb)
        out[f"d2h_{label(pinned, nb)}"] = timed(host, gpu, nb)
        # behind a busy stream: 20 GEMMs queued first
        out[f"busy_h2d_{label(pinned, nb)}"] = timed(dev_small, small_host, nb, lambda: [a @ a for _ in range(20)])
big = torch.empty(1 << 20, pin_memory=True)         # views and .data of pinned memory are pinned (one storage)
out["pinned_views"] = [big[10:20].is_pinned(), big.data.is_pinned(), big.view(2, -1).is_pinned(),
                       torch.empty(4).is_pinned()]
small = torch.tensor([1.0, 2.0, 3.0]).pin_memory()  # a pinned copy keeps the known value
out["small_pinned"] = [small.tolist(), small.cuda(non_blocking=True).tolist()]
print("RESULT " + json.dumps(out), flush=True)
