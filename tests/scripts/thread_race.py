"""The main thread hands work to a worker thread and waits for it, twenty times; FIRST ("worker" or "main") says
which of the two gets there first, by a real wait in the other: the same Python runs either way. Prints the virtual
seconds of the loop as one JSON line."""
import json
import select
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import torch

first = sys.argv[1]


worker_wait = 0.01 if first == "main" else 0.0        # real waits: time.sleep is virtual in a rank
main_wait = 0.01 if first == "worker" else 0.0


def work(i: int) -> int:
    select.select([], [], [], worker_wait)     # with 0.01 s here the main thread waits for the result
    return 2 * i


x = torch.ones(4, device="cuda")
t0 = time.perf_counter()
with ThreadPoolExecutor(1) as pool:
    for i in range(20):
        fut = pool.submit(work, i)
        fut.add_done_callback(lambda f: None)
        select.select([], [], [], main_wait)   # with 0.01 s here the result is there before the main thread asks
        x = x + fut.result()
torch.cuda.synchronize()
print(json.dumps({"elapsed_s": time.perf_counter() - t0}), flush=True)
