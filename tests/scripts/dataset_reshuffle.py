"""Reshuffles a prepared Hugging Face dataset (DATA_DIR, a JSON-lines dataset in HF_DATASETS_CACHE) as a trainer
that runs out of data does (TorchTitan's re-loop), three times, and prints the virtual seconds of the reshuffles as
one JSON line."""
import json
import sys
import time

import torch
from datasets import load_dataset

ds = load_dataset(sys.argv[1], split="train")
x = torch.ones(4, device="cuda")
t0 = time.perf_counter()
for epoch in range(1, 4):
    order = ds.shuffle(seed=42 + epoch)
    x = x + len(order)
torch.cuda.synchronize()
print(json.dumps({"elapsed_s": time.perf_counter() - t0}), flush=True)
