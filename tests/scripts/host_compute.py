"""For tests/test_live_run.py: time ops on large host tensors (fake under simulation) with the virtual clock and
print one JSON line: the elapsed time of an in-place multiply, a cast copy to bf16, a norm over N fp32 elements, a
cast copy back to fp32, a copy that keeps the dtype, of two uploads from pageable memory to the device that cast fp32
to bf16, one blocking (PyTorch converts on the host first, then waits for the copy) and one non-blocking (converted
on the GPU; the driver stages the pageable source, holding the thread), and of a non-blocking upload from pinned
memory (the host goes on at once)."""
import json
import time

import torch

n = 100_000_000
x = torch.empty(n)
y = torch.empty(n, dtype=torch.bfloat16)
t0 = time.perf_counter()
x.mul_(2.0)
t1 = time.perf_counter()
y.copy_(x)
t2 = time.perf_counter()
torch.linalg.vector_norm(x)
t3 = time.perf_counter()
x.copy_(y)
t3b = time.perf_counter()
z = torch.empty(n)
t3c = time.perf_counter()
z.copy_(x)
t3d = time.perf_counter()
d = torch.empty(n, dtype=torch.bfloat16, device="cuda")
t4 = time.perf_counter()
d.copy_(x)                            # a blocking upload that casts: PyTorch converts on the host first
t5 = time.perf_counter()
d.copy_(x, non_blocking=True)         # a non-blocking one: converted on the GPU, nothing on the host
t6 = time.perf_counter()
xp = torch.empty(n, pin_memory=True)
torch.cuda.synchronize()
t7 = time.perf_counter()
d.copy_(xp, non_blocking=True)        # from pinned memory: returns at once
t8 = time.perf_counter()
print("RESULT " + json.dumps({"n": n, "mul_s": t1 - t0, "copy_s": t2 - t1, "norm_s": t3 - t2, "h2d_cast_s": t5 - t4, "h2d_cast_nb_s": t6 - t5,
                              "h2d_pinned_nb_s": t8 - t7,
                              "upcast_s": t3b - t3, "same_s": t3d - t3c,
                              "threads": torch.get_num_threads()}), flush=True)
