"""Which stream commands fill a CUDA stream's launch queue: behind a long spin kernel, issue N commands of one kind
(or pairs of a kernel and another command) on one stream, each timed on the host; the first command that takes over
200 us is the one that waited for a free slot.

    OUT=DIR python groundtruth/streams/launch_queue_kinds.py      (writes DIR/queue-kinds.json)

Kinds: `kernel` (a one-element add), `record` (torch.cuda.Event().record()), `wait` (the stream waits for an event
recorded on another stream), `h2d` (a 4-byte copy from pinned memory, non-blocking), `d2d` (a 4-byte device copy),
`kernel+record`, `kernel+wait` (each pair counted as two commands).
"""
import json
import os
import statistics
import time

import torch

torch.cuda.init()
x = torch.zeros(1, device="cuda")
y = torch.zeros(1, device="cuda")
pinned = torch.zeros(1, pin_memory=True)
other = torch.cuda.Stream()
done = torch.cuda.Event()
with torch.cuda.stream(other):
    done.record()


def issue(kind):
    if kind == "kernel":
        x.add_(1)
    elif kind == "record":
        torch.cuda.Event().record()
    elif kind == "wait":
        torch.cuda.current_stream().wait_event(done)
    elif kind == "h2d":
        x.copy_(pinned, non_blocking=True)
    elif kind == "d2d":
        y.copy_(x)


def probe(kinds, n, spin_ms=1500):
    torch.cuda.synchronize()
    for _ in range(3):                      # warm-up of each kind
        for k in kinds:
            issue(k)
    torch.cuda.synchronize()
    torch.cuda._sleep(int(spin_ms * 1e3 * 1500))
    t = []
    for i in range(n):
        k = kinds[i % len(kinds)]
        t0 = time.perf_counter()
        issue(k)
        t.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    slow = [i for i, d in enumerate(t) if d > 200e-6]
    return {"kinds": kinds, "n": n, "first_blocked": slow[0] if slow else None, "blocked": len(slow),
            "median_us": statistics.median(t) * 1e6, "max_ms": max(t) * 1e3}


out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "runs": []}
for kinds in (["kernel"], ["record"], ["wait"], ["h2d"], ["d2d"], ["kernel", "record"], ["kernel", "wait"]):
    for _ in range(2):
        r = probe(kinds, 3000)
        print(r, flush=True)
        out["runs"].append(r)
json.dump(out, open(os.path.join(os.environ["OUT"], "queue-kinds.json"), "w"), indent=1)
