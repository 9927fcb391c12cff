"""Case runners: the TorchTitan command built from a record, the `phantora run` summary parser, and the trace cache
that re-validates by replay.

The cache test uses the synthetic FSDP workload (phantora/synthetic.py), whose kernels are all roofline-costed, on a
2-node cluster: replaying the cached trace on the same cluster must reproduce the live iteration time, and lowering the
inter-node bandwidth in the cluster file must make the replayed iteration slower without a new live run.
"""

import json
import statistics

import pytest

from phantora.cluster import load_cluster
from phantora.groundtruth.schema import RECORD_FRAMEWORKS, record_from_table
from phantora.groundtruth.store import load_suite
from phantora.groundtruth.tomlwrite import dumps
from phantora.paths import groundtruth_dir
from phantora.throughput import iteration_times
from phantora.simulate import simulate_streams
from phantora.synthetic import SyntheticModel, fsdp_streams
from phantora_validation.cases import WORKLOAD_COMMANDS, Case, case_from_record
from phantora_validation.runner import CachedRunner, CaseFailed, LiveRunner, parse_summary, trace_cost_sources
from phantora_validation.torchtitan import TORCH_RELEASES

GIB = 2**30


def flag(args, name):
    assert name in args, name
    return args[args.index(name) + 1]


def torchtitan_cases():
    return [case_from_record(r, p) for p, r in load_suite("torchtitan", groundtruth_dir())]


def _release_line(date: str) -> str | None:
    """The torch release line of a run of `date`: the first release published after that day (the run used that
    day's nightly or the latest release, whose development line it is); None after the last release listed."""
    import datetime

    day = datetime.date.fromisoformat(date)
    for release, published in TORCH_RELEASES:
        if day < datetime.date.fromisoformat(published):
            return release
    return None


def _release_tuple(release: str) -> tuple[int, int]:
    major, minor = release.split(".")[:2]
    return int(major), int(minor)


def test_torchtitan_command_follows_the_record():
    from phantora.frameworks import load_framework

    fw = load_framework("torchtitan")
    checked = 0
    releases = set()
    for case in torchtitan_cases():
        wl = case.record.workload
        # the software of the record's day: its torch release line, and before 2.9 flash attention first
        release = _release_line(case.record.source.date)
        opts = case.run_options
        if release is None:
            assert "--torch-cuda" not in opts and "--sdpa" not in opts
        else:
            releases.add(release)
            assert flag(opts, "--torch-cuda") == release
            if _release_tuple(release) < (2, 9):
                assert flag(opts, "--sdpa").startswith("flash")
            else:
                assert "--sdpa" not in opts
        recipe_2024 = release is not None and _release_tuple(release) < (2, 8)
        # per-layer checkpointing exists only in the 2024 recipe (TorchTitan 0.3.0 checkpoints per op)
        expressible = fw.recipe(wl.model).supported \
            and (wl.activation_checkpointing in ("none", "full", "selective-op")
                 or (wl.activation_checkpointing == "selective-layer" and recipe_2024 and not wl.float8))
        if not expressible:
            assert not case.runnable and case.unsupported
            continue
        checked += 1
        args = case.command
        assert args[:3] == ["python", "-m", "torchtitan.train"]
        # runs before torch 2.8 are TorchTitan's 2024 runs: its 2024 recipe (causal SDPA, whole-logit loss) on
        # 0.3.0's trainer
        # the published Float8 runs' tensorwise Float8 (FSDP Float8 all-gathers) is a config of its own on 0.3.0's
        # Llama (TorchTitan 0.3.0's own converter is rowwise)
        module = "phantora.frameworks.torchtitan.recipe_2024" if recipe_2024 else \
            "phantora.frameworks.torchtitan.float8_tensorwise" if wl.float8 else fw.recipe(wl.model).module
        assert flag(args, "--module") == module
        if wl.float8 and not recipe_2024:
            assert flag(args, "--config") == wl.model.replace("-", "_")
        layer_ac = wl.activation_checkpointing == "selective-layer"
        if recipe_2024:
            assert flag(args, "--config") == wl.model.replace("-", "_") + ("_ac_layer" if layer_ac else "") \
                + ("_float8" if wl.float8 else "")
        assert flag(args, "--training.local-batch-size") == str(wl.micro_batch)
        assert flag(args, "--training.seq-len") == str(wl.seq_len)
        assert flag(args, "--parallelism.data-parallel-shard-degree") == str(wl.parallelism.dp_shard)
        assert flag(args, "--parallelism.tensor-parallel-degree") == str(wl.parallelism.tp)
        # a compiled record turns TorchTitan's compile on after the flags that turn it off for eager runs
        assert ("--compile.enable" in args) == wl.compile
        if wl.compile:
            assert args.index("--compile.enable") > args.index("--compile.no-enable")
        if layer_ac:                 # the config sets the checkpointing: no sub-command may replace it
            assert not any(a.startswith("activation-checkpoint:") for a in args)
            continue
        ac = {"none": "none", "full": "full", "selective-op": "selective"}[wl.activation_checkpointing]
        assert args[-1] == f"activation-checkpoint:{ac}"      # tyro's sub-command comes last
    assert checked >= 3
    assert len(releases) >= 2          # the records span release lines, so the date matters


def test_live_command_wraps_the_training_command():
    case = next(c for c in torchtitan_cases() if c.record.hardware.hosts == 16)
    cmd = LiveRunner(["phantora"]).command(case, "t.h5", "s.json")
    assert cmd[:2] == ["phantora", "run"]
    assert flag(cmd, "--cluster") == case.record.hardware.cluster
    assert flag(cmd, "--nodes") == "16"
    assert flag(cmd, "--ranks") == "auto"
    wl = case.record.workload
    assert float(flag(cmd, "--tokens-per-iteration")) == wl.global_batch * wl.seq_len
    assert cmd[cmd.index("--") + 1:] == case.command
    for opt in case.run_options:                     # the software options come before the program
        assert cmd.index(opt) < cmd.index("--")


def test_every_framework_a_record_may_name_has_a_workload_command():
    assert set(WORKLOAD_COMMANDS) == set(RECORD_FRAMEWORKS)


def test_unsupported_case_fails_without_running(tmp_path):
    import dataclasses

    # a record TorchTitan's command cannot express: expert parallelism for a dense model
    record = next(c for c in torchtitan_cases() if c.id == "h100-8-llama3-8b-b2-fsdp").record
    wl = record.workload
    wl = dataclasses.replace(wl, parallelism=dataclasses.replace(wl.parallelism, ep=2))
    case = case_from_record(dataclasses.replace(record, workload=wl))
    assert not case.runnable
    with pytest.raises(CaseFailed, match="expert parallelism"):
        LiveRunner(["false"])(case, tmp_path)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("change, reason", [
    ({"activation_checkpointing": "selective-layer"}, "per-layer selective checkpointing"),
    ({"model": "llama2-13b"}, "no Float8 config|no tensorwise Float8 config"),
])
def test_float8_records_without_a_config_are_refused(change, reason):
    """A Float8 record runs the published runs' tensorwise Float8, which has configs for Llama 3 8B only and none
    with per-layer checkpointing: anything else is refused with the reason, not run."""
    import dataclasses

    from phantora_validation.torchtitan import UnsupportedCase, torchtitan_command

    for case in torchtitan_cases():
        if not case.record.workload.float8:
            continue
        record = dataclasses.replace(case.record, workload=dataclasses.replace(case.record.workload, **change))
        with pytest.raises(UnsupportedCase, match=reason):
            torchtitan_command(record)
        assert torchtitan_command(case.record)          # the record itself maps


def test_parse_summary_derives_missing_figures():
    case = next(c for c in torchtitan_cases() if c.id == "h100-8-llama3-8b-b2-fsdp")
    s = {"iteration_s": 3.0, "tokens_per_s_per_gpu": None, "mfu": 0.35, "oom": False,
         "peak_memory_bytes": {"0": 70 * GIB, "1": 75 * GIB}, "peak_allocated_bytes": {"0": 61 * GIB, "1": 60 * GIB}}
    res = parse_summary(s, case)
    assert res.tokens_per_s_per_gpu == pytest.approx(16 * 8192 / 3.0 / 8)
    assert res.memory_gib == pytest.approx(75.0)
    assert res.memory_allocated_gib == pytest.approx(61.0)          # the largest over the ranks, as memory_gib
    assert res.mfu_percent == pytest.approx(35.0)
    assert parse_summary({"oom": True}, case).oom


# --------------------------------------------------------------------------------------------- cache and replay
RECORD = {
    "id": "synthetic", "suite": "s",
    "source": {"date": "2025-01-01", "contributor": "test"},
    "hardware": {"gpu": "h100-sxm-80gb", "gpus": 4, "hosts": 2, "gpus_per_host": 2, "cluster": "h100-hgx",
                 "intra_host_link": "nvswitch", "inter_host_gbps_per_gpu": 400.0},
    "workload": {"framework": "synthetic", "framework_version": "0", "model": "llama-tiny", "micro_batch": 1,
                 "global_batch": 4, "seq_len": 256, "activation_checkpointing": "none",
                 "parallelism": {"dp_shard": 4}},
    "metrics": {"tokens_per_s_per_gpu": 1000.0},
}


class SyntheticLive:
    """Stands in for `phantora run`: simulates a synthetic FSDP step on the case's cluster and writes its outputs."""

    def __init__(self):
        self.calls = 0

    def __call__(self, case, workdir):
        self.calls += 1
        spec = load_cluster(case.cluster, nodes=case.nodes)
        streams, sigs, meta = fsdp_streams(spec, SyntheticModel(dim=256, layers=2, ffn=704, vocab=1000, seq=256),
                                           iterations=3)
        engine = simulate_streams(spec, streams, workdir / "trace.h5", signatures=sigs, meta=meta)
        its = iteration_times({r: rs.iterations for r, rs in engine.ranks.items()})
        summary = {"iteration_s": statistics.median(its), "oom": False,
                   "peak_memory_bytes": {str(r): rs.allocator.stats["reserved_bytes.all.peak"]
                                         for r, rs in engine.ranks.items()},
                   "peak_allocated_bytes": {str(r): rs.allocator.stats["allocated_bytes.all.peak"]
                                            for r, rs in engine.ranks.items()}}
        (workdir / "summary.json").write_text(json.dumps(summary))
        return parse_summary(summary, case)


def test_cache_replays_and_sees_a_changed_network(tmp_path):
    cluster = tmp_path / "two-nodes.toml"
    spec = load_cluster("h100-hgx", nodes=2, gpus_per_node=2)
    cluster.write_text(dumps(spec.to_table()))
    rec = record_from_table(RECORD)
    case = Case(id=rec.id, suite=rec.suite, record=rec, cluster=str(cluster), nodes=2, command=["train"])
    live = SyntheticLive()
    runner = CachedRunner(tmp_path / "cache", live)

    first = runner(case)
    assert (first.mode, live.calls) == ("live", 1)
    assert runner.cached(case)

    again = runner(case)
    assert (again.mode, live.calls) == ("replay", 1)
    # premise: the synthetic step's exposed communication outlasts its kernels, so re-costing them (from the
    # roofline to the H100 profile) leaves the step where the network puts it
    from phantora.trace.reader import TraceReader
    from phantora.trace.summary import summarize

    with TraceReader(again.trace) as rd:
        r0 = summarize(rd)["ranks"][0]
    assert r0["exposed_communication"] > r0["compute"]
    assert again.iteration_s == pytest.approx(first.iteration_s, rel=1e-9)
    # the live run costed its kernels by the roofline; the replay re-costs them from today's H100 profile and
    # reports its own sources
    assert trace_cost_sources(again.trace) == {"roofline": 1.0}
    assert again.cost_sources.get("profile", 0.0) > 0.0
    assert again.memory_gib == pytest.approx(first.memory_gib)
    assert again.memory_allocated_gib == pytest.approx(first.memory_allocated_gib)
    assert 0 < first.memory_allocated_gib <= first.memory_gib         # tensors get part of what the allocator holds

    table = spec.to_table()
    table["net"]["inter_node_gbps"] = 25.0
    cluster.write_text(dumps(table))
    slower = runner(case)
    assert (slower.mode, live.calls) == ("replay", 1)
    assert slower.iteration_s > again.iteration_s

    # a damaged summary (not a live run's) is no cache: the case runs live again
    summary = runner.folder(case) / "summary.json"
    kept = summary.read_text()
    summary.write_text("{}")
    assert not runner.cached(case)
    summary.write_text(kept)
    # a damaged trace fails the case, naming the way out
    trace = runner.folder(case) / "trace.h5"
    data = trace.read_bytes()
    trace.write_bytes(data[: len(data) // 3])
    with pytest.raises(CaseFailed, match="--rerun runs the case live again"):
        runner(case)
    trace.write_bytes(data)

    changed = record_from_table({**RECORD, "workload": {**RECORD["workload"], "seq_len": 512}})
    case2 = Case(id=rec.id, suite=rec.suite, record=changed, cluster=str(cluster), nodes=2, command=["train"])
    assert not runner.cached(case2)
    assert runner(case2).mode == "live" and live.calls == 2


def test_ranks_auto_reads_the_pipeline_degree_of_a_torchtitan_command():
    """`--ranks auto` runs one process per pipeline stage: it must read the degree from the command line that
    torchtitan_argv builds (tyro takes hyphenated flags), and from the underscore spelling TorchTitan also takes."""
    from phantora.frameworks.torchtitan import torchtitan_argv
    from phantora.live.ranks import plan_ranks

    argv = torchtitan_argv("llama3-8b", assets_dir="assets", dp_shard=4, pp=4, steps=2)
    plan = plan_ranks("auto", 16, argv)
    assert plan.pp_degree == 4 and plan.simulated == [0, 4, 8, 12]
    underscored = [a.replace("pipeline-parallel-degree", "pipeline_parallel_degree") for a in argv]
    assert plan_ranks("auto", 16, underscored).simulated == [0, 4, 8, 12]


def test_parallel_cases_prepare_one_complete_asset_folder(tmp_path, monkeypatch):
    """Cases run with --jobs N prepare their model's assets at the same time: every one must find a whole
    tokenizer and dataset, and no half-written folder may be left behind."""
    from concurrent.futures import ThreadPoolExecutor

    from phantora.frameworks.torchtitan.assets import DATASET_DIR, DATASET_FILE, TOKENIZER_DIR
    from phantora_validation.torchtitan import assets_root, prepare_assets

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    stale = assets_root() / "llama3-8b"
    stale.mkdir(parents=True)                    # what an interrupted older writer leaves: no tokenizer
    (stale / "partial").write_text("")
    with ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(prepare_assets, ["llama3-8b"] * 4))
    assert len(set(outs)) == 1
    out = outs[0]
    assert json.loads((out / TOKENIZER_DIR / "tokenizer.json").read_text())["model"]["vocab"]
    lines = (out / DATASET_DIR / DATASET_FILE).read_text().splitlines()
    assert lines and all(json.loads(line)["text"] for line in lines)
    assert not (out / "partial").exists()
    assert sorted(p.name for p in out.parent.iterdir()) == ["llama3-8b"]
