"""The validation harness with an injected runner: errors, summary, OOM rule, exit status, JSON, report, plot.

Expected errors are computed here from the published record values and the fake runner's figures:
error = (simulated − measured) / measured. MFU is proportional to throughput for a fixed model, GPU and sequence
length, so a case's MFU error must equal its throughput error up to the rounding of the published MFU; the A100 tables' MFU counts 6 × all parameters plus
12 · layers · dim · seq attention FLOPs over the A100's 312 TFLOP/s dense BF16 peak (A100 datasheet).
"""

import json
import shutil

import pytest
from click.testing import CliRunner

import phantora_validation.cli as vcli
from phantora.groundtruth import store
from phantora.models import load_model
from phantora.paths import groundtruth_dir
from phantora_validation.cases import load_cases
from phantora_validation.compare import summarize
from phantora_validation.harness import run_cases
from phantora_validation.runner import CaseFailed, SimResult

A8B = "a100-64-llama3-8b-b1-ac-sel-op"          # 2973 tokens/s/GPU, 58.2% MFU (docs/performance.md)
OOM = "a100-64-llama2-70b-b2-ac-sel-op-oom"     # OOM (docs/performance.md at 559a52676)
H8 = "h100-8-llama3-8b-b2-fsdp"                 # 5762 tokens/s/GPU, 82.4 GiB (Table 1)
CASES = (A8B, OOM, H8)


@pytest.fixture
def root(tmp_path, monkeypatch):
    gt = tmp_path / "groundtruth"
    (gt / "torchtitan").mkdir(parents=True)
    for c in CASES:
        shutil.copy(groundtruth_dir() / "torchtitan" / f"{c}.toml", gt / "torchtitan")
    monkeypatch.setattr(store, "groundtruth_dir", lambda: gt)
    return gt


class FakeRunner:
    def __init__(self, results):
        self.results = results
        self.calls = []

    def __call__(self, case, workdir):
        self.calls.append(case.id)
        r = self.results[case.id]
        if isinstance(r, Exception):
            raise r
        return r


GOOD = {A8B: SimResult(tokens_per_s_per_gpu=2900.0, cost_source="cross-gpu"),
        OOM: SimResult(oom=True, cost_source="cross-gpu"),
        H8: SimResult(tokens_per_s_per_gpu=6000.0, memory_gib=80.0, cost_source="roofline")}


def e(sim, meas):
    return (sim - meas) / meas


def test_errors_and_summary(root):
    results = run_cases(load_cases("torchtitan"), FakeRunner(GOOD))
    by = {r.case: r for r in results}
    assert by[A8B].error == pytest.approx(e(2900, 2973))
    rows = {row.metric: row for row in by[A8B].rows}
    m = load_model("llama3-8b")
    hd = m.dim // m.n_heads
    params = (2 * m.vocab_size * m.dim + m.dim
              + m.n_layers * (2 * m.dim * m.dim + 2 * m.dim * m.n_kv_heads * hd + 3 * m.dim * m.ffn_dim + 2 * m.dim))
    fpt = 6 * params + 12 * m.n_layers * m.dim * 8192
    sim_mfu = 100 * 2900 * fpt / 312e12
    assert rows["mfu_percent"].simulated == pytest.approx(sim_mfu, rel=1e-6)
    assert rows["mfu_percent"].error == pytest.approx(e(sim_mfu, 58.2), rel=1e-6)
    assert rows["mfu_percent"].error == pytest.approx(e(2900, 2973), abs=1e-3)   # MFU ∝ throughput
    h = {row.metric: row for row in by[H8].rows}
    assert by[H8].error == pytest.approx(e(6000, 5762))
    assert h["memory_gib"].error == pytest.approx(e(80.0, 82.4))
    assert by[OOM].ok and by[OOM].error is None

    s = summarize(results)
    primaries = [abs(e(2900, 2973)), abs(e(6000, 5762))]
    assert s["avg_abs_error"] == pytest.approx(sum(primaries) / 2)
    assert s["max_abs_error"] == pytest.approx(max(primaries))
    assert s["max_case"] == H8
    assert (s["cases"], s["compared"], s["failed"]) == (3, 2, 0)
    assert (s["oom_cases"], s["oom_correct"], s["oom_mismatches"]) == (1, 1, 0)
    assert s["by_metric"]["memory_gib"]["max_abs_error"] == pytest.approx(abs(e(80.0, 82.4)))


def test_oom_mismatches_both_ways(root):
    results = run_cases(load_cases("torchtitan"), FakeRunner({
        A8B: SimResult(oom=True), OOM: SimResult(tokens_per_s_per_gpu=300.0), H8: GOOD[H8]}))
    by = {r.case: r for r in results}
    assert not by[A8B].ok and by[A8B].error is None
    assert not by[OOM].ok
    s = summarize(results)
    assert s["oom_mismatches"] == 2 and s["compared"] == 1


def test_failed_case_does_not_hide_the_others(root):
    runner = FakeRunner({**GOOD, A8B: CaseFailed("no torchtitan")})
    results = run_cases(load_cases("torchtitan"), runner, jobs=2)
    assert [r.case for r in results] == sorted(CASES)       # file order, whatever finished first
    assert {r.case: r.failure for r in results}[A8B] == "no torchtitan"
    assert summarize(results)["failed"] == 1


def test_case_selection(root):
    runner = FakeRunner(GOOD)
    run_cases(load_cases("torchtitan", ids=[H8]), runner)
    assert runner.calls == [H8]
    with pytest.raises(Exception, match="no case 'nope'"):
        load_cases("torchtitan", ids=["nope"])


def _run(monkeypatch, runner, *args):
    monkeypatch.setattr(vcli, "make_runner", lambda cache, rerun=False, timeout_s=None: runner)
    return CliRunner().invoke(vcli.main, ["--suite", "torchtitan", *args])


def test_cli_json_and_exit_status(root, monkeypatch):
    r = _run(monkeypatch, FakeRunner(GOOD), "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert set(data) >= {"cases", "summary"}
    assert data["summary"]["cases"] == 3
    assert data["summary"]["max_abs_error"] == pytest.approx(abs(e(6000, 5762)))
    assert {c["case"]: c["cost_source"] for c in data["cases"]}[H8] == "roofline"
    assert "[3/3]" in r.stderr                                   # progress while cases run
    limit = 100 * abs(e(6000, 5762))                             # about 4.1%
    assert _run(monkeypatch, FakeRunner(GOOD), "--max-error", f"{limit - 0.5}").exit_code == 1
    assert _run(monkeypatch, FakeRunner(GOOD), "--max-error", f"{limit + 0.5}").exit_code == 0
    bad = FakeRunner({**GOOD, OOM: SimResult(tokens_per_s_per_gpu=300.0)})
    assert _run(monkeypatch, bad, "--max-error", "50").exit_code == 1


def test_cli_table_report_and_plot(root, monkeypatch, tmp_path):
    md, png = tmp_path / "r.md", tmp_path / "r.png"
    r = _run(monkeypatch, FakeRunner(GOOD), "--report", str(md), "--plot", str(png))
    assert r.exit_code == 0, r.output
    for c in CASES:
        assert c in r.stdout and c in md.read_text()
    assert f"{100 * e(2900, 2973):+.2f}%" in r.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("option, path", [("--report", "/proc/r.md"), ("--plot", "/proc/r.png"),
                                          ("--workdir", "/proc/wd"), ("--cache", "/proc/vc")])
def test_outputs_that_cannot_be_written_are_refused_before_any_case_runs(root, monkeypatch, option, path):
    # /proc takes no new files or folders on Linux, whoever runs the test (root included)
    runner = FakeRunner(GOOD)
    r = _run(monkeypatch, runner, option, path)
    assert r.exit_code == 2 and f"{option} {path}" in r.stderr and "Traceback" not in r.output, r.output
    assert runner.calls == []


def test_unknown_case_is_an_input_error(root, monkeypatch):
    r = _run(monkeypatch, FakeRunner(GOOD), "--case", "nope")
    assert r.exit_code == 2 and "no case 'nope'" in r.stderr
