"""The `moe` suite: the MoE trainer (presets/workloads/moe.py) measured on H200s (groundtruth/moe/), its records checked
against the SUMMARY lines of the raw logs they cite, and the commands that reproduce them (validation/moe.py).

No simulation runs here: tests/test_moe_workload.py runs the trainer under `phantora run`."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
import statistics
from pathlib import Path

import pytest
import torch

from phantora.errors import PresetError
from phantora.groundtruth.checks import check_record
from phantora.groundtruth.schema import Parallelism
from phantora.groundtruth.store import load_suite
from phantora.groundtruth.submit import canonical_text
from phantora.models import ModelSpec, load_model
from phantora.paths import groundtruth_dir, presets_dir
from phantora.routing import parse as parse_routing
from phantora_validation.cases import case_from_record, load_cases
from phantora_validation.moe import STEPS, WARMUP, moe_command, moe_run_options
from phantora_validation.runner import LiveRunner
from phantora_validation.torchtitan import UnsupportedCase

ROOT = groundtruth_dir().parent
SUITE = groundtruth_dir() / "moe"
LOGS = SUITE / "h200x2"
TRAINER = presets_dir() / "workloads" / "moe.py"
LOG_RE = re.compile(r"groundtruth/moe/h200x2/[\w.-]+\.log")


def _module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def trainer():
    return _module(TRAINER, "moe_trainer_under_test")


def summary(log: Path) -> dict:
    lines = [x for x in log.read_text().splitlines() if x.startswith("SUMMARY ")]
    assert len(lines) == 1, f"{log}: expected one SUMMARY line"
    return json.loads(lines[0][len("SUMMARY "):])


def records():
    return load_suite("moe", groundtruth_dir())


def cited_log(rec) -> Path:
    """The raw log a record names, in its source section and in its notes (the same one)."""
    in_section = LOG_RE.findall(rec.source.section)
    in_notes = LOG_RE.findall(rec.notes)
    assert len(in_section) == 1 and set(in_notes) == set(in_section), rec.id
    return ROOT / in_section[0]


# ------------------------------------------------------------------------------------------- records vs raw logs
def test_the_suite_has_one_record_per_measured_log():
    recs = records()
    assert len(recs) == 3
    cited = sorted(cited_log(rec).name for _, rec in recs)
    assert cited == sorted(p.name for p in LOGS.glob("moe-*.log"))


def test_every_record_matches_the_summary_line_of_its_log():
    for path, rec in records():
        assert path.stem == rec.id and rec.suite == "moe"
        s = summary(cited_log(rec))
        c = s["config"]
        # the log is self-consistent: its median is over the steps after the warm-up
        assert s["median_step_s"] == statistics.median(s["step_times_s"][c["warmup"]:])
        assert len(s["step_times_s"]) == c["steps"]
        wl, m = rec.workload, rec.metrics
        tokens = wl.micro_batch * wl.seq_len
        assert tokens == c["tokens"]
        assert m.iteration_s == pytest.approx(s["median_step_s"], rel=1e-4)
        assert m.tokens_per_s_per_gpu == pytest.approx(c["tokens"] / s["median_step_s"], rel=1e-5)
        assert m.memory_gib == s["peak_mem_gib"]
        assert rec.hardware.gpus == s["world_size"] and wl.global_batch == tokens * s["world_size"]
        assert wl.parallelism.ep == c["ep"]
        assert wl.options == {"route": c["route"]}
        model = load_model(wl.model)
        assert (model.num_experts, model.experts_per_token, model.dim, model.moe_ffn_dim, model.n_layers) == \
            (c["experts"], c["top_k"], c["dim"], c["ffn"], c["layers"])
        assert wl.framework == "phantora-moe" and wl.precision == "bf16" and c["device"] == "cuda"
        assert not check_record(rec, file=str(path)).problems


def test_the_records_are_what_make_records_files_from_the_logs():
    make = _module(SUITE / "make_records.py", "moe_make_records")
    for path, rec in records():
        again = make.record_of(cited_log(rec))
        assert again == rec
        assert canonical_text(again) == path.read_text()


def test_the_routes_are_balanced_and_zipf():
    routes = {(rec.hardware.gpus, rec.workload.options["route"]) for _, rec in records()}
    assert routes == {(1, "balanced"), (2, "balanced"), (2, "zipf:1.2")}


# ------------------------------------------------------------------------------------------------- the cases
def test_every_case_reruns_the_measured_trainer_configuration():
    mod = trainer()
    cases = load_cases("moe")
    assert len(cases) == 3
    for case in cases:
        rec = case.record
        assert case.runnable, case.unsupported
        s = summary(cited_log(rec))
        measured = s["config"]
        assert Path(case.command[1]) == TRAINER
        simulated = vars(mod.parse_args(case.command[2:]))
        # the same trainer configuration, steps and warm-up as measured; only the router differs: the simulated
        # one routes by top-k and `phantora run --routing` gives it the counts the measured one was forced to
        assert simulated.pop("route") == "topk"
        assert {k: v for k, v in measured.items() if k != "route"} == simulated
        assert (simulated["steps"], simulated["warmup"]) == (STEPS, WARMUP)
        assert case.run_options == ["--routing", measured["route"]]
        parse_routing(measured["route"])
        assert case.cluster == rec.hardware.cluster and case.nodes == 1
        # the simulated job has the measured GPU count, on the cluster of the measured GPU
        assert {1: "h200-1gpu", 2: "h200-2gpu-nvlink"}[s["world_size"]] == case.cluster


def test_the_live_runner_passes_the_routing_to_phantora_run(tmp_path):
    for case in load_cases("moe"):
        cmd = LiveRunner(["phantora"]).command(case, tmp_path / "t.h5", tmp_path / "s.json")
        sep = cmd.index("--")
        assert cmd[sep + 1:] == case.command
        options = cmd[:sep]
        assert options[options.index("--routing") + 1] == case.record.workload.options["route"]
        assert options[options.index("--tokens-per-iteration") + 1] == str(case.record.workload.tokens_per_step)
        assert options[options.index("--model") + 1] == "moe-stack-2048"


# ------------------------------------------------------------------------------------------- unsupported records
def _variant(**changes):
    _, rec = records()[1]                     # EP 2, balanced
    wl = rec.workload
    wl_changes = {k: v for k, v in changes.items() if k in {f.name for f in dataclasses.fields(wl)}}
    rec = dataclasses.replace(rec, workload=dataclasses.replace(wl, **wl_changes))
    if "gpus" in changes:
        g = changes["gpus"]
        rec = dataclasses.replace(rec, hardware=dataclasses.replace(rec.hardware, gpus=g, gpus_per_host=g))
    return rec


@pytest.mark.parametrize("changes, message", [
    ({"options": {}}, "options.route"),
    ({"options": {"route": "topk"}}, "score values"),
    ({"options": {"route": "file:loads.txt"}}, "loads:L0"),
    ({"options": {"route": "zipf:-1"}}, "Zipf exponent"),
    ({"options": {"route": "balanced", "capacity": 2}}, "no option 'capacity'"),
    ({"parallelism": Parallelism(dp_shard=2, ep=1)}, "ep = 2"),
    ({"parallelism": Parallelism(dp_shard=1, tp=2, ep=2)}, "tensor, pipeline or context"),
    ({"model": "mixtral-8x7b"}, "moe-stack"),
    ({"activation_checkpointing": "full"}, "checkpointing"),
    ({"global_batch": 65536}, "gradient accumulation"),
])
def test_records_the_trainer_cannot_express_are_unsupported_cases(changes, message):
    rec = _variant(**changes)
    with pytest.raises(UnsupportedCase, match=re.escape(message)):
        moe_command(rec)
    case = case_from_record(rec)
    assert not case.runnable and message in case.unsupported


def test_a_route_of_given_loads_runs_with_those_loads():
    rec = _variant(options={"route": "loads:4,3,2,1,1,1,1,1"})
    assert moe_run_options(rec) == ["--routing", "loads:4,3,2,1,1,1,1,1"]
    assert "--route" in moe_command(rec)
    assert moe_run_options(_variant(options={"route": "topk"})) == []


def test_experts_must_split_over_the_gpus():
    rec = _variant(gpus=4, global_batch=4 * 16384, parallelism=Parallelism(dp_shard=4, ep=4))
    assert "--ep" in moe_command(rec)                                   # 8 experts over 4 GPUs
    rec = _variant(gpus=3, global_batch=3 * 16384, parallelism=Parallelism(dp_shard=3, ep=3))
    with pytest.raises(UnsupportedCase, match="8 experts cannot be split over ep = 3"):
        moe_command(rec)


# ------------------------------------------------------------------------------------------------- the model
def test_the_model_preset_counts_the_trainers_parameters():
    mod = trainer()
    m = load_model("moe-stack-2048")
    a = mod.parse_args(["--experts", str(m.num_experts), "--top-k", str(m.experts_per_token), "--dim", str(m.dim),
                        "--ffn", str(m.moe_ffn_dim), "--layers", str(m.n_layers)])
    with torch.device("meta"):
        layers = torch.nn.ModuleList(mod.MoELayer(a, a.experts, torch.bfloat16) for _ in range(a.layers))
    params = dict(layers.named_parameters())
    assert m.num_params() == sum(p.numel() for p in params.values())
    experts = sum(p.numel() for n, p in params.items() if n.split(".")[-1] in ("w1", "w2", "w3"))
    assert m.num_active_params() == m.num_params() - experts + experts * a.top_k // a.experts
    assert m.attention_flops_per_token(1) == 0
    assert m.flops_per_token(1) == 6 * m.num_active_params()
    assert m.norm_eps == torch.finfo(torch.bfloat16).eps      # the trainer's RMSNorm(eps=None) in bf16


@pytest.mark.parametrize("change, key", [
    ({"n_heads": 8, "n_kv_heads": 8}, "n_heads"),
    ({"vocab_size": 1000}, "vocab_size"),
    ({"rope_theta": 10000.0}, "rope_theta"),
    ({"max_seq_len": 2048}, "max_seq_len"),
    ({"num_experts": 0, "experts_per_token": 0, "moe_ffn_dim": 0}, "num_experts"),
    ({"family": "mixtral"}, "n_heads"),
])
def test_a_moe_stack_preset_has_no_attention_and_a_decoder_needs_it(change, key):
    table = {f.name: getattr(load_model("moe-stack-2048"), f.name) for f in dataclasses.fields(ModelSpec)}
    table.update(change)
    with pytest.raises(PresetError) as exc:
        ModelSpec(**table).validate()
    assert exc.value.key == key
