"""The `deepspeed` suite's workloads that are not language models (ResNet-50, Stable Diffusion 1.5's UNet, a GAT):
records checked against the SUMMARY files they cite, the commands that reproduce them, and what the record schema
refuses for them. No simulation runs here (tests/test_deepspeed_live.py runs the workloads under `phantora run`)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from phantora.errors import PresetError
from phantora.groundtruth.checks import check_record
from phantora.groundtruth.schema import Metrics
from phantora.groundtruth.store import load_suite
from phantora.groundtruth.submit import canonical_text
from phantora.paths import groundtruth_dir
from phantora_validation.cases import load_cases
from phantora_validation.runner import LiveRunner

from groundtruth_scripts import load_script

ROOT = groundtruth_dir().parent


def others():
    return [(p, r) for p, r in load_suite("deepspeed", groundtruth_dir()) if r.workload.task == "other"]


def cited(rec) -> dict:
    return json.loads((ROOT / rec.source.section).read_text())


def test_each_measured_non_language_workload_is_a_record():
    """Every SUMMARY of a non-LLM workload in the raw data is filed, once (3 workloads x 1 and 2 GPUs)."""
    summaries = {p.stem for p in (groundtruth_dir() / "deepspeed" / "h200x2").glob("*.json")
                 if json.loads(p.read_text()).get("workload") in ("deepspeed_resnet", "deepspeed_unet",
                                                                 "deepspeed_gat")}
    filed = {Path(r.source.section).stem for _, r in others()}
    assert len(summaries) == 6 and filed == summaries


def test_the_records_are_what_make_records_files_and_hold_the_measured_step():
    make = load_script("deepspeed/make_records.py")
    for path, rec in others():
        d = cited(rec)
        assert rec.metrics.iteration_s == pytest.approx(d["median_step_s"], abs=1e-5)
        assert rec.workload.model == d["model"] and rec.hardware.gpus == d["config"]["world_size"]
        again = make.other_record_of(ROOT / rec.source.section, rec.source.date)
        assert again == rec
        assert canonical_text(again) == path.read_text()
        assert not check_record(rec, file=str(path)).problems


def test_every_case_reruns_the_measured_configuration():
    cases = {c.id: c for c in load_cases("deepspeed")}
    for _, rec in others():
        case = cases[rec.id]
        assert case.runnable, case.unsupported
        c = cited(rec)["config"]
        argv = case.command
        assert Path(argv[1]).name == cited(rec)["workload"] + ".py"
        flags = dict(zip(argv[2::2], argv[3::2]))
        assert int(flags["--zero"]) == c["zero"] and flags["--precision"] == c["precision"]
        if "micro_batch" in c:
            assert int(flags["--batch"]) == c["micro_batch"]
        else:
            assert "--batch" not in argv
        # every shape the measured run reports in its config is passed, not left to the script's defaults
        for key in ("image_size", "nodes", "edges", "features", "classes", "layers", "heads", "hidden"):
            if key in c:
                assert int(flags["--" + key.replace("_", "-")]) == c[key], (rec.id, key)
        # the run has no tokens or model FLOPs to report
        run = LiveRunner(["phantora"]).command(case, Path("t.h5"), Path("s.json"))
        assert "--model" not in run[:run.index("--")] and "--tokens-per-iteration" not in run


@pytest.mark.parametrize("change, key", [
    ({"seq_len": 2048}, "workload.seq_len"),
    ({"task": "vision"}, "workload.task"),
])
def test_schema_refuses_a_malformed_other_workload(change, key):
    _, rec = others()[0]
    wl = dataclasses.replace(rec.workload, **change)
    with pytest.raises(PresetError, match=key.replace(".", r"\.")):
        dataclasses.replace(rec, workload=wl).workload.validate()


def test_schema_refuses_tokens_for_an_other_workload():
    _, rec = others()[0]
    bad = dataclasses.replace(rec, metrics=Metrics(tokens_per_s_per_gpu=1600.0))
    with pytest.raises(PresetError, match="metrics.tokens_per_s_per_gpu"):
        bad.validate()


def test_checks_name_an_unknown_workload():
    path, rec = others()[0]
    bad = dataclasses.replace(rec, workload=dataclasses.replace(rec.workload, model="vgg16"))
    problems = check_record(bad, file=str(path)).problems
    assert any("workload.model" in p and "resnet50" in p for p in problems)


def test_schema_refuses_other_workloads_of_a_framework_without_them_and_their_tokens_in_a_simulation():
    from phantora.groundtruth.schema import Simulation

    _, rec = others()[0]
    tt = dataclasses.replace(rec, workload=dataclasses.replace(rec.workload, framework="torchtitan"))
    with pytest.raises(PresetError, match=r"workload\.task"):
        tt.validate()
    sim = Simulation(phantora_version="0", date="2026-11-27", cost_source="profile", tokens_per_s_per_gpu=1600.0)
    with pytest.raises(PresetError, match=r"simulation\.tokens_per_s_per_gpu"):
        dataclasses.replace(rec, simulation=sim).validate()
    emb = dataclasses.replace(rec, metrics=dataclasses.replace(rec.metrics, mfu_counts_embedding=True))
    with pytest.raises(PresetError, match=r"mfu_counts_embedding"):
        emb.validate()


def test_a_simulated_other_workload_reports_no_tokens_or_mfu():
    """The harness reads a run's iteration time for such a record and derives no token throughput or MFU from its
    samples (what `phantora groundtruth submit --simulate` would attach)."""
    from phantora_validation.runner import parse_summary

    case = {c.id: c for c in load_cases("deepspeed")}[others()[0][1].id]
    res = parse_summary({"iteration_s": 0.08, "tokens_per_s_per_gpu": 1600.0, "mfu": 0.2}, case)
    assert res.iteration_s == 0.08 and res.tokens_per_s_per_gpu is None and res.mfu_percent is None
