"""all_gather into a list of tensors of different sizes (valid with NCCL: ProcessGroupNCCL broadcasts each member's
tensor). Prints RESULT {"ms": ..., "values": ..., "bytes_in": ...} on every rank."""
import json
import os

import torch
import torch.distributed as dist

dist.init_process_group("nccl")
rank, world = dist.get_rank(), dist.get_world_size()
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
n = 16 << 20
outs = [torch.empty((i + 1) * n, device="cuda") for i in range(world)]
mine = torch.empty((rank + 1) * n, device="cuda")
dist.all_gather(outs, mine)                     # warm: the communicator
torch.cuda.synchronize()
a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
a.record()
dist.all_gather(outs, mine)
b.record()
torch.cuda.synchronize()
small = [torch.empty(i + 1, device="cuda") for i in range(world)]
dist.all_gather(small, torch.full((rank + 1,), float(rank), device="cuda"))
print("RESULT " + json.dumps({"ms": a.elapsed_time(b), "values": [t.tolist() for t in small],
                              "bytes_in": sum(o.numel() * 4 for i, o in enumerate(outs) if i != rank)}))
