"""torch.distributed with the NCCL backend: collectives, groups, point-to-point, object collectives.

Prints one JSON object; the collectives show up in the op log.
"""

import json

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

dist.init_process_group("nccl")
out = {"backend": dist.get_backend(), "world_size": dist.get_world_size(), "rank": dist.get_rank()}
torch.cuda.set_device(0)
t = torch.ones(1000, device="cuda", dtype=torch.float32)
dist.all_reduce(t)
sub = dist.new_group([0])
gathered = torch.empty(1000, device="cuda", dtype=torch.bfloat16)
dist.all_gather_into_tensor(gathered, torch.ones(1000, device="cuda", dtype=torch.bfloat16), group=sub)
work = dist.reduce_scatter_tensor(torch.empty(300, device="cuda"), torch.ones(300, device="cuda"), async_op=True)
work.wait()
dist.broadcast(t, src=0)
r = funcol.all_reduce(torch.ones(64, device="cuda"), "sum", sub)
r = r + 1
reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.ones(10, device="cuda"), 0),
                               dist.P2POp(dist.irecv, torch.empty(10, device="cuda"), 0)])
for req in reqs:
    req.wait()
a2a = torch.empty(64, device="cuda")
dist.all_to_all_single(a2a, torch.ones(64, device="cuda"))
split = dist.split_group(split_ranks=[[0]])
out["split_group_size"] = split.size()
from torch.distributed.device_mesh import init_device_mesh
mesh = init_device_mesh("cuda", (1,), mesh_dim_names=("dp",))
out["mesh"] = mesh.mesh.tolist()
out["mesh_group_size"] = mesh.get_group("dp").size()
dist.barrier()
objs = [None]
dist.all_gather_object(objs, {"rank": dist.get_rank()})
out["gathered_objects"] = objs
value = torch.tensor([3.0], device="cuda")
dist.all_reduce(value)
out["all_reduce_value"] = value.item()
dist.destroy_process_group()
print(json.dumps(out))
