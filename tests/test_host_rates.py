"""The `[host]` rate tables are the host measurements they cite: groundtruth/deepspeed/h200x2/host_ops_bench.jsonl
and cpu_adam_bench.jsonl (host_ops_bench.py and cpu_adam_bench.py on a 2 x H200 host, 1, 4 and 16 threads), and
h200x2-threads/threads.jsonl (host_scaling.sh on another host of 32 cores: 32 threads, the median of the runs with
OMP_NUM_THREADS=32 and unset)."""

import json
import statistics

import pytest

from phantora.cluster import HostSpec
from phantora.paths import groundtruth_dir

DATA = groundtruth_dir() / "deepspeed" / "h200x2"
SCALING = groundtruth_dir() / "deepspeed" / "h200x2-threads" / "threads.jsonl"
ALL_CORES = 32
# table -> the benchmark ops it stands for (their mean at each thread count)
TABLES = {"copy_gbps": ("copy_fp32",), "downcast_gbps": ("copy_bf16_from_fp32",),
          "upcast_gbps": ("to_fp32_from_bf16",), "elementwise_gbps": ("mul_fp32_inplace", "add_fp32_inplace"),
          "reduction_gbps": ("norm_fp32",)}


def _bench(name: str) -> list[dict]:
    return [json.loads(line) for line in (DATA / name).read_text().splitlines() if line.strip()]


def _all_cores(op: str) -> float:
    """The median rate of `op` over host_scaling.sh's runs at 32 threads (OMP_NUM_THREADS=32 or unset)."""
    rows = [json.loads(line) for line in SCALING.read_text().splitlines() if line.strip()]
    got = [r["gbps"] for r in rows if r.get("op", "cpu_adam") == op and r["tag"] in ("T=32", "T=unset")]
    assert len(got) >= 2, op
    return statistics.median(got)


@pytest.mark.parametrize("table", sorted(TABLES))
def test_host_op_tables_are_the_benchmark(table):
    rows = _bench("host_ops_bench.jsonl")
    for threads, gbps in getattr(HostSpec(), table):
        if threads == ALL_CORES:
            assert gbps == pytest.approx(statistics.mean(_all_cores(op) for op in TABLES[table]), rel=0.015)
            continue
        got = [r["gbps"] for r in rows if r["op"] in TABLES[table] and int(r["omp_num_threads"]) == threads]
        assert len(got) == len(TABLES[table]), (table, threads)
        assert gbps == pytest.approx(statistics.mean(got), rel=0.015), (table, threads)


def test_cpu_adam_table_is_the_benchmark():
    rows = {int(r["omp_num_threads"]): r["gbps"] for r in _bench("cpu_adam_bench.jsonl")}
    for threads, gbps in HostSpec().cpu_adam_gbps:
        assert gbps == pytest.approx(_all_cores("cpu_adam") if threads == ALL_CORES else rows[threads], rel=0.015)



@pytest.mark.parametrize("environ, threads, source", [
    ({"PHANTORA_HOST_CPU_CORES": "32"}, 32, "[host] cpu_cores"),
    ({"PHANTORA_HOST_CPU_CORES": "32", "OMP_NUM_THREADS": "4"}, 4, "OMP_NUM_THREADS"),
])
def test_host_compute_says_its_threads_once(environ, threads, source, monkeypatch, capsys):
    """The first charge names the thread count the rates are read at, and where it came from; later ones are quiet."""
    from conftest import ROOT
    monkeypatch.syspath_prepend(str(ROOT / "stubs"))
    from phantora_stubs import errors, host_compute

    monkeypatch.setattr(errors, "_NOTED", set())
    monkeypatch.setenv("PHANTORA_RANK", "0")
    memory = host_compute.HostMemory(environ)
    rate = statistics.mean(r["gbps"] for r in _bench("cpu_adam_bench.jsonl") if int(r["omp_num_threads"]) == 4)
    seconds = memory.seconds(28e9, "cpu_adam")
    if threads == 4:           # a measured point: the bench's rate
        assert seconds == pytest.approx(28 / rate, rel=0.015)
    memory.seconds(1e9, "copy")
    lines = [ln for ln in capsys.readouterr().err.splitlines() if "host compute" in ln]
    assert len(lines) == 1 and f"runs at {threads} thread(s) per rank" in lines[0] and source in lines[0], lines
