"""A mixture-of-experts dispatch written the way the frameworks write it, on placeholder scores.

Router: softmax scores over E experts, top-k (TorchTitan, Megatron-core) or argmax (DeepSpeed's top-1 gate); the
per-expert counts as a sum of a one-hot routing map over the tokens (`scatter_` of the ids, `one_hot`); then
expert parallelism over the world: the counts exchanged with an all-to-all, the split lists read on the host,
and the tokens moved with `all_to_all_single` and those split sizes. Prints one JSON object.
"""

import json
import sys

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F

TOKENS, DIM, EXPERTS, TOP_K = int(sys.argv[1]), 256, int(sys.argv[2]), int(sys.argv[3])

dist.init_process_group("nccl")
torch.cuda.set_device(0)
world, me = dist.get_world_size(), dist.get_rank()
x = torch.randn(TOKENS, DIM, device="cuda", dtype=torch.bfloat16)
gate = torch.randn(EXPERTS, DIM, device="cuda", dtype=torch.bfloat16)
scores = torch.softmax((x @ gate.t()).float(), dim=-1)

_, ids = torch.topk(scores, TOP_K, dim=-1)                                       # (T, k)
routing_map = torch.zeros_like(scores, dtype=torch.bool).scatter_(-1, ids, True)
counts = routing_map.sum(dim=0)                                                  # (E,)

# Megatron-core's token dropping: each expert keeps its top-`capacity` tokens (a top-k over the tokens, scattered
# into a mask), and the routing map loses the rest; `ones_like` where the capacity is above the tokens
capacity = TOKENS * TOP_K // EXPERTS // 2
probs = scores * routing_map
_, kept = torch.topk(probs, k=capacity, dim=0, sorted=False)
capacity_mask = torch.zeros_like(probs).scatter(0, kept, 1).bool()
capped = torch.logical_and(routing_map, capacity_mask)
capped_counts = capped.sum(dim=0)                                                 # as the dispatcher counts
capped_rows = torch.arange(TOKENS, device="cuda").unsqueeze(0).expand(EXPERTS, -1).masked_select(
    capped.T.contiguous()).numel()                                               # transposed, as permute reads it
uncapped_counts = torch.logical_and(routing_map, torch.ones_like(probs).bool()).sum(dim=0)

top1 = torch.argmax(scores, dim=1)                                               # DeepSpeed's top-1 gate
top1_counts = torch.sum(F.one_hot(top1, num_classes=EXPERTS), dim=0)

# expert parallelism over the world: exchange the counts, then the tokens
received = funcol.all_to_all_single(counts.view(world, -1), None, None, group=dist.group.WORLD)
received = funcol.wait_tensor(received) if hasattr(funcol, "wait_tensor") else received
input_splits = counts.view(world, -1).sum(dim=1).to("cpu").tolist()
output_splits = received.view(world, -1).sum(dim=1).to("cpu").tolist()
order = torch.argsort(ids.view(-1), stable=True)
routed = x[order // TOP_K]
out = torch.empty(sum(output_splits), DIM, device="cuda", dtype=x.dtype)
dist.all_to_all_single(out, routed, output_splits, input_splits)
offsets = torch.cumsum(received.view(-1) if world > 1 else counts, dim=0, dtype=torch.int32)

print(json.dumps({"world": world, "rank": me, "counts": counts.tolist(), "top1_counts": top1_counts.tolist(),
                  "capacity": capacity, "capped_counts": capped_counts.tolist(), "capped_rows": capped_rows,
                  "uncapped_counts": uncapped_counts.tolist(),
                  "input_splits": input_splits, "output_splits": output_splits, "received_rows": out.shape[0],
                  "row_bytes": DIM * x.element_size(), "offsets": offsets.tolist()}))
dist.destroy_process_group()
