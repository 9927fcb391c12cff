"""Where a DeepSpeed workload's steps go on the host, from py-spy's samples of its main thread, in time order.

    py-spy record --subprocesses --threads --idle --nonblocking --rate 250 --format speedscope --output P.json -- \\
        torchrun --standalone --nproc-per-node 1 presets/workloads/deepspeed_unet.py ... --json-out S.json
    python groundtruth/deepspeed/step_phases.py P.json[.gz] S.json [--top 8] [--write KEPT.json.gz]

With `--idle` py-spy keeps every sample, waits included, in time order; each carries the sampling interval as its
weight (py-spy drops samples when it falls behind, so the sums run a little under the wall time). A step starts
where the main thread enters DeepSpeed's forward (`DeepSpeedEngine.forward`) for the first time after an optimizer
step (`DeepSpeedEngine.step`), inside the workload's `run_steps`. The first step is left out (the fused optimizer's
compilation, cuDNN's first plans, first kernel loads). Prints, per later step, the milliseconds in the forward,
backward and optimizer step (the outermost of those frames on the stack) and, per phase, the innermost frames that
take the most, beside the workload's own step times (S.json, its SUMMARY). `--write` keeps the profile with its
source files' paths cut to their package and the command lines' directories cut, for the record.
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


def phases(profile: dict) -> tuple[collections.Counter, dict, int]:
    """Seconds per phase and per (phase, innermost frame) over the steps after the first, and how many steps
    that is."""
    frames = profile["shared"]["frames"]
    label = [f"{f['name']} ({short(f.get('file') or '')}:{f.get('line')})" for f in frames]
    is_steps = {i for i, f in enumerate(frames) if f["name"] == "run_steps"}
    phase_of = {i: name for name, frame in PHASES for i, f in enumerate(frames) if f["name"] == frame}
    per_phase: collections.Counter = collections.Counter()
    leaves: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    steps = 0
    last = "step"                        # the phase of the previous sample inside the steps
    for stack, w in zip(*(main_thread(profile)[k] for k in ("samples", "weights"))):
        if not any(i in is_steps for i in stack):
            continue
        phase = next((phase_of[i] for i in stack if i in phase_of), "other")
        if phase == "forward" and last == "step":
            steps += 1                   # a new step's first forward
        if phase != "other":
            last = phase
        if steps < 2:
            continue
        per_phase[phase] += w
        leaves[phase][label[stack[-1]]] += w
    return per_phase, leaves, max(steps - 1, 0)


def kept(profile: dict) -> dict:
    """The profile with source paths cut to their package and command lines' directories cut."""
    out = json.loads(json.dumps(profile))
    for f in out["shared"]["frames"]:
        if f.get("file"):
            f["file"] = short(f["file"])
        if f["name"].startswith("/"):
            f["name"] = short(f["name"])
        elif f["name"].startswith("process "):
            f["name"] = re.sub(r"(?<=[\s\"])/\S*/", "", f["name"])
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("speedscope")
    p.add_argument("summary")
    p.add_argument("--top", type=int, default=8)
    p.add_argument("--write", default=None, metavar="KEPT.json.gz")
    a = p.parse_args()
    profile = load(a.speedscope)
    if a.write:
        with gzip.open(a.write, "wt") as f:
            json.dump(kept(profile), f)
    measured = load(a.summary)["step_times_s"]
    per_phase, leaves, n = phases(profile)
    if n == 0:
        raise SystemExit("fewer than two steps found (a forward after an optimizer step, inside run_steps)")
    own = sum(measured[1:]) / (len(measured) - 1)
    print(f"steps 2-{n + 1}: {sum(per_phase.values()) / n * 1e3:.1f} ms a step sampled "
          f"(the workload's own timing of steps 2-{len(measured)}: {own * 1e3:.1f} ms)")
    for phase, t in per_phase.most_common():
        print(f"{phase:10s} {t / n * 1e3:8.1f} ms a step")
        for leaf, v in leaves[phase].most_common(a.top):
            print(f"    {v / n * 1e3:7.2f}  {leaf}")


if __name__ == "__main__":
    main()
