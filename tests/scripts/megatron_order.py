"""For tests/test_megatron_live.py: Megatron-core's parallel state initialised with TP 2 x PP 2 over the world in the
order given (`--order`, Megatron's default "tp-cp-ep-dp-pp" or "tp-pp-dp"), then one point-to-point exchange
between neighbouring stages, as a pipeline schedule makes."""
import argparse

import torch
import torch.distributed as dist
from megatron.core import parallel_state as ps

ap = argparse.ArgumentParser()
ap.add_argument("--order", default="tp-cp-ep-dp-pp")
ap.add_argument("--pp", type=int, default=2)
args = ap.parse_args()
dist.init_process_group("nccl")
torch.cuda.set_device(dist.get_rank() % torch.cuda.device_count())
ps.initialize_model_parallel(tensor_model_parallel_size=2, pipeline_model_parallel_size=args.pp, order=args.order)
x = torch.ones(1024, device="cuda")
if ps.is_pipeline_first_stage():
    dist.send(x, ps.get_pipeline_model_parallel_next_rank())
else:
    dist.recv(x, ps.get_pipeline_model_parallel_prev_rank())
torch.cuda.synchronize()
print("STAGE", dist.get_rank(), ps.get_pipeline_model_parallel_rank(), flush=True)
dist.destroy_process_group()
