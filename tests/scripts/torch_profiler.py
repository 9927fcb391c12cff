"""Profiles three training steps with torch.profiler, CUDA activity asked for as in a GPU script, and exports the
Chrome trace to PATH; then the legacy profiler with use_cuda=True. Prints "profiled" and the trace's op events."""
import json
import sys

import torch
from torch.profiler import ProfilerActivity, profile, schedule

model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256)).cuda()
opt = torch.optim.AdamW(model.parameters())
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], schedule=schedule(wait=1, warmup=1, active=2),
             on_trace_ready=lambda p: p.export_chrome_trace(sys.argv[1]), record_shapes=True) as prof:
    for _ in range(4):
        model(torch.randn(32, 256, device="cuda")).sum().backward()
        opt.step()
        opt.zero_grad()
        prof.step()
with torch.autograd.profiler.profile(use_cuda=True) as legacy:
    torch.randn(64, 64, device="cuda").sum()
events = json.load(open(sys.argv[1]))["traceEvents"]
print("profiled", sum(1 for e in events if str(e.get("name", "")).startswith("aten::")), len(legacy.function_events),
      flush=True)
