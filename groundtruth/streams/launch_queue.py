"""How many launches a CUDA stream holds before the host blocks: behind a long spin kernel, time each launch of a
tiny kernel; the first that takes over 200 us is the one that waited (one, two and four streams).

    OUT=DIR python groundtruth/streams/launch_queue.py
"""
import torch, time, json, os, statistics
torch.cuda.init()
x = torch.zeros(1, device="cuda")
def probe(n, streams=1, spin_ms=2000):
    ss = [torch.cuda.current_stream()] + [torch.cuda.Stream() for _ in range(streams - 1)]
    torch.cuda.synchronize()
    for s in ss:
        with torch.cuda.stream(s):
            torch.cuda._sleep(int(spin_ms * 1e3 * 1500))   # ~1.5 GHz cycles per us
    t = []
    for i in range(n):
        s = ss[i % streams]
        t0 = time.perf_counter()
        with torch.cuda.stream(s):
            x.add_(1)
        t.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    slow = [i for i, d in enumerate(t) if d > 200e-6]
    return {"n": n, "streams": streams, "first_blocked": slow[0] if slow else None, "blocked": len(slow),
            "median_us": statistics.median(t) * 1e6, "max_ms": max(t) * 1e3}
out = [probe(4000, 1), probe(4000, 1), probe(6000, 2), probe(6000, 4)]
for o in out: print(o)
json.dump(out, open(os.environ["OUT"] + "/queue.json", "w"), indent=1)
