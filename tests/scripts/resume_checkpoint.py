"""For tests/test_live_run.py: save a model and its AdamW state with torch.save, load them back with torch.load
(map_location argv[2]: "none", "cpu" or "cuda") and take another optimizer step, as a resumed run does; a torch.Size
and a named tuple holding a tensor come back as themselves (DeepSpeed's ZeRO-3 checkpoints keep parameter shapes as
torch.Size: zero_to_fp32 calls shape.numel()). Prints one RESULT line."""
import collections
import json
import sys

import torch
import torch.nn as nn

path, where = sys.argv[1], sys.argv[2]
model = nn.Linear(16, 16).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
model(torch.randn(4, 16, device="cuda")).sum().backward()
opt.step()
torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "best": torch.tensor(0.25), "epoch": 3,
            "size": model.weight.shape}, path)
ck = torch.load(path, map_location=None if where == "none" else where)
Pair = collections.namedtuple("Pair", "name tensor")
torch.save(Pair("w", model.weight.detach()), path + ".pair")
ck["pair"] = torch.load(path + ".pair", map_location=None if where == "none" else where, weights_only=False)
step_value = ck["opt"]["state"][0]["step"].item()
again = nn.Linear(16, 16).cuda()
opt2 = torch.optim.AdamW(again.parameters(), lr=1e-3)
again.load_state_dict(ck["model"])
opt2.load_state_dict(ck["opt"])
again(torch.randn(4, 16, device="cuda")).sum().backward()
opt2.step()
print("RESULT " + json.dumps({"weight": str(ck["model"]["weight"].device), "step": str(ck["opt"]["state"][0]["step"].device),
                              "step_value": step_value, "best": ck["best"].item(),
                              "epoch": ck["epoch"], "shape": list(ck["model"]["weight"].shape),
                              "size": [type(ck["size"]).__name__, ck["size"].numel()],
                              "pair": [type(ck["pair"]).__name__, ck["pair"].name, str(ck["pair"].tensor.device),
                                       list(ck["pair"].tensor.shape)]}), flush=True)
