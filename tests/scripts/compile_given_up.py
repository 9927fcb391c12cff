"""For tests/test_compile.py: frames Dynamo gives up on and runs eagerly (a graph break inside a loop; a frame past
the recompile limit) beside frames it compiles. Prints the run's compile report, JSON."""
import json

import torch
import torch._dynamo

torch._dynamo.config.recompile_limit = 2


@torch.compile
def looped(x):
    for _ in range(2):
        x = torch.relu(x)
        print("in the loop")          # a graph break inside a loop: Dynamo leaves the frame to run eagerly
    return x


@torch.compile(dynamic=False)
def sized(x):
    return torch.relu(x) * 2


x = torch.randn(64, device="cuda")
looped(x)
for n in (8, 16, 24, 32):             # compiled at 8 and 16, the recompile limit reached at 24 and 32
    sized(torch.randn(n, device="cuda"))
torch.cuda.synchronize()
from phantora_stubs import compiled as _c  # noqa: E402
print(json.dumps({"report": _c.report()}))
