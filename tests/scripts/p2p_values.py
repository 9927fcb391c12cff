"""A torchrun-style script for tests/test_live_run.py: small integer tensors passed around a ring of ranks by
point-to-point ops, plain and inside NCCL groups (batch_isend_irecv with the receive posted first, as Megatron's
pipeline schedules post it when they send tensor shapes; two messages to one peer in one group; a coalescing
manager), and what each rank received, as one JSON line."""
import json
import os

import torch
import torch.distributed as dist

dist.init_process_group("nccl")
rank, world = dist.get_rank(), dist.get_world_size()
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
nxt, prv = (rank + 1) % world, (rank - 1) % world


def ints(*values):
    return torch.tensor(values, dtype=torch.int64, device="cuda")


def empty(n):
    return torch.empty(n, dtype=torch.int64, device="cuda")


got = {}
inp = empty(3)
reqs = dist.batch_isend_irecv([dist.P2POp(dist.irecv, inp, prv), dist.P2POp(dist.isend, ints(rank, 10 + rank, 20 + rank), nxt)])
for req in reqs:
    req.wait()
got["batch"] = inp.tolist()

first, second = empty(1), empty(1)
reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, ints(100 + rank), nxt), dist.P2POp(dist.isend, ints(200 + rank), nxt),
                               dist.P2POp(dist.irecv, first, prv), dist.P2POp(dist.irecv, second, prv)])
for req in reqs:
    req.wait()
got["two"] = first.tolist() + second.tolist()

coalesced = empty(2)
with dist._coalescing_manager(device=torch.device("cuda", int(os.environ["LOCAL_RANK"]))):
    dist.irecv(coalesced, prv)
    dist.isend(ints(300 + rank, 400 + rank), nxt)
torch.cuda.synchronize()
got["coalesced"] = coalesced.tolist()

plain = empty(1)                  # outside a group the odd ranks receive first, so that no ring of sends waits
if rank % 2:
    dist.recv(plain, prv)
    dist.send(ints(500 + rank), nxt)
else:
    dist.send(ints(500 + rank), nxt)
    dist.recv(plain, prv)
got["plain"] = plain.tolist()
print("RESULT " + json.dumps({"rank": rank, **got}), flush=True)
dist.destroy_process_group()
