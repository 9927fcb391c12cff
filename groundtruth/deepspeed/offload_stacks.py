"""Summarize offload_profile.sh's py-spy samples: where each rank's main thread spent its training steps.

    python groundtruth/deepspeed/offload_stacks.py OUT_DIR/offload-raw.txt [--write STACKS.txt]

py-spy's raw output has one line per distinct stack (process; thread; frames; sample count). Only the ranks' main
threads inside the workload's `train` are kept. Prints, per rank, the samples of the optimizer step's lines that
take the time, in seconds per step at the sampling rate (200 Hz over the run's 10 steps; steps 1-10 each run the
optimizer once, step 1 also initializes its state); with `--write` the kept stacks, process command lines and
directories left out, for the record.
"""

from __future__ import annotations

import argparse
import collections
import re

RATE_HZ = 200
STEPS = 10
# (label, the stack frame that identifies it)
PARTS = [
    ("CPU Adam (adam_update)", "DeepSpeedCPUAdam.step (deepspeed/ops/adam/cpu_adam.py:170)"),
    ("optimizer state init (zeros_like, step 1 only)", "DeepSpeedCPUAdam.step (deepspeed/ops/adam/cpu_adam.py:16"),
    ("fp32 -> bf16 copy of the updated partition", "DeepSpeedZeroOptimizer.step (deepspeed/runtime/zero/stage_1_and_2.py:3095)"),
    ("unscale and clip: grad.mul_", "DeepSpeedZeroOptimizer.unscale_and_clip_grads (deepspeed/runtime/zero/stage_1_and_2.py:3216)"),
]


def kept(path: str):
    """(rank process, frames, samples) of the main threads' stacks inside `train`."""
    for line in open(path):
        stack, _, n = line.rstrip("\n").rpartition(" ")
        parts = stack.split(";")
        procs = [p.split(":")[0] for p in parts if p.startswith("process ")]
        thread = next((p for p in parts if p.startswith("thread ")), "")
        frames = [p for p in parts if not p.startswith(("process ", "thread "))]
        if len(procs) < 2 or "MainThread" not in thread or not any(f.startswith("train (") for f in frames):
            continue
        if any(f.startswith(("initialize (", "build_model (", "init_distributed (", "_find_and_load (")) for f in frames):
            continue                    # loading and initialization, not the steps
        yield procs[1], frames, int(n)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("raw")
    p.add_argument("--write", default=None)
    a = p.parse_args()
    per_rank: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    out = []
    for proc, frames, n in kept(a.raw):
        c = per_rank[proc]
        c["training steps (train, after initialization)"] += n
        if any(f.startswith("DeepSpeedEngine.step (") for f in frames):
            c["optimizer step (DeepSpeedEngine.step)"] += n
        for label, frame in PARTS:
            if any(f.startswith(frame) for f in frames):
                c[label] += n
        out.append(f"{proc};" + ";".join(re.sub(r"\(/[^:]*/", "(", f) for f in frames) + f" {n}")
    for i, (proc, c) in enumerate(sorted(per_rank.items())):
        print(f"rank {i} ({proc}): samples at {RATE_HZ} Hz, seconds per step over {STEPS} steps")
        for key, n in c.most_common():
            print(f"  {n:6d}  {n / RATE_HZ / STEPS:6.3f} s  {key}")
    if a.write:
        with open(a.write, "w") as f:
            f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
