"""For tests/test_live_run.py: safetensors' save_file of CUDA tensors (as save_pretrained and the Trainer's
checkpoints write them) into argv[1], then load_file and safe_open of it. Prints one RESULT line."""
import json
import sys
import time

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

path = sys.argv[1]
state = {"w": torch.empty(1024, 1024, device="cuda", dtype=torch.bfloat16), "b": torch.empty(1024, device="cuda"),
         "steps": torch.tensor([1, 2, 3], device="cuda")}
t0 = time.perf_counter()
save_file(state, path, metadata={"format": "pt"})
t1 = time.perf_counter()
loaded = load_file(path, device="cuda")
with safe_open(path, framework="pt", device="cpu") as f:
    opened = {k: list(f.get_tensor(k).shape) for k in f.keys()}
    sliced = list(f.get_slice("w")[:10].shape)
print("RESULT " + json.dumps({"save_s": t1 - t0, "loaded": {k: [list(v.shape), str(v.dtype), str(v.device)]
                                                             for k, v in loaded.items()},
                              "opened": opened, "sliced": sliced}), flush=True)
