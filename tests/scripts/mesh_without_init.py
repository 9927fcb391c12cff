"""A device mesh made before any process group (pytorch/examples' tensor_parallel_example.py does so):
`init_device_mesh` initializes the default group itself. Prints RESULT lines for the test."""
import json
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

mesh = init_device_mesh("cuda", (int(os.environ["WORLD_SIZE"]),))
t = torch.full((4,), float(dist.get_rank() + 1), device="cuda")
dist.all_reduce(t, group=mesh.get_group())
print("RESULT " + json.dumps({"rank": dist.get_rank(), "world": dist.get_world_size(), "sum": t.tolist()}))
