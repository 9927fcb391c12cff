"""The `[host]` rate tables are the host measurements they cite: at each thread count, the median over every run of one
process of host_ops_bench.py and cpu_adam_bench.py kept under groundtruth/deepspeed/ (groundtruth/deepspeed/
host_tables.py reads them)."""

import importlib.util
import statistics

import pytest

from phantora.cluster import HostSpec
from phantora.paths import groundtruth_dir


def _host_tables():
    path = groundtruth_dir() / "deepspeed" / "host_tables.py"
    spec = importlib.util.spec_from_file_location("host_tables", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


HOST_TABLES = _host_tables()


@pytest.mark.parametrize("table", sorted(HOST_TABLES.TABLES))
def test_host_tables_are_the_medians_of_the_runs(table):
    rates = HOST_TABLES.single_process_rates()
    points = getattr(HostSpec(), table)
    assert [t for t, _ in points] == [t for t, _ in HOST_TABLES.tables()[table]], table
    for threads, gbps in points:
        runs = [rates[(op, threads)] for op in HOST_TABLES.TABLES[table]]
        assert min(len(r) for r in runs) >= HOST_TABLES.MIN_RUNS, (table, threads)
        assert gbps == pytest.approx(statistics.mean(statistics.median(r) for r in runs), rel=0.015), (table, threads)


def test_the_one_thread_points_pool_several_hosts():
    """One host's run is one draw (runs of one op on hosts of one kind differ by up to a third): the one-thread points
    pool runs of one process alone from at least five folders, each a machine start of its own."""
    import json
    from pathlib import Path
    folders = set()
    for results, system in HOST_TABLES.SOURCES:
        for line in (groundtruth_dir() / "deepspeed" / results).read_text().splitlines():
            row = json.loads(line) if line.strip() else {}
            alone = not row.get("tag", "").startswith("P=") or row["tag"].startswith("P=1,")
            if row and alone and row["omp_num_threads"] == "1":
                folders.add(Path(results).parent)
    assert len(folders) >= 5, folders


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
    rate = statistics.median(HOST_TABLES.single_process_rates()[("cpu_adam", 4)])
    seconds = memory.seconds(28e9, "cpu_adam")
    if threads == 4:           # a measured point: the median of the runs
        assert seconds == pytest.approx(28 / rate, rel=0.015)
    memory.seconds(1e9, "copy")
    lines = [ln for ln in capsys.readouterr().err.splitlines() if "host compute" in ln]
    assert len(lines) == 1 and f"runs at {threads} thread(s) per rank" in lines[0] and source in lines[0], lines
