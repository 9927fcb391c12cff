"""The `[host]` rate tables are the host measurements they cite: groundtruth/deepspeed/h200x2/host_ops_bench.jsonl
and cpu_adam_bench.jsonl (host_ops_bench.py and cpu_adam_bench.py on a 2 x H200 host, 1, 4 and 16 threads)."""

import json
import statistics

import pytest

from phantora.cluster import HostSpec
from phantora.paths import groundtruth_dir

DATA = groundtruth_dir() / "deepspeed" / "h200x2"
# table -> the benchmark ops it stands for (their mean at each thread count)
TABLES = {"copy_gbps": ("copy_fp32",), "downcast_gbps": ("copy_bf16_from_fp32",),
          "upcast_gbps": ("to_fp32_from_bf16",), "elementwise_gbps": ("mul_fp32_inplace", "add_fp32_inplace"),
          "reduction_gbps": ("norm_fp32",)}


def _bench(name: str) -> list[dict]:
    return [json.loads(line) for line in (DATA / name).read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("table", sorted(TABLES))
def test_host_op_tables_are_the_benchmark(table):
    rows = _bench("host_ops_bench.jsonl")
    for threads, gbps in getattr(HostSpec(), table):
        got = [r["gbps"] for r in rows if r["op"] in TABLES[table] and int(r["omp_num_threads"]) == threads]
        assert len(got) == len(TABLES[table]), (table, threads)
        assert gbps == pytest.approx(statistics.mean(got), rel=0.015), (table, threads)


def test_cpu_adam_table_is_the_benchmark():
    rows = {int(r["omp_num_threads"]): r["gbps"] for r in _bench("cpu_adam_bench.jsonl")}
    for threads, gbps in HostSpec().cpu_adam_gbps:
        assert gbps == pytest.approx(rows[threads], rel=0.015)

