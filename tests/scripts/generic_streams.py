"""The device-generic stream and event API (torch.Stream, torch.Event, torch.accelerator) on the simulated GPU.
Prints RESULT {...} with times in ms measured by the program."""
import json
import time

import torch

x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)


def gemms(n=10):
    for _ in range(n):
        x @ x


out = {}
torch.accelerator.synchronize()
t0 = time.perf_counter()
gemms()
torch.accelerator.synchronize()
out["serial_ms"] = (time.perf_counter() - t0) * 1e3
e1, e2 = torch.Event(enable_timing=True), torch.Event(enable_timing=True)
e1.record()
gemms()
e2.record()
try:
    e1.elapsed_time(e2)
    out["early"] = "no error"
except RuntimeError as e:
    out["early"] = str(e)
e2.synchronize()
out["event_ms"] = e1.elapsed_time(e2)
# ten GEMMs on the current stream, then ten on a side stream that waits for them, then the current waits for it
side = torch.Stream()
torch.accelerator.synchronize()
t0 = time.perf_counter()
gemms()
side.wait_stream(torch.accelerator.current_stream())
with side:
    gemms()
torch.accelerator.current_stream().wait_stream(side)
done = torch.Event()
done.record()
done.synchronize()
out["dependent_ms"] = (time.perf_counter() - t0) * 1e3
print("RESULT " + json.dumps(out))
