"""Peak allocated memory in the records measured with the project's workloads: each `memory_allocated_gib` is the
`torch.cuda.max_memory_allocated` its run printed (the workload's SUMMARY), never a record's memory where only one
pipeline stage was read."""

from __future__ import annotations

import json

import pytest

from phantora.groundtruth.store import load_suite
from phantora.paths import groundtruth_dir

SUITES = ("local", "megatron", "deepspeed")


@pytest.mark.parametrize("suite", SUITES)
def test_allocated_memory_is_what_the_run_printed(suite):
    carried = 0
    for _, rec in load_suite(suite, groundtruth_dir()):
        if rec.metrics.oom:
            assert rec.metrics.memory_allocated_gib is None
            continue
        raw = json.loads((groundtruth_dir().parent / rec.source.section).read_text())
        if rec.workload.parallelism.pp > 1:             # rank 0 alone was read: not the largest over the GPUs
            assert rec.metrics.memory_allocated_gib is None, rec.id
            continue
        assert rec.metrics.memory_allocated_gib == pytest.approx(raw["peak_mem_gib"], abs=1e-3), rec.id
        carried += 1
    assert carried >= 12
