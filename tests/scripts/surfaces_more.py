"""For tests/test_live_run.py: APIs a plain PyTorch script uses that a simulated rank must answer as a GPU machine
does: `torch.autograd.profiler.emit_nvtx()`, `nn.DataParallel` over one device (and over two, refused with a
message), a sparse embedding's gradient (refused with a message: its size depends on the data), and an
out-of-memory error under `set_per_process_memory_fraction`."""
import json
import time

import torch

out = {}
m = torch.nn.Linear(64, 64).cuda()
x = torch.randn(8, 64, device="cuda")
with torch.autograd.profiler.emit_nvtx():
    m(x).sum().backward()
out["emit_nvtx"] = True
out["dp_one"] = list(torch.nn.DataParallel(m, device_ids=[0])(x).shape)
try:
    torch.nn.DataParallel(m, device_ids=[0, 1])(x)
    out["dp_two"] = "ran"
except Exception as e:          # noqa: BLE001
    out["dp_two"] = f"{type(e).__name__}: {e}"
emb = torch.nn.Embedding(100000, 256, sparse=True).cuda()
opt = torch.optim.SparseAdam(emb.parameters())
idx = torch.randint(0, 100000, (4096,), device="cuda")
try:
    emb(idx).sum().backward()
    opt.step()
    out["sparse"] = "ran"
except Exception as e:          # noqa: BLE001
    out["sparse"] = f"{type(e).__name__}: {e}"
mask = torch.zeros(1 << 26, dtype=torch.bool, device="cuda")
torch.cuda.synchronize()
t0 = time.perf_counter()
mask.nonzero()                     # reads back its 8-byte count, not the mask
out["nonzero_s"] = time.perf_counter() - t0
torch.cuda.set_per_process_memory_fraction(0.1)
try:
    torch.empty(16 << 30, dtype=torch.uint8, device="cuda")
    out["oom"] = "none"
except torch.OutOfMemoryError as e:
    out["oom"] = str(e)
print("RESULT " + json.dumps(out), flush=True)
