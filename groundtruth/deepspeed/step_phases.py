"""Where a DeepSpeed workload's steps go on the host, from py-spy's timed samples of its main thread.

    py-spy record --subprocesses --threads --idle --nonblocking --rate 250 --format speedscope --output P.json -- \\
        torchrun --standalone --nproc-per-node 1 presets/workloads/deepspeed_unet.py ... --json-out S.json
    python groundtruth/deepspeed/step_phases.py P.json[.gz] S.json [--top 8]

With `--idle` py-spy keeps every sample, waits included, in time order, each weighted by its interval: the samples of
the rank's main thread inside the workload's `run_steps` are its steps. The first step's samples (its length from the
workload's SUMMARY, S.json) are left out (compilation of the fused optimizer, cuDNN's first plans, first kernel
loads). Prints, per later step, the milliseconds in DeepSpeed's forward, backward and optimizer step
(`DeepSpeedEngine.forward`, `.backward`, `.step` on the stack) and, per phase, the innermost frames that take the
most.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import re

PHASES = (("forward", "DeepSpeedEngine.forward"), ("backward", "DeepSpeedEngine.backward"),
          ("step", "DeepSpeedEngine.step"))


def load(path: str) -> dict:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def short(path: str) -> str:
    """A source file's path from its package on (deepspeed/..., torch/...), or its name."""
    if "site-packages/" in path:
        return path.rsplit("site-packages/", 1)[1]
    m = re.search(r"(?:^|/)((?:deepspeed|diffusers|torch|torchvision|torch_geometric|transformers)/.*)$", path)
    return m.group(1) if m else path.rsplit("/", 1)[-1]


def main_thread(profile: dict) -> dict:
    """The sampled profile of the rank process's main thread (not torchrun's)."""
    mains = [p for p in profile["profiles"] if '"MainThread"' in p["name"]]
    if not mains:
        raise SystemExit("no thread named MainThread in the profile: was py-spy run with --threads?")
    return mains[-1]


def phases(profile: dict, first_step_s: float) -> tuple[collections.Counter, dict, float]:
    """Seconds per phase and per (phase, innermost frame) over the steps after the first; seconds in all of them."""
    frames = profile["shared"]["frames"]
    label = [f"{f['name']} ({short(f.get('file') or '')}:{f.get('line')})" for f in frames]
    is_steps = {i for i, f in enumerate(frames) if f["name"] == "run_steps"}
    phase_of = {i: name for name, frame in PHASES for i, f in enumerate(frames) if f["name"] == frame}
    thread = main_thread(profile)
    per_phase: collections.Counter = collections.Counter()
    leaves: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    clock = 0.0
    started = False
    total = 0.0
    for stack, w in zip(thread["samples"], thread["weights"]):
        inside = any(i in is_steps for i in stack)
        started = started or inside
        if not started:
            continue
        clock += w                       # time since the first step began, between steps too
        if clock <= first_step_s or not inside:
            continue
        total += w
        phase = next((phase_of[i] for i in stack if i in phase_of), "other")
        per_phase[phase] += w
        leaves[phase][label[stack[-1]]] += w
    return per_phase, leaves, total


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("speedscope")
    p.add_argument("summary")
    p.add_argument("--top", type=int, default=8)
    a = p.parse_args()
    steps = load(a.summary)["step_times_s"]
    per_phase, leaves, total = phases(load(a.speedscope), steps[0])
    n = len(steps) - 1
    print(f"steps 2-{len(steps)}: {total / n * 1e3:.1f} ms a step sampled inside run_steps "
          f"(the workload's own timing: {sum(steps[1:]) / n * 1e3:.1f} ms)")
    for phase, s in per_phase.most_common():
        print(f"{phase:10s} {s / n * 1e3:8.1f} ms a step")
        for leaf, t in leaves[phase].most_common(a.top):
            print(f"    {t / n * 1e3:7.2f}  {leaf}")


if __name__ == "__main__":
    main()
