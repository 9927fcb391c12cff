"""Bad input is refused where it enters, with the file or option and the key named, and never hangs.

Presets (cluster, GPU, model), `--set`, `--nodes`, `net bench`'s size options, the flow simulator's rates,
ground-truth submissions (NaN metrics, where records are filed) and `phantora-validate --json` (no path to a deleted
file). Commands that used to loop forever run in a subprocess with a timeout.
"""

from __future__ import annotations

import io
import json
import math
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from phantora.cli import main as phantora_main
from phantora.cluster import apply_overrides, cluster_dir, load_cluster
from phantora.errors import PhantoraError, PresetError, SimulationError
from phantora.gpus import gpu_dir, load_gpu
from phantora.groundtruth import store
from phantora.groundtruth.commands import groundtruth
from phantora.groundtruth.tomlwrite import dumps
from phantora.models import load_model, model_dir
from phantora.net import bench as bench_mod
from phantora.net.bench import RowProgress, sizes
from phantora.net.flowsim import FlowSim
from phantora.paths import groundtruth_dir
from phantora.tomlconf import check_number

TIMEOUT = 60          # seconds: every one of these commands answers in about one


def phantora(*args: str, cwd: str | Path | None = None) -> subprocess.CompletedProcess:
    """`phantora ARGS` in a subprocess; a hang fails the test through the timeout."""
    return subprocess.run([sys.executable, "-m", "phantora.cli", *args], capture_output=True, text=True,
                          timeout=TIMEOUT, cwd=cwd)


def numeric_leaves(table: dict, prefix: str = "") -> list[tuple[str, object]]:
    """(dotted key, value) of every int or float (not bool) in a nested table."""
    out = []
    for k, v in table.items():
        key = f"{prefix}.{k}" if prefix else k
        if isinstance(v, dict):
            out += numeric_leaves(v, key)
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out.append((key, v))
    return out


def set_leaf(table: dict, key: str, value) -> None:
    *parents, leaf = key.split(".")
    for p in parents:
        table = table[p]
    table[leaf] = value


MARK_FLOAT, MARK_INT = 123456.789, 987654321


def preset_with(path: Path, out: Path, key: str, literal: str) -> Path:
    """A copy of the preset at `path` whose `key` reads `literal` (e.g. nan, inf, -1.0)."""
    table = tomllib.loads(path.read_text())
    old = dict(numeric_leaves(table))[key]
    mark = MARK_INT if isinstance(old, int) else MARK_FLOAT
    set_leaf(table, key, mark)
    text = dumps(table)
    assert text.count(repr(mark)) == 1
    out.write_text(text.replace(repr(mark), literal))
    return out


# ------------------------------------------------------------------------------------------------ number checker
def test_check_number_refuses_each_bad_figure_naming_the_key():
    check_number(1.5, "a.b", positive=True)
    check_number(0, "a.b", nonnegative=True)
    for value, kw, words in ((math.nan, {}, "finite"), (math.inf, {}, "finite"), (-math.inf, {}, "finite"),
                             (0.0, {"positive": True}, "positive"), (-1, {"nonnegative": True}, "negative"),
                             (2.0, {"at_most": 1.0}, "at most"), (True, {}, "number"), ("3", {}, "number")):
        with pytest.raises(PresetError, match=words) as exc:
            check_number(value, "host.cpu_time_scale", file="f.toml", **kw)
        assert "f.toml" in str(exc.value) and "host.cpu_time_scale" in str(exc.value)


# ------------------------------------------------------------------------------------------------ cluster presets
H100 = load_cluster("h100-hgx", nodes=2)
CLUSTER_NUMBERS = [k for k, _ in numeric_leaves(H100.to_table())]


def test_the_cluster_has_numeric_fields_to_check():
    assert {"net.inter_node_gbps", "intra.nvlink_link_gbyte_per_s", "nodes", "vram_gib"} <= set(CLUSTER_NUMBERS)


@pytest.mark.parametrize("key", CLUSTER_NUMBERS)
@pytest.mark.parametrize("literal", ["nan", "inf", "-inf"])
def test_every_cluster_number_refuses_nan_and_inf_from_set(key, literal):
    with pytest.raises(PresetError) as exc:
        apply_overrides(H100, [f"{key}={literal}"])
    msg = str(exc.value)
    assert f"'{key}'" in msg and "--set" in msg


@pytest.mark.parametrize("key,value", [
    ("intra.nvlink_link_gbyte_per_s", "0"), ("intra.pcie_gbyte_per_s", "-1"), ("intra.hop_latency_us", "-1"),
    ("intra.nvlink_links_per_gpu", "-2"),
    ("net.inter_node_gbps", "0"), ("net.inter_node_gbps", "-400"), ("net.nic_efficiency", "0"),
    ("net.hop_latency_us", "-0.5"), ("net.oversubscription", "0.5"), ("net.nodes_per_leaf", "0"),
    ("net.spines", "0"), ("net.nics_per_node", "-1"), ("nccl.channels", "-1"), ("vram_gib", "-80"),
    ("nodes", "0"), ("gpus_per_node", "-8"),
])
def test_meaningless_cluster_figures_are_refused(key, value):
    with pytest.raises(PresetError) as exc:
        apply_overrides(H100, [f"{key}={value}"])
    assert f"'{key}'" in str(exc.value)


def test_nan_in_a_cluster_file_names_file_and_key(tmp_path):
    bad = preset_with(cluster_dir() / "h100-hgx.toml", tmp_path / "bad.toml", "net.inter_node_gbps", "nan")
    with pytest.raises(PresetError) as exc:
        load_cluster(str(bad), nodes=2)
    assert str(bad) in str(exc.value) and "'net.inter_node_gbps'" in str(exc.value)


def test_node_options_are_checked_and_named():
    for kw, option in (({"nodes": 0}, "--nodes"), ({"gpus_per_node": -1}, "--gpus-per-node")):
        with pytest.raises(PresetError, match=option):
            load_cluster("h100-hgx", **kw)


@pytest.mark.parametrize("value", ["nan", "inf", "0", "-5"])
def test_net_bench_with_a_bad_inter_node_rate_stops_with_the_key(value):
    r = phantora("net", "bench", "--nodes", "2", "-b", "1M", "-e", "2M", "--set", f"net.inter_node_gbps={value}")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "net.inter_node_gbps" in r.stderr and "--set" in r.stderr and "Traceback" not in r.stderr
    assert r.stdout == ""


# ------------------------------------------------------------------------------------------------ GPU presets
GPU_FILE = gpu_dir() / "h100-sxm-80gb.toml"
GPU_NUMBERS = [k for k, _ in numeric_leaves(tomllib.loads(GPU_FILE.read_text()))]


def test_the_gpu_preset_has_numeric_fields_to_check():
    assert {"memory_gib", "peak_tflops.bf16", "power.base_w", "tdp_w"} <= set(GPU_NUMBERS)


@pytest.mark.parametrize("key", GPU_NUMBERS)
def test_every_gpu_number_refuses_nan(key, tmp_path):
    bad = preset_with(GPU_FILE, tmp_path / "gpu.toml", key, "nan")
    with pytest.raises(PresetError) as exc:
        load_gpu(str(bad))
    assert str(bad.resolve()) in str(exc.value) and f"'{key}'" in str(exc.value)


@pytest.mark.parametrize("key", ["peak_tflops.fp32", "peak_tflops.bf16", "pcie_gbyte_per_s", "nvlink_gbyte_per_s",
                                 "l2_cache_mib", "tdp_w", "boost_clock_mhz", "memory_gib", "power.dynamic_exponent"])
def test_negative_gpu_figures_are_refused(key, tmp_path):
    bad = preset_with(GPU_FILE, tmp_path / "gpu.toml", key, "-1.0")
    with pytest.raises(PresetError) as exc:
        load_gpu(str(bad))
    assert f"'{key}'" in str(exc.value)


# ------------------------------------------------------------------------------------------------ model presets
MODEL_FILE = model_dir() / "llama3-8b.toml"
MODEL_NUMBERS = [k for k, _ in numeric_leaves(tomllib.loads(MODEL_FILE.read_text()))]


@pytest.mark.parametrize("key", MODEL_NUMBERS)
def test_every_model_number_refuses_nan(key, tmp_path):
    bad = preset_with(MODEL_FILE, tmp_path / "model.toml", key, "nan")
    with pytest.raises(PresetError) as exc:
        load_model(str(bad))
    assert str(bad.resolve()) in str(exc.value) and f"'{key}'" in str(exc.value)


@pytest.mark.parametrize("key", ["rope_theta", "norm_eps"])
def test_model_floats_refuse_inf_and_negatives(key, tmp_path):
    for i, literal in enumerate(("inf", "-1.0")):
        bad = preset_with(MODEL_FILE, tmp_path / f"model{i}.toml", key, literal)
        with pytest.raises(PresetError, match=key):
            load_model(str(bad))


# ------------------------------------------------------------------------------------------------ flow simulator
@pytest.mark.parametrize("capacity", [math.nan, math.inf, 0.0, -1.0])
def test_flow_simulator_refuses_a_rate_that_would_never_drain(capacity):
    with pytest.raises(SimulationError, match="link 1"):
        FlowSim(np.array([10.0, capacity]))


def test_flow_simulator_refuses_bad_latency_and_sizes():
    with pytest.raises(SimulationError, match="latency"):
        FlowSim(np.array([10.0]), np.array([math.nan]))
    sim = FlowSim(np.array([10.0]))
    with pytest.raises(SimulationError, match="non-finite"):
        sim.add_flows([np.array([0])], [math.nan], tag=1)
    sim.add_flows([np.array([0])], [20.0], tag=2)          # a good flow still runs to its end
    assert dict(sim.run()) == {2: pytest.approx(2.0)}


# ------------------------------------------------------------------------------------------------ net bench options
@pytest.mark.parametrize("args,option", [
    (["-b", "0"], "--min-bytes"), (["-f", "0"], "--step-factor"), (["-f", "1"], "--step-factor"),
    (["-b", "1M", "-e", "1K"], "--max-bytes"), (["-b", "inf"], "--min-bytes"), (["-e", "nan"], "--max-bytes"),
    (["-b", "-1K"], "--min-bytes"),
])
def test_net_bench_refuses_sizes_that_loop_or_give_no_row(args, option):
    r = phantora("net", "bench", *args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert option in r.stderr and "Traceback" not in r.stderr and r.stdout == ""


def test_sizes_refuses_the_same_ranges_itself():
    for args in ((0, 8, 2), (8, 8, 1), (8, 8, 0), (16, 8, 2)):
        with pytest.raises(Exception, match="size|factor"):
            sizes(*args)
    assert sizes(8, 64, 2) == [8, 16, 32, 64]


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_progress_is_silent_for_quick_work_and_counts_rows_for_long_work():
    clock, out = Clock(), io.StringIO()
    p = RowProgress(5, stream=out, clock=clock)
    for _ in range(5):
        clock.t += 0.1
        p.row("all_reduce")
    p.finish()
    assert out.getvalue() == ""                              # half a second: nothing

    clock, out = Clock(), io.StringIO()
    p = RowProgress(10, stream=out, clock=clock)
    for _ in range(10):
        clock.t += 1.5
        p.row("all_gather")
    p.finish()
    lines = out.getvalue().splitlines()
    assert lines[0] == "net bench: 2/10 rows (all_gather, 3 s)"
    assert lines[-1] == "net bench: 10/10 rows (all_gather, 15 s)"     # the last row, not repeated by finish()
    assert len(lines) == 5                                                # at most one line every 2 s


def test_large_world_is_announced_and_json_stdout_stays_clean(monkeypatch):
    monkeypatch.setattr(bench_mod, "LARGE_WORLD", 8)        # announce from 8 ranks: one HGX node is enough
    r = CliRunner().invoke(phantora_main, ["net", "bench", "-b", "1K", "-e", "4K", "--json"])
    assert r.exit_code == 0, r.output
    assert "net bench: 3 rows on 8 ranks" in r.stderr
    assert [row["size"] for row in json.loads(r.stdout)] == [1024, 2048, 4096]
    # below the threshold and quick (a clock that does not move, so a loaded machine cannot make it slow): nothing
    real = bench_mod.RowProgress
    monkeypatch.setattr(bench_mod, "RowProgress", lambda *a, **k: real(*a, **{**k, "clock": lambda: 0.0}))
    r = CliRunner().invoke(phantora_main, ["net", "bench", "--nodes", "1", "--gpus-per-node", "4", "-b", "1K",
                                           "-e", "4K", "--json"])
    assert r.exit_code == 0 and r.stderr == ""


# ------------------------------------------------------------------------------------------------ ground truth
RECORD = """
id = "run-a"
suite = "local"
[source]
date = 2025-03-01
contributor = "alice"
[hardware]
gpu = "h100-sxm-80gb"
gpus = 8
hosts = 1
gpus_per_host = 8
cluster = "h100-hgx"
intra_host_link = "nvswitch"
[workload]
framework = "torchtitan"
framework_version = "0.3.0"
model = "llama3-8b"
micro_batch = 2
global_batch = 16
seq_len = 8192
activation_checkpointing = "selective-op"
[workload.parallelism]
dp_shard = 8
[metrics]
{metrics}
"""


def fake_checkout(base: Path, name: str = "phantora") -> Path:
    (base / "groundtruth").mkdir(parents=True)
    (base / "pyproject.toml").write_text(f'[project]\nname = "{name}"\nversion = "0"\n')
    return base


@pytest.mark.parametrize("metrics,key", [
    ("tokens_per_s_per_gpu = nan", "metrics.tokens_per_s_per_gpu"),
    ("tokens_per_s_per_gpu = 6000.0\nmfu_percent = inf", "metrics.mfu_percent"),
    ("tokens_per_s = nan", "metrics.tokens_per_s"),
    ("mfu = -inf", "metrics.mfu"),
])
def test_submit_with_a_nan_metric_names_file_and_key(tmp_path, metrics, key):
    rec = tmp_path / "nan.toml"
    rec.write_text(RECORD.format(metrics=metrics))
    r = phantora("groundtruth", "submit", str(rec), "--dry-run", cwd=tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    assert str(rec) in r.stderr and f"'{key}'" in r.stderr and "finite" in r.stderr
    assert "Traceback" not in r.stderr


def test_checkout_is_found_from_a_subfolder(tmp_path):
    co = fake_checkout(tmp_path / "co")
    (co / "deep" / "er").mkdir(parents=True)
    assert store.find_checkout(co / "deep" / "er") == co.resolve()
    other = fake_checkout(tmp_path / "other", name="not-phantora")
    assert store.find_checkout(other) is None
    (tmp_path / "nogt").mkdir()
    (tmp_path / "nogt" / "pyproject.toml").write_text('[project]\nname = "phantora"\n')
    assert store.find_checkout(tmp_path / "nogt") is None   # no groundtruth/ folder: not a checkout


def test_submit_files_into_the_checkout_the_user_is_in(tmp_path, monkeypatch):
    monkeypatch.delenv("PHANTORA_HOME", raising=False)
    installed = tmp_path / "installed-groundtruth"
    installed.mkdir()
    monkeypatch.setattr(store, "groundtruth_dir", lambda: installed)
    co = fake_checkout(tmp_path / "co")
    (co / "sub").mkdir()
    rec = tmp_path / "rec.toml"
    rec.write_text(RECORD.format(metrics="tokens_per_s_per_gpu = 6000.0"))
    monkeypatch.chdir(co / "sub")
    r = CliRunner().invoke(groundtruth, ["submit", str(rec)])
    assert r.exit_code == 0, r.output
    target = co.resolve() / "groundtruth" / "local" / "run-a.toml"
    assert target.is_file() and f"filed {target}" in r.stdout and "checkout" in r.stderr
    assert not any(installed.rglob("*.toml"))
    r = CliRunner().invoke(groundtruth, ["list"])                # list reads the same folder
    assert r.exit_code == 0 and "run-a" in r.stdout

    # outside any checkout: the installed tree
    monkeypatch.chdir(tmp_path)
    rec.write_text(RECORD.format(metrics="tokens_per_s_per_gpu = 6000.0").replace('"alice"', '"bob"')
                   .replace('id = "run-a"', 'id = "run-b"'))
    r = CliRunner().invoke(groundtruth, ["submit", str(rec), "--force"])
    assert r.exit_code == 0, r.output
    assert (installed / "local" / "run-b.toml").is_file() and "installed" in r.stderr


def test_phantora_home_wins_over_the_checkout(tmp_path, monkeypatch):
    co = fake_checkout(tmp_path / "co")
    monkeypatch.chdir(co)
    (tmp_path / "home" / "presets").mkdir(parents=True)      # PHANTORA_HOME names a whole tree
    monkeypatch.setenv("PHANTORA_HOME", str(tmp_path / "home"))
    root, why = store.submission_root()
    assert root == (tmp_path / "home" / "groundtruth").resolve() and why == "PHANTORA_HOME"
    monkeypatch.delenv("PHANTORA_HOME")
    assert store.submission_root()[0] == co.resolve() / "groundtruth"
    monkeypatch.setenv("PHANTORA_HOME", str(tmp_path / "empty"))             # no presets/: refused, named
    with pytest.raises(PhantoraError, match="PHANTORA_HOME"):
        store.submission_root()


# ------------------------------------------------------------------------------------------------ validation
@pytest.fixture
def suite_root(tmp_path, monkeypatch):
    gt = tmp_path / "groundtruth"
    (gt / "torchtitan").mkdir(parents=True)
    for c in ("h100-8-llama3-8b-b2-fsdp", "a100-64-llama3-8b-b1-ac-sel-op"):
        shutil.copy(groundtruth_dir() / "torchtitan" / f"{c}.toml", gt / "torchtitan")
    monkeypatch.setattr(store, "groundtruth_dir", lambda: gt)
    return gt


class FileWritingRunner:
    """Writes a trace and a log into the case's folder like `phantora run`; fails the A100 case naming its log."""

    def __call__(self, case, workdir):
        from phantora_validation.runner import CaseFailed, SimResult
        (workdir / "run.log").write_text("the run's output\n")
        if case.id.startswith("a100"):
            raise CaseFailed(f"`phantora run` failed (status 1): boom (log: {workdir / 'run.log'})")
        (workdir / "trace.h5").write_bytes(b"trace")
        return SimResult(tokens_per_s_per_gpu=6000.0, trace=str(workdir / "trace.h5"))


def paths_in(text: str) -> list[str]:
    return [w.strip("(),:'\"") for w in text.split() if os.sep in w and w.strip("(),:'\"").startswith(os.sep)]


def test_validate_json_names_only_files_that_exist(suite_root, monkeypatch, tmp_path):
    import phantora_validation.cli as vcli
    monkeypatch.setattr(vcli, "make_runner", lambda cache, rerun=False, timeout_s=None: FileWritingRunner())
    monkeypatch.setattr(vcli.tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    r = CliRunner().invoke(vcli.main, ["--suite", "torchtitan", "--json"])
    data = json.loads(r.stdout)
    assert r.exit_code == 1                                    # one case failed
    work = Path(data["workdir"])
    assert work.is_dir() and work.parent == tmp_path / "tmp" and str(work) in r.stderr
    cases = {c["case"]: c for c in data["cases"]}
    trace = cases["h100-8-llama3-8b-b2-fsdp"]["trace"]
    assert trace and Path(trace).is_file()
    failure = cases["a100-64-llama3-8b-b1-ac-sel-op"]["failure"]
    named = paths_in(failure)
    assert named and all(Path(p).exists() for p in named)


def test_validate_with_given_workdir_and_cache_conflict(suite_root, monkeypatch, tmp_path):
    import phantora_validation.cli as vcli
    monkeypatch.setattr(vcli, "make_runner", lambda cache, rerun=False, timeout_s=None: FileWritingRunner())
    r = CliRunner().invoke(vcli.main, ["--suite", "torchtitan", "--json", "--workdir", str(tmp_path / "w")])
    data = json.loads(r.stdout)
    assert data["workdir"] == str(tmp_path / "w")
    assert (tmp_path / "w" / "h100-8-llama3-8b-b2-fsdp" / "trace.h5").is_file()
    r = CliRunner().invoke(vcli.main, ["--suite", "torchtitan", "--workdir", "w", "--cache", "c"])
    assert r.exit_code == 2 and "--workdir" in r.stderr and "--cache" in r.stderr


def test_run_cases_without_a_workdir_names_no_deleted_file(suite_root):
    from phantora_validation.cases import load_cases
    from phantora_validation.harness import run_cases
    results = run_cases(load_cases("torchtitan"), FileWritingRunner())
    text = json.dumps([r.as_dict() for r in results])
    assert all(Path(p).exists() for p in paths_in(text))
    by_id = {r.case: r for r in results}
    assert by_id["h100-8-llama3-8b-b2-fsdp"].sim.trace is None
    failure = by_id["a100-64-llama3-8b-b1-ac-sel-op"].failure
    assert failure.startswith("`phantora run` failed (status 1): boom") and "temporary folder" in failure
    assert "log:" not in failure


@pytest.mark.parametrize("args,option", [(["--timeout", "nan"], "--timeout"), (["--timeout", "0"], "--timeout"),
                                         (["--max-error", "-1"], "--max-error"), (["--max-error", "inf"], "--max-error")])
def test_validate_refuses_non_finite_or_negative_numbers(suite_root, args, option):
    import phantora_validation.cli as vcli
    r = CliRunner().invoke(vcli.main, ["--suite", "torchtitan", *args])
    assert r.exit_code == 2 and option in r.stderr and "finite" in r.stderr
