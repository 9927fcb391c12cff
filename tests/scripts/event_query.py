"""For tests/test_live_run.py: `Event.query()` answered in virtual time. Rank 1 joins an all_reduce 1 s (virtual) late,
and late in wall time too (a real spin that costs no virtual time); rank 0 queries an event recorded after the
all_reduce right away (not complete: its peer joins at 1 s), then after sleeping 2 s (complete). Then each rank
polls an event recorded after a GEMM (`while not e.query()`, as a benchmark waits without synchronising): the loop
must end, when the GPU has finished the GEMM. Then each rank polls the work of an asynchronous 256 MiB all_reduce
(`while not work.is_completed()`)."""
import json
import os

import torch
import torch.distributed as dist

dist.init_process_group("nccl")
rank = dist.get_rank()
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
x = torch.ones(1024, device="cuda")
if rank == 1:
    n = 0
    n += sum(range(30_000_000))       # wall-clock lateness only: one built-in call is no counted host work
    import time
    time.sleep(1.0)
dist.all_reduce(x)
done = torch.cuda.Event()
done.record()
first = done.query()
import time  # noqa: E402
time.sleep(2.0)
second = done.query()
a = torch.empty(8192, 8192, device="cuda", dtype=torch.bfloat16)
torch.cuda.synchronize()
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
t0 = time.perf_counter()
start.record()
a @ a
end.record()
try:
    start.elapsed_time(end)          # the GEMM is still running: CUDA answers "device not ready"
    early = "answered"
except RuntimeError as e:
    early = str(e)
polls = 0
while not end.query() and polls < 1_000_000:
    polls += 1
spin_s = time.perf_counter() - t0
kernel_s = start.elapsed_time(end) / 1e3
big = torch.empty(64 * 1024 * 1024, device="cuda")
dist.barrier()
torch.cuda.synchronize()
t0 = time.perf_counter()
work = dist.all_reduce(big, async_op=True)
work_first = work.is_completed()
work_polls = 0
while not work.is_completed() and work_polls < 1_000_000:
    work_polls += 1
work_s = time.perf_counter() - t0
print("RESULT " + json.dumps({"rank": rank, "first": first, "second": second, "polls": polls, "spin_s": spin_s,
                              "kernel_s": kernel_s, "early": early, "work_first": work_first,
                              "work_polls": work_polls, "work_s": work_s}), flush=True)
dist.destroy_process_group()
