"""Converts a list of N Python ints to a tensor, and a tensor of N elements to a list, K times each (and the same
with one element): the virtual time of each loop, for tests/test_host_conversions.py.

    python conversions.py N K
"""
import json, sys, time
import torch

N, K = int(sys.argv[1]), int(sys.argv[2])
big, small = list(range(N)), [0]


def timed(fn, data):
    t0 = time.perf_counter()
    for _ in range(K):
        fn(data)
    return time.perf_counter() - t0


out = {}
for name, fn in (("tensor_dtype", lambda d: torch.tensor(d, dtype=torch.long)),
                 ("tensor_infer", lambda d: torch.tensor(d)),
                 ("as_tensor_dtype", lambda d: torch.as_tensor(d, dtype=torch.float32)),
                 ("tolist", lambda t: t.tolist())):
    args = (torch.arange(N), torch.arange(1)) if name == "tolist" else (big, small)
    timed(fn, args[1])                                   # warm-up: first calls take other paths
    out[name] = [timed(fn, args[0]), timed(fn, args[1])]
try:
    from phantora_stubs import conversions
    out["wrapped"] = bool(getattr(torch.tensor, "_phantora", False))
    out["stats"] = conversions.STATS
except ImportError:      # a plain run
    pass
print("RESULT " + json.dumps(out), flush=True)
