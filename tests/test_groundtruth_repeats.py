"""Repeated runs of a record's configuration (`metrics.iteration_s_repeats`): each value is the raw output the
record's notes cite, the schema refuses malformed repeats by their key, and a validation report sets the simulation
against the runs' range beside the error against the record."""

import json
import re

import pytest

from phantora.errors import PresetError
from phantora.groundtruth.schema import record_from_table
from phantora.groundtruth.checks import check_record
from phantora.groundtruth.store import find_contradictions, list_suites, load_suite
from phantora.paths import groundtruth_dir, project_root
from phantora_validation.compare import compare, summarize, CaseResult
from phantora_validation.report import format_table
from phantora_validation.runner import SimResult

CITED = re.compile(r"Repeated runs of the same configuration[^:]*: ([^\"]+?)\.(?:\s|$)")


def _records_with_repeats():
    out = []
    for suite in list_suites(groundtruth_dir()):
        out += [r for _, r in load_suite(suite, groundtruth_dir()) if r.metrics.iteration_s_repeats]
    return out


def test_each_repeat_is_the_run_its_record_cites():
    records = _records_with_repeats()
    assert len(records) >= 6
    for rec in records:
        found = CITED.search(rec.notes)
        assert found, f"{rec.id}: the notes do not say where the repeated runs are"
        files = [f.strip() for f in found.group(1).split(",")]
        assert len(files) == len(rec.metrics.iteration_s_repeats), rec.id
        for path, value in zip(files, rec.metrics.iteration_s_repeats):
            run = json.loads((project_root() / path).read_text())
            assert value == pytest.approx(run["median_step_s"], rel=1e-4), (rec.id, path)
            assert run["config"]["world_size"] == rec.hardware.gpus, (rec.id, path)


def _table(**metrics):
    rec = next(r for r in _records_with_repeats() if r.id == "h200-1-g1-z1-unet-sd15-b8")
    table = rec.to_table()
    table["metrics"] = {**{k: v for k, v in table["metrics"].items() if k != "iteration_s_repeats"}, **metrics}
    return table


@pytest.mark.parametrize("metrics, key, says", [
    ({"iteration_s_repeats": []}, "metrics.iteration_s_repeats", "at least one"),
    ({"iteration_s_repeats": [0.33, 0.0]}, "metrics.iteration_s_repeats[1]", "positive"),
    ({"iteration_s_repeats": [0.33], "iteration_s": None, "memory_gib": 30.0}, "metrics.iteration_s_repeats",
     "need metrics.iteration_s"),
    ({"iteration_s_repeats": [0.33], "iteration_s": None, "memory_allocated_gib": None, "oom": True},
     "metrics.iteration_s_repeats", "out-of-memory"),
])
def test_malformed_repeats_are_refused_by_their_key(metrics, key, says):
    table = _table(**metrics)
    table["metrics"] = {k: v for k, v in table["metrics"].items() if v is not None}
    with pytest.raises(PresetError) as err:
        record_from_table(table, file="rec.toml")
    assert f"key '{key}'" in str(err.value), err.value
    assert "rec.toml" in str(err.value) and says in str(err.value)


def test_a_repeat_in_another_unit_is_a_problem_of_its_key():
    """Repeats are seconds; one given in milliseconds (or a typo) is far from the record's own step."""
    rec = record_from_table(_table(iteration_s=0.335, iteration_s_repeats=[0.33, 330.0]))
    problems = check_record(rec).problems
    assert any("metrics.iteration_s_repeats[1]" in p for p in map(str, problems)), problems
    assert not any("iteration_s_repeats[0]" in p for p in map(str, problems)), problems


def test_a_value_inside_a_filed_records_runs_is_no_contradiction():
    """Another source's step inside the filed record's runs agrees with it; one well outside does not."""
    from pathlib import Path
    filed = record_from_table(_table(iteration_s=0.2122, iteration_s_repeats=[0.266, 0.293]))
    for value, contradicts in ((0.27, False), (0.2122 * 0.85, True), (0.293 * 1.2, True)):
        table = _table(iteration_s=value)
        table["source"] = {**table["source"], "contributor": "someone else", "section": "elsewhere"}
        found = find_contradictions(record_from_table(table), [(Path("filed.toml"), filed)])
        assert bool([c for c in found if c.metric == "iteration_s"]) == contradicts, (value, found)


@pytest.mark.parametrize("simulated", [0.30, 0.332, 0.36])
def test_the_report_sets_the_simulation_against_the_runs(simulated):
    rec = record_from_table(_table(iteration_s=0.335, iteration_s_repeats=[0.3334, 0.329]))
    rows = compare(rec, SimResult(iteration_s=simulated, memory_allocated_gib=20.0))
    row = next(r for r in rows if r.metric == "iteration_s")
    assert row.error == pytest.approx((simulated - 0.335) / 0.335)        # the record's error is unchanged
    lo, hi = 0.329, 0.335
    outside = row.spread_error
    if lo <= simulated <= hi:
        assert outside == 0.0
    else:
        edge = lo if simulated < lo else hi
        assert outside == pytest.approx((simulated - edge) / edge) and (outside < 0) == (simulated < lo)
    summary = summarize([CaseResult(rec.id, rows)])
    assert summary["spread_cases"] == 1 and summary["within_spread"] == (1 if outside == 0.0 else 0)
    text = format_table("deepspeed", [CaseResult(rec.id, rows)], summary)
    line = next(ln for ln in text.splitlines() if "iter (s), 3 runs" in ln)
    assert "0.329-0.335" in line and ("inside" in line) == (outside == 0.0)
    if outside != 0.0:
        assert f"{100 * outside:+.2f}% out" in line
    spread = row.as_dict()["spread"]
    assert (spread["fastest"], spread["slowest"], spread["runs"]) == (lo, hi, 3)
    assert spread["outside"] == pytest.approx(outside)
