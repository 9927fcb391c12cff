"""What a CUDA machine answers that Megatron-core relies on: the current device for torch.tensor(..., device='cuda'),
element reads of 0-d CUDA tensors below the Python dispatcher, host-only computation on real CPU tensors, and
parameter attributes kept through module conversions."""
import json

import torch

torch.cuda.set_device(1)
out = {"current": torch.cuda.current_device(),
       "tensor_device": str(torch.tensor([1.0], device="cuda").device),
       "ones_device": str(torch.ones(2, device="cuda").device)}
# torch.tensor over 0-d CUDA tensors (Megatron's local L2 norm): known values come back, unknown ones are placeholders
a, b = torch.tensor(2.0, device="cuda"), torch.tensor(3.0, device="cuda")
out["stacked"] = torch.tensor([a, b]).tolist()
# host-only work on real CPU tensors (Megatron compares CPU RNG states around every RNG fork)
state = torch.get_rng_state()
out["rng_equal"] = bool(torch.all(state == torch.get_rng_state()).item())
out["rng_sum_real"] = int(state.sum()) == int(state.numpy().astype("int64").sum())
# parameter attributes through .cuda() / dtype conversion
m = torch.nn.Linear(8, 8)
m.weight.tensor_model_parallel = True
m.weight.partition_dim = 0
m.cuda().bfloat16().to(torch.float32)
out["attrs"] = [getattr(m.weight, "tensor_model_parallel", None), getattr(m.weight, "partition_dim", None),
                str(m.weight.device), str(m.weight.dtype)]
print(json.dumps(out))
