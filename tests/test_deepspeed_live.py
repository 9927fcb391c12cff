"""DeepSpeed 0.19.8 run unmodified under `phantora run` (presets/workloads/deepspeed_gpt.py, its default optimizer
choice: FusedAdam, stood in for in the ranks).

Checks, against the framework's behaviour and the physics of the kernels rather than recorded numbers:
- ZeRO-3 over 2 ranks with small parameter sub-groups (several inner optimizer steps per engine step): one
  iteration per engine step; each rank's Adam traffic per step is FusedAdam's, 28 bytes per element of its fp32
  partition (p, g, m, v read; p, m, v written); the gradients are reduce-scattered once per step in bf16, 2 bytes per
  parameter; the workload's own step times are the simulated iteration times;
- ZeRO-Offload's CPU Adam costs host time at the host preset's rate: halving `host.cpu_adam_gbps` adds exactly the
  bytes the loop moves (28 per element of the partition) over the halved rate to every step;
- ZeRO-Infinity's NVMe offload: halving the storage rates adds exactly the time of the 32 bytes a parameter DeepSpeed's
  swapper moves through storage each step;
- the model x framework table's DeepSpeed recipes parse.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from phantora.trace.reader import TraceReader

pytestmark = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None,
                                reason="deepspeed is not installed (pip install phantora[deepspeed])")

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "presets" / "workloads" / "deepspeed_gpt.py"
MODEL = "llama-tiny"


def phantora_run(tmp: Path, gpus: int, *args: str, cache: Path, run_args: tuple[str, ...] = (),
                 model: str = MODEL, env_extra: dict | None = None) -> tuple[Path, dict]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT)        # this tree's phantora and stubs, whichever copy is installed
    env["XDG_CACHE_HOME"] = str(cache)
    env.update(env_extra or {})
    trace = tmp / "t.h5"
    summary = tmp / "summary.json"
    proc = subprocess.run([sys.executable, "-m", "phantora.cli", "run", "--cluster", "h100-hgx", "--gpus-per-node",
                           str(gpus), "--overwrite", "--trace", str(trace), *run_args, "--", "python", str(SCRIPT),
                           "--model", model, "--json-out", str(summary), *args],
                          capture_output=True, text=True, timeout=900, cwd=str(tmp), env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return trace, json.loads(summary.read_text())


def window_ops(trace: TraceReader, rank: int, lo: float, hi: float, name: str) -> np.ndarray:
    names = trace.names
    ops = trace.ops(rank)
    sel = ops[(ops["issue"] >= lo) & (ops["issue"] < hi)]
    return sel[[names[i] == name for i in sel["name"]]]


def test_zero3_fused_adam_traffic_gradient_reduction_and_iterations(tmp_path, stub_cache):
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"zero_optimization": {"sub_group_size": 100000}}))
    steps = 3
    path, summary = phantora_run(tmp_path, 2, "--zero", "3", "--seq", "256", "--steps", str(steps),
                                 "--ds-config", str(config), cache=stub_cache)
    params = summary["params"]
    assert summary["config"]["optimizer"] == "FusedAdam"       # DeepSpeed's default, not torch's
    with TraceReader(path) as t:
        assert t.meta["complete_simulation"] is True
        for r in t.ranks:
            its = t.iterations(r)
            assert len(its) == steps                            # one per engine step, not per sub-group
            adam = window_ops(t, r, its[0], its[1], "aten._fused_adamw_.default")
            assert len(adam) >= 2                               # several sub-groups stepped
            partition = -(-params // 2)
            assert 28 * partition <= adam["nbytes"].sum() <= 28 * partition * 1.01
            rs = window_ops(t, r, its[0], its[1], "reduce_scatter")
            assert 2 * params <= rs["nbytes"].sum() <= 2 * params * 1.05
        sim = np.diff(t.iterations(0))
    assert abs(summary["step_times_s"][-1] - sim[-1]) <= 0.02 * sim[-1]


def test_pipeline_engine_sends_each_micro_batch_activation_and_gradient_once(tmp_path, stub_cache):
    """DeepSpeed's PipelineEngine over 2 stages: its metadata (shapes sent as small integer tensors before the first
    activation) reaches the next stage, and in a later step each stage sends, per micro-batch, exactly one bf16
    activation (forward) or its gradient (backward) of micro_batch x seq x dim elements."""
    import tomllib
    accum, seq, micro = 4, 256, 2
    path, summary = phantora_run(tmp_path, 2, "--pp", "2", "--zero", "1", "--seq", str(seq), "--micro-batch",
                                 str(micro), "--grad-accum", str(accum), "--steps", "3", cache=stub_cache)
    dim = tomllib.loads((ROOT / "presets" / "models" / f"{MODEL}.toml").read_text())["dim"]
    with TraceReader(path) as t:
        assert t.meta["complete_simulation"] is True
        for r in t.ranks:
            its = t.iterations(r)
            assert len(its) == 3
            sends = window_ops(t, r, its[0], its[1], "send")
            assert sends["nbytes"].sum() == accum * micro * seq * dim * 2, (r, sends["nbytes"])
    assert summary["config"]["pp"] == 2 and len(summary["step_times_s"]) == 3


def test_offloaded_cpu_adam_costs_its_bytes_at_the_host_rate(tmp_path, stub_cache):
    # a wide one-layer model: the CPU Adam step dominates and the partition is large
    model = tmp_path / "wide.toml"
    model.write_text('name = "wide"\ndim = 2048\nn_layers = 1\nn_heads = 16\nn_kv_heads = 8\nvocab_size = 32768\n'
                     'ffn_dim = 8192\nrope_theta = 500000.0\nnorm_eps = 1e-5\n')
    args = ("--zero", "2", "--seq", "128", "--steps", "3", "--offload-optimizer", "cpu")
    rate = 24.3
    times = {}
    for gbps in (rate, rate / 2):
        run = tmp_path / str(gbps)
        run.mkdir()
        _, summary = phantora_run(run, 1, *args, cache=stub_cache, model=str(model),
                                  run_args=("--set", f"host.cpu_adam_gbps=[[1, {gbps}], [16, {gbps}]]"),
                                  env_extra={"OMP_NUM_THREADS": "1"})
        times[gbps] = summary["step_times_s"][-1]
        params = summary["params"]
    extra = 28 * params / (rate / 2 * 1e9) - 28 * params / (rate * 1e9)
    assert abs((times[rate / 2] - times[rate]) - extra) <= 0.01 * extra, (times, extra)


def test_nvme_offload_moves_the_optimizer_state_through_storage_at_its_rate(tmp_path, stub_cache):
    """ZeRO-Infinity with the optimizer state on NVMe (DeepSpeed's async I/O stand-in): every step DeepSpeed's
    swapper writes each fp32 gradient partition to storage and reads it back for the step (8 bytes a parameter),
    reads the fp32 master weights and both Adam moments and writes them back (24), and the host waits for each
    transfer (no pipelining by default). Halving the storage rate must add exactly that traffic's time."""
    model = tmp_path / "wide.toml"
    model.write_text('name = "wide"\ndim = 2048\nn_layers = 1\nn_heads = 16\nn_kv_heads = 8\nvocab_size = 32768\n'
                     'ffn_dim = 8192\nrope_theta = 500000.0\nnorm_eps = 1e-5\n')
    args = ("--zero", "3", "--seq", "128", "--steps", "3", "--offload-optimizer", "nvme", "--nvme-path",
            str(tmp_path / "swap"))
    rate = 2.0
    times = {}
    for gbps in (rate, rate / 2):
        run = tmp_path / str(gbps)
        run.mkdir()
        table = f"[[1, {gbps}], [8, {gbps}]]"
        _, summary = phantora_run(run, 1, *args, cache=stub_cache, model=str(model),
                                  run_args=("--set", f"host.storage_read_gbps={table}",
                                            "--set", f"host.storage_write_gbps={table}"),
                                  env_extra={"OMP_NUM_THREADS": "1"})
        times[gbps] = summary["step_times_s"][-1]
        params = summary["params"]
    traffic = 32 * params / (rate / 2 * 1e9) - 32 * params / (rate * 1e9)
    extra = times[rate / 2] - times[rate]
    assert abs(extra - traffic) <= 0.01 * traffic, (times, traffic)
    assert not [p for p in (tmp_path / "swap").rglob("*") if p.is_file()], "the simulating machine wrote no swap file"


@pytest.mark.parametrize("scale", [1.0, 2.0])
def test_a_wait_for_storage_takes_the_bytes_over_the_rate_whatever_the_cpu_time_scale(scale):
    """The storage's time is not the framework's CPU time: `host.cpu_time_scale` must not stretch it."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run([sys.executable, "-m", "phantora.cli", "run", "--gpus-per-node", "1", "--no-trace",
                           "--set", "host.storage_write_gbps=[[1, 2.0], [8, 2.0]]",
                           "--set", f"host.cpu_time_scale={scale}", "--", "python",
                           str(ROOT / "tests" / "scripts" / "aio_wait.py")],
                          capture_output=True, text=True, timeout=300, cwd=str(ROOT), env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if "RESULT " in x)
    r = json.loads(line.split("RESULT ", 1)[1])
    assert r["done"] == 2
    expected = r["bytes"] / 2.0e9
    # the handle's own Python between the calls is host time too: a few microseconds
    assert expected <= r["seconds"] <= expected + 1e-3, (r, expected)


@pytest.mark.parametrize("script, args, params, needs", [
    # torchvision's resnet50() has 25,557,032 parameters; Stable Diffusion 1.5's UNet 859,520,964
    ("deepspeed_resnet.py", ("--batch", "4", "--image-size", "64"), 25_557_032, None),
    ("deepspeed_unet.py", ("--batch", "1"), 859_520_964, "diffusers"),
    ("deepspeed_gat.py", ("--nodes", "2000", "--edges", "20000"), None, "torch_geometric"),
])
def test_non_llm_workloads_train_with_one_iteration_per_step(tmp_path, stub_cache, script, args, params, needs):
    if needs and importlib.util.find_spec(needs) is None:
        pytest.skip(f"{needs} is not installed")
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT)        # this tree's phantora and stubs, whichever copy is installed
    env["XDG_CACHE_HOME"] = str(stub_cache)
    trace, summary = tmp_path / "t.h5", tmp_path / "s.json"
    proc = subprocess.run([sys.executable, "-m", "phantora.cli", "run", "--gpus-per-node", "2", "--trace", str(trace),
                           "--", "python", str(ROOT / "presets" / "workloads" / script), "--steps", "2",
                           "--json-out", str(summary), *args],
                          capture_output=True, text=True, timeout=900, cwd=str(tmp_path), env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    result = json.loads(summary.read_text())
    if params is not None:
        assert result["params"] == params
    with TraceReader(trace) as t:
        assert t.meta["complete_simulation"] is True
        assert all(len(t.iterations(r)) == 2 for r in t.ranks)


@pytest.mark.parametrize("script", ["deepspeed_resnet.py", "deepspeed_unet.py", "deepspeed_gat.py"])
def test_non_llm_kernel_profile_needs_the_recorded_steps(script):
    """--kernel-profile records steps 3-4 (workload_common.KERNEL_PROFILE_STEPS): with 3 steps the workload stops
    before any work with one line and status 2, as deepspeed_gpt.py and llama.py do."""
    proc = subprocess.run([sys.executable, str(ROOT / "presets" / "workloads" / script), "--kernel-profile", "d",
                           "--steps", "3"], capture_output=True, text=True, timeout=120)
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "--kernel-profile" in lines[0], proc.stderr[-2000:]


@pytest.mark.parametrize("zero, precision", [("0", "fp16"), ("0", "bf16"), ("2", "fp16")])
def test_optimizer_state_initialization_marks_no_iteration(tmp_path, stub_cache, zero, precision):
    """DeepSpeed's mixed-precision and ZeRO optimizers step their inner optimizer once while being built, to create
    its state: on a GPU that is set-up, not a training step. Three engine steps are three iterations (four marks
    made the first "iteration" run from `deepspeed.initialize` to the end of the first step)."""
    path, summary = phantora_run(tmp_path, 2, "--zero", zero, "--precision", precision, "--seq", "256", "--steps",
                                 "3", cache=stub_cache)
    with TraceReader(path) as t:
        for r in t.ranks:
            assert len(t.iterations(r)) == 3, r
        sim = np.diff(t.iterations(0))
    assert abs(summary["step_times_s"][-1] - sim[-1]) <= 0.02 * sim[-1]
