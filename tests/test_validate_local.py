"""The `local` suite: records measured with the reference workload on 2 x H200 (groundtruth/local/), checked against
the raw output they were filed from, and the commands that reproduce them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from phantora.groundtruth.store import load_suite
from phantora.paths import groundtruth_dir
from phantora_validation.cases import case_from_record



def records():
    return load_suite("local", groundtruth_dir())


def test_every_local_record_matches_the_measurement_it_was_filed_from():
    recs = records()
    assert len(recs) >= 16
    assert sum(1 for _, rec in recs if rec.metrics.oom) >= 1
    for _, rec in recs:
        raw_path = groundtruth_dir().parent / rec.source.section          # a path of the repository
        if rec.metrics.oom:                                                # the run's log shows the OOM
            assert "OutOfMemoryError" in raw_path.read_text()
            continue
        raw = json.loads(raw_path.read_text())
        assert rec.metrics.tokens_per_s_per_gpu == pytest.approx(raw["tps_per_gpu"], rel=1e-4)
        assert rec.metrics.iteration_s == pytest.approx(raw["median_step_s"], rel=1e-4)
        # the peak the caching allocator handed to tensors, as the workload read it (max_memory_allocated)
        assert rec.metrics.memory_allocated_gib == pytest.approx(raw["peak_mem_gib"], abs=1e-3)
        cfg = raw["config"]
        wl = rec.workload
        assert (wl.micro_batch, wl.seq_len, wl.parallelism.tp) == (cfg["batch"], cfg["seq"], cfg["tp"])
        p = wl.parallelism
        assert p.dp_shard * p.dp_replicate * p.tp == cfg["world_size"] == rec.hardware.gpus
        # the workload's own throughput definition: global tokens per step / step time / GPUs
        assert raw["tps_per_gpu"] == pytest.approx(raw["global_tokens_per_step"] / raw["median_step_s"]
                                                   / cfg["world_size"], rel=1e-6)


def test_local_cases_rerun_the_reference_workload_with_the_records_settings():
    for path, rec in records():
        case = case_from_record(rec, path)
        assert case.runnable, case.unsupported
        cmd = case.command
        assert Path(cmd[1]).name == "llama.py"
        flag = lambda name: cmd[cmd.index(name) + 1]          # noqa: E731
        assert flag("--model") == rec.workload.model
        assert flag("--batch") == str(rec.workload.micro_batch)
        assert flag("--seq") == str(rec.workload.seq_len)
        assert flag("--tp") == str(rec.workload.parallelism.tp)
        assert flag("--ac") == {"none": "none", "full": "full", "selective-layer": "selective"}[
            rec.workload.activation_checkpointing]
        if rec.metrics.oom:
            continue
        # compiled and Float8 (with its recipe: options.float8) as the measured run's own config says
        cfg = json.loads((groundtruth_dir().parent / rec.source.section).read_text())["config"]
        if "compile" in cfg:                     # runs measured before the workload had the option have neither
            assert ("--compile" in cmd) == cfg["compile"], path
        if "float8" in cfg:
            assert (flag("--float8") if "--float8" in cmd else None) == cfg["float8"], path
