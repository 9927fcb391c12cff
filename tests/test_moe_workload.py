"""The small MoE trainer (presets/workloads/moe.py) simulated against its measurement on H200s
(groundtruth/moe/h200x2, groundtruth/moe/measure.sh): one GPU holding all 8 experts, and expert parallelism 2 with
the router forced to balance and to a Zipf skew of 1.2 (the simulation routes by `--routing`).

The one-GPU step and the memory are held to the measurement. With expert parallelism each layer turns a Python list
of 32768 (balanced; 53156 on the busier GPU with Zipf) indices into a tensor while the GPU waits, host work that the
host-CPU model prices per element (`[host] to_tensor_ns`, docs/host-cpu.md "Conversions"); the EP steps are held to
the measurement too, and so is the cost of the skew: the Zipf step over the balanced one, measured 1.40.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MEASURED = ROOT / "groundtruth" / "moe" / "h200x2"
WORKLOAD = ROOT / "presets" / "workloads" / "moe.py"


def measured(name: str) -> dict:
    line = next(x for x in (MEASURED / f"{name}.log").read_text().splitlines() if x.startswith("SUMMARY "))
    return json.loads(line[len("SUMMARY "):])


def simulate(tmp_path, cluster: str, routing: str, ep: int) -> dict:
    summary = tmp_path / f"{cluster}-{routing}.json"
    cmd = [sys.executable, "-m", "phantora.cli", "run", "--cluster", cluster, "--routing", routing, "--no-trace",
           "--quiet", "--summary-json", str(summary), "--", "python", str(WORKLOAD), "--ep", str(ep), "--steps", "5",
           "--warmup", "2"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=str(ROOT))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(summary.read_text())


def test_one_gpu_step_and_memory_match_the_h200(tmp_path):
    real = measured("moe-1gpu-balanced")
    sim = simulate(tmp_path, "h200-1gpu", "balanced", 1)
    assert sim["iteration_s"] == pytest.approx(real["median_step_s"], rel=0.05)
    peak = max(sim["peak_memory_bytes"].values()) / 2**30
    assert peak == pytest.approx(real["peak_mem_gib"], rel=0.05)


def test_a_skewed_routing_costs_what_it_costs_on_two_h200s(tmp_path):
    balanced = simulate(tmp_path, "h200-2gpu-nvlink", "balanced", 2)["iteration_s"]
    skewed = simulate(tmp_path, "h200-2gpu-nvlink", "zipf:1.2", 2)["iteration_s"]
    real_balanced = measured("moe-ep2-balanced")["median_step_s"]
    real_skewed = measured("moe-ep2-zipf1.2")["median_step_s"]
    assert balanced == pytest.approx(real_balanced, rel=0.05)
    assert skewed == pytest.approx(real_skewed, rel=0.05)
    assert skewed / balanced == pytest.approx(real_skewed / real_balanced, rel=0.08)
