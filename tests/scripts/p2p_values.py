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
# rank 0 to rank 1: 64 float32 received as 128 bfloat16 (the same bytes), then three integers; and two float32
# received into int32 (a real GPU reinterprets the bytes, which the carried values do not say: unknown)
if rank == 0:
    dist.send(torch.ones(64, device="cuda"), 1)
    dist.send(ints(7, 8, 9), 1)
    dist.send(torch.tensor([1.0, 2.0], device="cuda"), 1)
elif rank == 1:
    dist.recv(torch.empty(128, dtype=torch.bfloat16, device="cuda"), 0)
    after = empty(3)
    dist.recv(after, 0)
    into = torch.empty(2, dtype=torch.int32, device="cuda")
    dist.recv(into, 0)
    got["after_other_dtype"], got["into_int32"] = after.tolist(), into.tolist()
print("RESULT " + json.dumps({"rank": rank, **got}), flush=True)
dist.destroy_process_group()
