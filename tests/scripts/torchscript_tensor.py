"""TorchScript compiles `torch.tensor(...)` as its builtin: torch.distributed.optim scripts its functional
optimizers at import, and a user's scripted function may build a tensor from a list. Prints what it saw."""

import json

import torch
from torch.distributed.optim import ZeroRedundancyOptimizer  # noqa: F401 - scripts functional optimizers


@torch.jit.script
def shifted(x: torch.Tensor) -> torch.Tensor:
    return x + torch.tensor([1.0, 2.0], device=x.device)


print("RESULT " + json.dumps({"wrapped": getattr(torch.tensor, "_phantora", False),
                              "graph": "aten::tensor" in str(shifted.graph)}), flush=True)
