"""groundtruth/deepspeed/step_phases.py: a DeepSpeed step's host time by phase, from py-spy's timed samples."""

from __future__ import annotations

import gzip
import json
import sys

from phantora.paths import project_root

ROOT = project_root()
sys.path.insert(0, str(ROOT / "groundtruth" / "deepspeed"))

import step_phases  # noqa: E402

DATA = ROOT / "groundtruth" / "deepspeed" / "h200-unet"


def _profile(samples: list[tuple[list[str], float]]) -> dict:
    names: list[str] = []
    rows = []
    for stack, _ in samples:
        for n in stack:
            if n not in names:
                names.append(n)
        rows.append([names.index(n) for n in stack])
    return {"shared": {"frames": [{"name": n, "file": f"/x/site-packages/pkg/{n}.py", "line": 1} for n in names]},
            "profiles": [{"name": 'Process 1 Thread 1 ""', "samples": [], "weights": []},
                         {"name": 'Process 2 Thread 2 "MainThread"', "samples": rows,
                          "weights": [w for _, w in samples]}]}


def test_phases_leave_out_the_first_step_and_the_time_before_the_steps():
    load = ["main", "build_model"]
    fwd = ["main", "run_steps", "DeepSpeedEngine.forward", "conv"]
    bwd = ["main", "run_steps", "DeepSpeedEngine.backward", "run_backward"]
    opt = ["main", "run_steps", "DeepSpeedEngine.step", "check"]
    samples = [(load, 5.0),                                   # before the steps: not counted
               (fwd, 0.5), (bwd, 0.5), (opt, 1.0),            # the first step, 2 s
               (fwd, 0.1), (bwd, 0.2), (opt, 0.3), (["main", "between"], 0.05),
               (fwd, 0.1), (bwd, 0.2), (opt, 0.3)]
    per_phase, leaves, total = step_phases.phases(_profile(samples), first_step_s=2.0)
    assert per_phase["forward"] == 0.2 and per_phase["backward"] == 0.4 and per_phase["step"] == 0.6
    assert abs(total - 1.2) < 1e-12                           # outside run_steps between steps: not a phase
    assert leaves["step"].most_common(1)[0][0] == "check (pkg/check.py:1)"


def test_the_unet_profile_splits_into_its_measured_steps():
    """The committed py-spy profile of the one-GPU UNet row: the samples inside the steps after the first add up to
    the workload's own step times, within py-spy's misses (it reports 817 errors of 24,287 samples), and the
    optimizer step's largest part is DeepSpeed's overflow check."""
    with gzip.open(DATA / "g1-z1-unet-sd15-b8-pyspy.speedscope.json.gz", "rt") as f:
        profile = json.load(f)
    steps = json.loads((DATA / "g1-z1-unet-sd15-b8-pyspy.json").read_text())["step_times_s"]
    per_phase, leaves, total = step_phases.phases(profile, steps[0])
    measured = sum(steps[1:])
    assert 0.8 * measured < total <= measured
    assert set(per_phase) >= {"forward", "backward", "step"}
    leaf, _ = leaves["step"].most_common(1)[0]
    assert leaf.startswith("has_inf_or_nan (deepspeed/runtime/utils.py")
