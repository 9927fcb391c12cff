"""Two training steps of a small model under FSDP1 (FullyShardedDataParallel: full sharding, bf16 mixed precision,
a wrap per layer, original parameters), then a full state dict on rank 0; prints "trained" and the keys saved."""
import functools
import os

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullStateDictConfig, MixedPrecision, ShardingStrategy, StateDictType
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

dist.init_process_group("nccl")
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
layer = torch.nn.TransformerEncoderLayer
model = torch.nn.Sequential(*[layer(256, 4, 1024, batch_first=True) for _ in range(2)]).cuda()
model = FSDP(model, auto_wrap_policy=functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={layer}),
             mixed_precision=MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32),
             sharding_strategy=ShardingStrategy.FULL_SHARD, device_id=torch.cuda.current_device(),
             use_orig_params=True)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
for _ in range(2):
    model(torch.randn(4, 128, 256, device="cuda")).float().pow(2).mean().backward()
    model.clip_grad_norm_(1.0)
    opt.step()
    opt.zero_grad()
with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, FullStateDictConfig(offload_to_cpu=True,
                                                                                    rank0_only=True)):
    state = model.state_dict()
with FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT):      # reads the group's device types
    sharded = model.state_dict()
if dist.get_rank() == 0:
    print("trained", len(state), flush=True)
    print("sharded", len(sharded), [str(d) for d in dist.group.WORLD._device_types], flush=True)
dist.destroy_process_group()
