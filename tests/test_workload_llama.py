"""The reference workload presets/workloads/llama.py, run for real on CPU under torchrun (gloo, fp32).

Every mode trains the llama-tiny preset cut to 2 layers on one fixed batch for a few steps. What is checked comes from
outside the script: the parameter count and FLOPs per token recomputed here from the preset's shapes (and, for the
released models, Meta's published counts), the loss of a freshly initialised model near ln(vocab) (near-uniform
predictions), the loss falling when one batch is learnt, activation checkpointing leaving the losses unchanged (it only
recomputes), and the SUMMARY's derived numbers recomputed from its own step times.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import math
import os
import socket
import statistics
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "presets" / "workloads" / "llama.py"
TINY = ROOT / "presets" / "models" / "llama-tiny.toml"
LAYERS, BATCH, SEQ, STEPS, PEAK_TFLOPS = 2, 2, 32, 4, 1.0
COMMON = ["--model", "llama-tiny", "--layers", str(LAYERS), "--device", "cpu", "--dtype", "fp32",
          "--batch", str(BATCH), "--seq", str(SEQ), "--steps", str(STEPS), "--fixed-batch", "--lr", "3e-3",
          "--peak-tflops", str(PEAK_TFLOPS)]
RUN_TIMEOUT_S = 300


# ---------------------------------------------------------------------------------------------------- helpers
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PHANTORA") and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                                          "MASTER_ADDR", "MASTER_PORT")}
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra)
    return env


@functools.lru_cache(maxsize=None)
def torchrun(nproc: int, args: tuple[str, ...]) -> tuple[subprocess.CompletedProcess, dict, list[dict]]:
    """Run the script under torchrun; (process, SUMMARY json, parsed step lines). Cached: AC tests reuse runs."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(nproc),
           "--master-addr", "127.0.0.1", "--master-port", str(free_port()), str(SCRIPT), *COMMON, *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=clean_env(), cwd=ROOT)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    summaries = [line for line in proc.stdout.splitlines() if line.startswith("SUMMARY ")]
    assert len(summaries) == 1, proc.stdout
    steps = []
    for line in proc.stdout.splitlines():
        if line.startswith("step "):
            words = line.split()
            steps.append({words[i]: words[i + 1] for i in range(0, len(words) - 1, 2)})
    return proc, json.loads(summaries[0].removeprefix("SUMMARY ")), steps


def run_script(*args: str, world: int = 1) -> subprocess.CompletedProcess:
    """The script without torchrun, with the environment one torchrun rank would have (no process group is made
    before the arguments are checked)."""
    env = clean_env(RANK="0", LOCAL_RANK="0", WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                    MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120,
                          env=env, cwd=ROOT)


def preset(path: Path = TINY) -> dict:
    with open(path, "rb") as f:
        return tomllib.load(f)


def expected_params(p: dict, layers: int) -> int:
    """Llama 3 parameters from the shapes: embedding + untied head (V × D each), final norm, and per block q/k/v/o,
    SwiGLU w1/w2/w3 and two RMSNorm weights."""
    d, h, kv, v, f = p["dim"], p["n_heads"], p["n_kv_heads"], p["vocab_size"], p["ffn_dim"]
    hd = d // h
    per_block = d * h * hd + 2 * d * kv * hd + h * hd * d + 3 * d * f + 2 * d
    return 2 * v * d + d + layers * per_block


def expected_flops_per_token(p: dict, layers: int, seq: int) -> int:
    """TorchTitan's MFU numerator: 6 × (parameters without the input embedding) + 12 × L × H × Dh × S."""
    hd = p["dim"] // p["n_heads"]
    return 6 * (expected_params(p, layers) - p["vocab_size"] * p["dim"]) + 12 * layers * p["n_heads"] * hd * seq


def load_module():
    spec = importlib.util.spec_from_file_location("llama_workload", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod          # dataclasses look their module up while the file executes
    try:
        spec.loader.exec_module(mod)
    finally:
        del sys.modules[spec.name]
    return mod


# ------------------------------------------------------------------------------------------------ the modes
# (id, ranks, options, expected (pp, dp, tp)); each is run with and without activation checkpointing.
MODES = {
    "ddp": (2, ("--dp-mode", "ddp"), (1, 2, 1)),
    "fsdp": (2, ("--dp-mode", "fsdp"), (1, 2, 1)),
    "tp2": (2, ("--tp", "2"), (1, 1, 2)),
    "pp2": (2, ("--pp", "2"), (2, 1, 1)),
    "tp2xfsdp2": (4, ("--tp", "2", "--dp-mode", "fsdp"), (1, 2, 2)),
    "pp2xfsdp2": (4, ("--pp", "2", "--dp-mode", "fsdp"), (2, 2, 1)),
    "pp2xddp2": (4, ("--pp", "2", "--dp-mode", "ddp"), (2, 2, 1)),
}
# The quick set covers every kind of parallelism and every AC option once; the rest is marked slow.
QUICK = {("ddp", "none"), ("fsdp", "full"), ("tp2", "selective"), ("pp2", "none")}
AC_OF = {"ddp": "full", "fsdp": "full", "tp2": "selective", "pp2": "full", "tp2xfsdp2": "full",
         "pp2xfsdp2": "selective", "pp2xddp2": "full"}
CASES = [pytest.param(mode, ac, id=f"{mode}-ac_{ac}",
                      marks=() if (mode, ac) in QUICK else (pytest.mark.slow,))
         for mode in MODES for ac in ("none", AC_OF[mode])]


def run_mode(mode: str, ac: str):
    nproc, opts, _ = MODES[mode]
    return torchrun(nproc, (*opts, "--ac", ac))


@pytest.mark.parametrize("mode,ac", CASES)
def test_mode_trains(mode, ac):
    nproc, _, (pp, dp, tp) = MODES[mode]
    _, s, steps = run_mode(mode, ac)
    p = preset()
    cfg = s["config"]
    assert (cfg["world_size"], cfg["pp"], cfg["dp"], cfg["tp"], cfg["ac"]) == (nproc, pp, dp, tp, ac)

    # Shapes: counted independently from the preset.
    assert s["params"] == expected_params(p, LAYERS)
    assert s["flops_per_token"] == expected_flops_per_token(p, LAYERS, SEQ)

    # Losses: finite; a fresh model predicts near-uniformly (cross-entropy ≈ ln V); one batch is learnt.
    losses = s["losses"]
    assert len(losses) == STEPS and all(math.isfinite(x) for x in losses)
    assert abs(losses[0] - math.log(p["vocab_size"])) < 1.5, losses
    assert all(b < a for a, b in zip(losses, losses[1:])), losses
    assert losses[-1] < 0.75 * losses[0], losses

    # The per-step log agrees with the summary.
    assert [int(x["step"]) for x in steps] == list(range(1, STEPS + 1))
    for line, loss, t in zip(steps, losses, s["step_times_s"]):
        assert float(line["loss"]) == pytest.approx(loss, abs=1e-4)
        assert float(line["time_s"]) == pytest.approx(t, abs=1e-4)
        assert "mem_gib" not in line          # no CUDA memory statistics on CPU

    # Derived numbers, recomputed from the step times: median without the warm-up step, tokens/s/GPU, MFU.
    times = s["step_times_s"]
    assert len(times) == STEPS and all(t > 0 for t in times)
    median = statistics.median(times[1:])
    tokens = dp * BATCH * SEQ
    assert s["global_tokens_per_step"] == tokens
    assert s["median_step_s"] == pytest.approx(median)
    assert s["tps_per_gpu"] == pytest.approx(tokens / median / nproc)
    assert s["mfu_pct"] == pytest.approx(100 * s["tps_per_gpu"] * s["flops_per_token"] / (PEAK_TFLOPS * 1e12))
    assert s["peak_mem_gib"] is None


@pytest.mark.slow
@pytest.mark.parametrize("mode", list(MODES))
def test_activation_checkpointing_does_not_change_the_losses(mode):
    """Checkpointing recomputes the forward in backward: the same numbers, so the same training trajectory."""
    _, plain, _ = run_mode(mode, "none")
    _, ckpt, _ = run_mode(mode, AC_OF[mode])
    assert ckpt["losses"] == pytest.approx(plain["losses"], rel=1e-4)


def test_json_out_is_the_summary(tmp_path):
    out = tmp_path / "summary.json"
    proc = run_script(*COMMON, "--steps", "2", "--json-out", str(out))
    assert proc.returncode == 0, proc.stderr
    line = [x for x in proc.stdout.splitlines() if x.startswith("SUMMARY ")]
    assert len(line) == 1
    assert json.loads(out.read_text()) == json.loads(line[0].removeprefix("SUMMARY "))
    assert json.loads(out.read_text())["config"]["world_size"] == 1


# ------------------------------------------------------------------------------------------- shapes only
@pytest.fixture(scope="module")
def workload():
    """The script imported as a module (its main() takes argv), for the checks that need no process group."""
    return load_module()


def describe(workload, capsys, *args: str) -> dict:
    assert workload.main(["--describe", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_describe_released_models_match_published_counts(workload, capsys):
    from phantora.models import load_model

    # Meta's Llama 3.1 8B and 70B: 8,030,261,248 and 70,553,706,496 parameters (the sums of the tensor shapes of
    # the released checkpoints; Hugging Face model cards "8.03B" / "70.6B"), recorded with sources in the presets.
    d8 = describe(workload, capsys, "--model", "llama3-8b", "--seq", "8192")
    assert d8["params"] == 8_030_261_248
    d70 = describe(workload, capsys, "--model", str(ROOT / "presets" / "models" / "llama3-70b.toml"), "--seq", "8192")
    assert d70["params"] == 70_553_706_496
    for d, name in ((d8, "llama3-8b.toml"), (d70, "llama3-70b.toml")):
        p = preset(ROOT / "presets" / "models" / name)
        assert d["params"] == expected_params(p, p["n_layers"])
        assert d["flops_per_token"] == expected_flops_per_token(p, p["n_layers"], 8192)
        # Phantora's model presets count the same (an independent implementation, phantora/models.py).
        spec = load_model(p["name"])
        assert d["params"] == spec.num_params()
        assert d["flops_per_token"] == spec.flops_per_token(8192)


def test_describe_tiny_model_and_layer_override(workload, capsys):
    p = preset()
    full = describe(workload, capsys, "--model", "llama-tiny", "--seq", "64")
    assert full["params"] == expected_params(p, p["n_layers"]) == 4_999_424   # the count the preset's notes state
    cut = describe(workload, capsys, "--model", "llama-tiny", "--layers", "1", "--seq", "64")
    assert cut["params"] == expected_params(p, 1)
    assert cut["flops_per_token"] == expected_flops_per_token(p, 1, 64)


def test_peak_flops_from_device_name(workload):
    # NVIDIA datasheets, dense BF16 tensor-core peaks: H100 SXM 989 TFLOP/s, H100 PCIe 756, H100 NVL 835 (per GPU),
    # H200 SXM 989, A100 312.
    assert workload.peak_tflops_for("NVIDIA H100 80GB HBM3") == 989.0
    assert workload.peak_tflops_for("NVIDIA H100 PCIe") == 756.0
    assert workload.peak_tflops_for("NVIDIA H100 NVL") == 835.0
    assert workload.peak_tflops_for("NVIDIA H200") == 989.0
    assert workload.peak_tflops_for("NVIDIA A100-SXM4-80GB") == 312.0
    assert workload.peak_tflops_for("NVIDIA GeForce RTX 3090") is None
    assert workload.peak_tflops_for(None) is None


# ------------------------------------------------------------------------------------------------ bad input
BAD = [
    pytest.param(4, ("--tp", "3"), "WORLD_SIZE", id="product-not-world"),
    pytest.param(2, ("--pp", "2", "--layers", "3"), "layers", id="layers-not-divisible-by-pp"),
    pytest.param(8, ("--tp", "8"), "n_kv_heads", id="kv-heads-not-divisible-by-tp"),
    pytest.param(2, ("--pp", "2", "--microbatches", "1"), "microbatches", id="fewer-microbatches-than-stages"),
    pytest.param(2, ("--pp", "2", "--batch", "3"), "batch", id="batch-not-divisible-by-microbatches"),
    pytest.param(4, ("--tp", "2", "--dp-mode", "ddp"), "ddp", id="ddp-with-tp"),
    pytest.param(1, ("--model", "no-such-model"), "no-such-model", id="unknown-model"),
    pytest.param(1, ("--steps", "0"), "steps", id="zero-steps"),
    pytest.param(1, ("--dp-mode", "zero3"), "dp-mode", id="unknown-choice"),
    # the in-situ profile records steps 3-4, so 3 steps cannot give it
    pytest.param(1, ("--kernel-profile", "d", "--steps", "3"), "kernel-profile", id="kernel-profile-too-few-steps"),
]


@pytest.mark.parametrize("world,args,word", BAD)
def test_bad_arguments_return_2_with_one_line(workload, capsys, monkeypatch, world, args, word):
    for key, value in dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE=str(world)).items():
        monkeypatch.setenv(key, value)
    assert workload.main(["--model", "llama-tiny", "--device", "cpu", *args]) == 2
    out = capsys.readouterr()
    lines = [x for x in out.err.splitlines() if x.strip()]
    assert len(lines) == 1, out.err
    assert lines[0].startswith("llama.py: error:") and word in lines[0]
    assert out.out == ""


def test_bad_arguments_exit_status_of_the_script():
    """The same check as a process, as torchrun sees it: status 2, one line, no traceback."""
    proc = run_script("--model", "llama-tiny", "--device", "cpu", "--tp", "3", world=4)
    assert proc.returncode == 2
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("llama.py: error:"), proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
