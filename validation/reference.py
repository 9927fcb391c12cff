"""The command that reproduces a record of the reference workload (framework "phantora-llama":
presets/workloads/llama.py, the trainer the `local` suite was measured with). Its Float8 records were measured with
torchao's tensorwise recipe (`--float8 tensorwise`)."""

from __future__ import annotations

from phantora.groundtruth.schema import Record
from phantora.paths import presets_dir

from .torchtitan import UnsupportedCase

STEPS = 6
AC = {"none": "none", "full": "full", "selective-layer": "selective"}


def reference_command(record: Record, *, python: str = "python", steps: int = STEPS) -> list[str]:
    wl = record.workload
    p = wl.parallelism
    if wl.activation_checkpointing not in AC:
        raise UnsupportedCase(f"the reference workload has no '{wl.activation_checkpointing}' checkpointing")
    if wl.activation_checkpointing == "selective-layer" and (wl.ac_layer_period or 2) != 2:
        raise UnsupportedCase("the reference workload's selective checkpointing is every second block only")
    if p.cp > 1 or p.ep > 1 or (p.dp_shard > 1 and p.dp_replicate > 1):
        raise UnsupportedCase("the reference workload has no context/expert parallelism or HSDP")
    dp_mode = "ddp" if p.dp_replicate > 1 else "fsdp"
    return [python, str(presets_dir() / "workloads" / "llama.py"), "--model", wl.model, "--dp-mode", dp_mode,
            "--tp", str(p.tp), "--pp", str(p.pp), "--batch", str(wl.micro_batch), "--seq", str(wl.seq_len),
            "--ac", AC[wl.activation_checkpointing], "--steps", str(steps), *(["--compile"] if wl.compile else []),
            *(["--float8", "tensorwise"] if wl.float8 else [])]
