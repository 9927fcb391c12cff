"""Single-GPU steps simulated against the same steps measured on real GPUs (groundtruth/insitu/): the reference
workload, Llama 3 8B cut to 8 layers, one process, on an H100 and on an H200. Kernel costs come from the GPUs' own
profiles; a simulated step must land within 3% of the median measured step."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from phantora.paths import groundtruth_dir, project_root

RUNS = [("h100-sxm-80gb", "h100-hgx", "s4096-b2-none"), ("h100-sxm-80gb", "h100-hgx", "s8192-b1-sel"),
        ("h200-sxm-141gb", "h200-2gpu-nvlink", "s4096-b2-none"), ("h200-sxm-141gb", "h200-2gpu-nvlink", "s8192-b1-sel")]


def _workload_args(real: dict) -> list[str]:
    c = real["config"]
    return ["--model", real["model"], "--layers", str(real["shapes"]["n_layers"]), "--seq", str(c["seq"]),
            "--batch", str(c["batch"]), "--ac", c["ac"]]


@pytest.mark.parametrize("gpu,cluster,name", RUNS, ids=[f"{g}-{n}" for g, _, n in RUNS])
def test_single_gpu_step_matches_the_measured_step(gpu, cluster, name):
    real = json.loads((groundtruth_dir() / "insitu" / gpu / f"real-{name}.json").read_text())
    assert real["config"]["world_size"] == 1 and gpu.split("-")[0].upper() in real["device_name"].upper()
    cmd = [sys.executable, "-m", "phantora.cli", "run", "--cluster", cluster, "--nodes", "1", "--gpus-per-node", "1",
           "--", sys.executable, "presets/workloads/llama.py", *_workload_args(real), "--steps", "4"]
    done = subprocess.run(cmd, cwd=project_root(), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    m = re.search(r"iteration time\s+median ([0-9.]+) ms", done.stdout)
    assert m, done.stdout[-2000:]
    simulated = float(m.group(1)) / 1e3
    assert simulated == pytest.approx(real["median_step_s"], rel=0.03)
