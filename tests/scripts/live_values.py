"""A torchrun-style script for tests/test_live_run.py: prints what torchrun's variables and a few collectives on
host-known values give on this rank, as one JSON line."""
import json
import os

import torch
import torch.distributed as dist

dist.init_process_group("nccl")
rank, world = dist.get_rank(), dist.get_world_size()
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
s = torch.tensor([float(rank + 1)], device="cuda")
dist.all_reduce(s)
m = torch.tensor([float(rank)], device="cuda")
dist.all_reduce(m, op=dist.ReduceOp.MAX)
objs = [None] * world
dist.all_gather_object(objs, {"rank": rank})
b = [rank * 10]
dist.broadcast_object_list(b, src=world - 1)
g = torch.empty(world, device="cuda")
dist.all_gather_into_tensor(g, torch.tensor([rank * 2.0], device="cuda"))
ids = torch.tensor(list(range(1000)) if rank == 0 else [-1] * 1000, dtype=torch.int64, device="cuda")
dist.broadcast(ids, src=0)
floats = torch.full((1000,), float(rank + 1), device="cuda")
dist.broadcast(floats, src=0)
# list-form all_to_all: what rank r sends to rank j is r * 100 + j; rank j receives [r * 100 + j for every r]
a2a_in = [torch.tensor([rank * 100 + j], dtype=torch.int64, device="cuda") for j in range(world)]
a2a_out = [torch.empty(1, dtype=torch.int64, device="cuda") for _ in range(world)]
dist.all_to_all(a2a_out, a2a_in)
# the same with unequal sizes (NCCL's group of sends and receives): rank r sends j + 1 copies of r * 100 + j to rank j
uneven_in = [torch.full((j + 1,), rank * 100 + j, dtype=torch.int64, device="cuda") for j in range(world)]
uneven_out = [torch.empty(rank + 1, dtype=torch.int64, device="cuda") for _ in range(world)]
dist.all_to_all(uneven_out, uneven_in)
# all_to_all_single with split sizes, through the process group and as a functional collective
single_in = torch.cat(uneven_in)
single_out = torch.empty(world * (rank + 1), dtype=torch.int64, device="cuda")
dist.all_to_all_single(single_out, single_in, [rank + 1] * world, [j + 1 for j in range(world)])
from torch.distributed import _functional_collectives as funcol  # noqa: E402
func_out = funcol.all_to_all_single(single_in, [rank + 1] * world, [j + 1 for j in range(world)],
                                    dist.group.WORLD)
# new tensors on the GPU made from a tensor of at most one element (the fake mode's constants): DeepSpeed's
# contiguous activation checkpointing allocates its buffers as torch.tensor(()).new_empty(n, device=cuda)
made = [torch.tensor(()).new_empty([3], dtype=torch.bfloat16, device="cuda"),
        torch.tensor(2.0).new_full([2], 5.0, device="cuda"), torch.zeros_like(torch.tensor(1.0), device="cuda")]
made = [[str(t.device), list(t.shape), str(t.dtype)] for t in made] + [made[1].tolist()]
env = {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                                      "MASTER_PORT", "GROUP_RANK")}
print("RESULT " + json.dumps({"rank": rank, "world": world, "sum": s.item(), "max": m.item(), "objs": objs,
                              "bcast": b, "gathered": g.tolist(), "env": env,
                              "ids_ok": ids.tolist() == list(range(1000)), "floats_from_root": floats[0].item(),
                              "a2a": [t.item() for t in a2a_out],
                              "uneven": [t.tolist() for t in uneven_out], "single": single_out.tolist(),
                              "functional": func_out.tolist(), "made": made}), flush=True)
dist.destroy_process_group()
