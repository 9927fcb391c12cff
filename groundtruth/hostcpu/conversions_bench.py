"""Host cost of converting between Python data and CPU tensors, per element (docs/host-cpu.md, "Conversions").

Times, on one thread, `torch.tensor(list)` of Python ints and floats (default dtypes and an explicit one),
`torch.as_tensor(list)`, `Tensor.tolist()` of int64 and float32 tensors, and, for comparison, building a list of
indices with `list.extend(range(...))` (what groundtruth/moe's trainer does before its conversion), for N from 1e2
to 1e6 elements: the median of repeats of each. Writes one JSON file.

    python groundtruth/hostcpu/conversions_bench.py OUT.json
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time

import torch

SIZES = (100, 1_000, 10_000, 100_000, 1_000_000)


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def median_ns(fn, n: int) -> tuple[float, int]:
    """Median of timed calls of `fn` (about 0.3 s of calls, at least 5, at most 2001), after 2 warm-ups."""
    fn()
    fn()
    t0 = time.perf_counter_ns()
    fn()
    once = max(time.perf_counter_ns() - t0, 1)
    reps = int(min(2001, max(5, 3e8 // once)))
    times = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - t0)
    return statistics.median(times), reps


def cases(n: int) -> dict:
    ints = list(range(n))
    floats = [float(i) + 0.5 for i in range(n)]
    ti = torch.arange(n, dtype=torch.int64)
    tf = torch.arange(n, dtype=torch.float32)
    return {
        "tensor_list_int": lambda: torch.tensor(ints),
        "tensor_list_int_long": lambda: torch.tensor(ints, dtype=torch.long),
        "tensor_list_float": lambda: torch.tensor(floats),
        "as_tensor_list_int": lambda: torch.as_tensor(ints),
        "tolist_int64": lambda: ti.tolist(),
        "tolist_float32": lambda: tf.tolist(),
        "list_extend_range": lambda: [].extend(range(n)),
    }


def main(out: str) -> int:
    torch.set_num_threads(1)
    rows = []
    for n in SIZES:
        for name, fn in cases(n).items():
            ns, reps = median_ns(fn, n)
            rows.append({"case": name, "n": n, "median_ns": ns, "ns_per_element": ns / n, "repeats": reps})
            print(f"{name:22s} n={n:>8d} {ns / 1e3:12.1f} us {ns / n:8.2f} ns/elem ({reps} reps)", flush=True)
    meta = {"cpu": cpu_model(), "cpus": os.cpu_count(), "python": sys.version.split()[0], "torch": torch.__version__,
            "threads": torch.get_num_threads(), "platform": platform.platform(),
            "date": time.strftime("%Y-%m-%d", time.gmtime())}
    with open(out, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1] if len(sys.argv) > 1 else "conversions.json"))
