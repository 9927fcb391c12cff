"""For tests/test_live_run.py: object collectives and object point-to-point carrying tensors (2 ranks), as
checkpointing code sends optimizer steps and small state. Prints one RESULT line per rank."""
import json
import os

import torch
import torch.distributed as dist

dist.init_process_group("nccl")
r = dist.get_rank()
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
out = [None] * dist.get_world_size()
dist.all_gather_object(out, {"t": torch.arange(4, device="cuda") * (r + 1), "step": torch.tensor(3.0 + r),
                             "big": torch.empty(1 << 20, device="cuda")})
objs = [torch.arange(4, device="cuda") * (r + 1), "x"]
dist.broadcast_object_list(objs, src=0)
received = None
if r == 0:
    dist.send_object_list([torch.tensor([7, 8], device="cuda")], dst=1)
else:
    box = [None]
    dist.recv_object_list(box, src=0)
    received = box[0].tolist()
print("RESULT " + json.dumps({"rank": r, "gathered": [o["t"].tolist() for o in out],
                              "steps": [o["step"].item() for o in out],
                              "big": [list(o["big"].shape) for o in out], "devices": [str(o["t"].device) for o in out],
                              "broadcast": [objs[0].tolist(), objs[1]], "received": received}), flush=True)
