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
FWD = ["main", "run_steps", "DeepSpeedEngine.forward", "conv"]
BWD = ["main", "run_steps", "DeepSpeedEngine.backward", "run_backward"]
OPT = ["main", "run_steps", "DeepSpeedEngine.step", "check"]


def _profile(main: list[tuple[list[str], float]], launcher: list[tuple[list[str], float]] = ()) -> dict:
    names: list[str] = []

    def rows(samples):
        out = []
        for stack, _ in samples:
            for n in stack:
                if n not in names:
                    names.append(n)
            out.append([names.index(n) for n in stack])
        return out

    threads = [('Process 1 Thread 1 "MainThread"', launcher), ('Process 2 Thread 2 "MainThread"', main)]
    profiles = [{"name": name, "samples": rows(s), "weights": [w for _, w in s]} for name, s in threads]
    return {"shared": {"frames": [{"name": n, "file": f"/x/site-packages/pkg/{n}.py", "line": 1} for n in names]},
            "profiles": profiles}


def test_steps_start_at_the_forward_after_an_optimizer_step():
    first = [(FWD, 0.5), (BWD, 0.5), (OPT, 0.2)]     # the first step: left out, however long py-spy made it
    step = [(FWD, 0.1), (FWD, 0.1), (BWD, 0.2), (OPT, 0.3)]
    main = [(["main", "build_model"], 5.0)] + first + step + [(["main", "between"], 0.05)] + step
    per_phase, leaves, n = step_phases.phases(_profile(main, launcher=[(FWD, 9.0)]))
    assert n == 2
    assert per_phase == {"forward": 0.4, "backward": 0.4, "step": 0.6}
    assert leaves["step"].most_common(1)[0][0] == "check (pkg/check.py:1)"
    assert {f["file"] for f in step_phases.kept(_profile(main))["shared"]["frames"]} == {
        f"pkg/{n}.py" for n in ("main", "build_model", "run_steps", "DeepSpeedEngine.forward", "conv",
                                "DeepSpeedEngine.backward", "run_backward", "DeepSpeedEngine.step", "check", "between")}


def test_a_phase_is_the_outermost_of_its_frames():
    nested = ["main", "run_steps", "DeepSpeedEngine.step", "DeepSpeedEngine.forward", "x"]
    per_phase, _, n = step_phases.phases(_profile([(FWD, 1.0), (OPT, 1.0), (FWD, 0.1), (nested, 0.2), (OPT, 0.3)]))
    assert n == 1 and per_phase == {"forward": 0.1, "step": 0.5}


def test_the_unet_profile_splits_into_its_measured_steps():
    """The committed py-spy profile of the one-GPU UNet row: every step of the run is found, the samples of steps
    2-12 add up to the workload's own step times less what py-spy dropped (817 errors of 24,287 samples, and a
    fixed weight a sample), and the optimizer step's largest part is DeepSpeed's overflow check."""
    with gzip.open(DATA / "g1-z1-unet-sd15-b8-pyspy.speedscope.json.gz", "rt") as f:
        profile = json.load(f)
    steps = json.loads((DATA / "g1-z1-unet-sd15-b8-pyspy.json").read_text())["step_times_s"]
    per_phase, leaves, n = step_phases.phases(profile)
    assert n == len(steps) - 1
    assert 0.85 < sum(per_phase.values()) / sum(steps[1:]) <= 1.0
    leaf, _ = leaves["step"].most_common(1)[0]
    assert leaf.startswith("has_inf_or_nan (deepspeed/runtime/utils.py")
    kept = json.dumps(step_phases.kept(profile))
    assert '"/' not in kept and ' /' not in kept                 # no absolute paths left
