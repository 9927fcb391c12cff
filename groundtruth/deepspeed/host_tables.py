"""The `[host]` rate tables of the cluster presets (docs/clusters.md; docs/host-cpu.md, "Host compute"), from every
single-process run of host_ops_bench.py and cpu_adam_bench.py kept here: 2 x H200 hosts of one kind (32-core
Intel Xeon virtual machines), 10^8 to 10^9 elements.

A host of this kind runs the same host op up to a third faster or slower than another, and moves within minutes
(groundtruth/deepspeed/README.md, "Host compute across hosts"), so a table point is the median over every run and host
at that thread count, taken where at least MIN_RUNS runs exist. A run with OMP_NUM_THREADS unset used all the host's
cores (the `nproc` its system.txt starts with). Processes run side by side (tags P=2 and more) are left out.

    python groundtruth/deepspeed/host_tables.py          # prints the tables as the [host] keys of a cluster preset
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

HERE = Path(__file__).resolve().parent
# (results file, the system.txt of its host, or None where every run names its threads)
SOURCES = (
    ("h200x2/host_ops_bench.jsonl", None),
    ("h200x2/cpu_adam_bench.jsonl", None),
    ("h200x2-threads/threads.jsonl", "h200x2-threads/system.txt"),
    ("h200x2-threads/scan-1e8/threads.jsonl", "h200x2-threads/scan-1e8/system.txt"),
    ("h200x2-threads/scan-3e8/threads.jsonl", "h200x2-threads/scan-3e8/system.txt"),
    ("h200x2-share/processes.jsonl", "h200x2-share/system.txt"),
    ("h200x2-share2/processes.jsonl", "h200x2-share2/system.txt"),
    ("h200x2-repeat/offload-host-bench.jsonl", "h200x2-repeat/offload-host-system.txt"),
)
MIN_RUNS = 3
# table -> the benchmark ops it stands for (the mean of their medians)
TABLES = {"copy_gbps": ("copy_fp32",), "downcast_gbps": ("copy_bf16_from_fp32",),
          "upcast_gbps": ("to_fp32_from_bf16",), "elementwise_gbps": ("mul_fp32_inplace", "add_fp32_inplace"),
          "reduction_gbps": ("norm_fp32",), "cpu_adam_gbps": ("cpu_adam",)}


def _cores(system: str | None, results: str) -> int:
    if system is None:
        raise ValueError(f"{results}: a run with OMP_NUM_THREADS unset, and no system.txt in SOURCES to read the "
                         f"host's cores from")
    return int((HERE / system).read_text().split()[0])


def single_process_rates() -> dict[tuple[str, int], list[float]]:
    """GB/s of each run of one process alone, by (op, threads); CPU Adam's op is "cpu_adam"."""
    rates: dict[tuple[str, int], list[float]] = {}
    for results, system in SOURCES:
        for line in (HERE / results).read_text().splitlines():
            if not line.strip():
                continue
            row = json.loads(line)
            tag = row.get("tag", "")
            if tag.startswith("P=") and not tag.startswith("P=1,"):
                continue
            threads = row["omp_num_threads"]
            threads = _cores(system, results) if threads in (None, "unset") else int(threads)
            rates.setdefault((row.get("op", "cpu_adam"), threads), []).append(row["gbps"])
    return rates


def _rounded(gbps: float) -> float:
    return round(gbps, 2 if gbps < 10 else 1)


def tables() -> dict[str, list[list[float]]]:
    """Each table's [threads, GB/s] points: at each thread count with MIN_RUNS runs of all its ops, the median."""
    rates = single_process_rates()
    out = {}
    for table, ops in TABLES.items():
        counts = sorted({t for op, t in rates if op in ops})
        points = []
        for t in counts:
            runs = [rates.get((op, t), []) for op in ops]
            if min(len(r) for r in runs) >= MIN_RUNS:
                points.append([t, _rounded(statistics.mean(statistics.median(r) for r in runs))])
        out[table] = points
    return out


if __name__ == "__main__":
    for name, points in tables().items():
        print(f"{name} = {json.dumps(points)}")
