"""DeepSpeed's MoE layer (deepspeed.moe.layer.MoE: its top-k gate, capacity, einsum dispatch and all-to-all) with
expert parallelism over the world, trained a few steps through deepspeed.initialize. Arguments: experts, top-k,
drop_tokens (1: capacity from the capacity factor; 0: capacity = the busiest expert's count, DeepSpeed's no-drop
mode), tokens. Prints one JSON line."""

import json
import os
import sys

import deepspeed
import torch
import torch.nn as nn
import torch.nn.functional as F
from deepspeed.moe.layer import MoE
from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer

E, K, DROP, T = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1", int(sys.argv[4])
D = 512


class Expert(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1, self.w2, self.w3 = nn.Linear(D, D, bias=False), nn.Linear(D, D, bias=False), nn.Linear(D, D, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


deepspeed.init_distributed()
world = torch.distributed.get_world_size()
torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
net = MoE(hidden_size=D, expert=Expert(), num_experts=E, ep_size=world, k=K, capacity_factor=1.0,
          drop_tokens=DROP, min_capacity=4).cuda()
groups = split_params_into_different_moe_groups_for_optimizer({"params": list(net.parameters()), "name": "p"})
config = {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True}, "zero_optimization": {"stage": 1}}
engine, _, _, _ = deepspeed.initialize(model=net, optimizer=torch.optim.AdamW(groups, lr=1e-4), config=config)
x = torch.randn(1, T, D, device="cuda", dtype=torch.bfloat16)
for _ in range(2):
    out, l_aux, _ = engine(x)
    engine.backward(out.float().pow(2).mean() + 0.01 * l_aux)
    engine.step()
print(json.dumps({"rank": torch.distributed.get_rank(), "world": world, "dim": D}))
