"""How fast each CPU of this host runs a fixed piece of framework-like host work.

Runs the same single-threaded work (Python function calls with attribute and dict access, and aten ops on
one-element CPU tensors through PyTorch's dispatcher) pinned to each CPU the process may use in turn, for several
rounds, and writes per CPU and round the time the work took. Read-only: it sets only its own CPU affinity.

    python groundtruth/hostcpu/host_speed.py --out speed.json [--rounds 2] [--cpus 0,4,8]

Used by placement.sh to see whether the host-bound steps' spread on one host follows the CPU a process runs on.
"""

import argparse
import json
import os
import time

import torch


class _Holder:
    def __init__(self):
        self.value = 0
        self.table = {"a": 1, "b": 2}

    def step(self, i):
        self.value += self.table["a"] if i & 1 else self.table["b"]
        return self.value


def _python_work(n):
    h = _Holder()
    total = 0
    for i in range(n):
        total += h.step(i)
    return total


def _dispatch_work(n):
    a = torch.ones(1)
    b = torch.ones(1)
    for _ in range(n):
        a = torch.add(a, b)
    return a


def measure_once(py_n=200_000, disp_n=20_000):
    t0 = time.perf_counter()
    _python_work(py_n)
    t1 = time.perf_counter()
    _dispatch_work(disp_n)
    t2 = time.perf_counter()
    return {"python_ns_per_call": (t1 - t0) / py_n * 1e9, "dispatch_us": (t2 - t1) / disp_n * 1e6}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--cpus", default=None, help="comma-separated CPUs (default: every CPU this process may use)")
    args = p.parse_args()
    torch.set_num_threads(1)
    allowed = sorted(os.sched_getaffinity(0))
    cpus = [int(c) for c in args.cpus.split(",")] if args.cpus else allowed
    _python_work(20_000)
    _dispatch_work(2_000)
    rows = []
    for r in range(args.rounds):
        for c in cpus:
            os.sched_setaffinity(0, {c})
            m = measure_once()
            m.update(cpu=c, round=r, wall=time.time())
            rows.append(m)
            print(f"round {r} cpu {c:3d}: python {m['python_ns_per_call']:7.1f} ns/call  "
                  f"dispatch {m['dispatch_us']:6.3f} us", flush=True)
    os.sched_setaffinity(0, set(allowed))
    with open(args.out, "w") as f:
        json.dump({"allowed_cpus": allowed, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
