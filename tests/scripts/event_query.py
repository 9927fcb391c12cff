"""For tests/test_live_run.py: `Event.query()` answered in virtual time. Rank 1 joins an all_reduce 1 s (virtual) late,
and late in wall time too (a real spin that costs no virtual time); rank 0 queries an event recorded after the
all_reduce right away (not complete: its peer joins at 1 s), then after sleeping 2 s (complete)."""
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
print("RESULT " + json.dumps({"rank": rank, "first": first, "second": second}), flush=True)
dist.destroy_process_group()
