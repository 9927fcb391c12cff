"""The DeepSpeed command that reproduces a ground-truth record (framework "deepspeed":
presets/workloads/deepspeed_gpt.py, built by phantora/frameworks/deepspeed/command.py)."""

from __future__ import annotations

from phantora.errors import PresetError
from phantora.frameworks.deepspeed import deepspeed_argv
from phantora.groundtruth.schema import Record

from .torchtitan import UnsupportedCase

STEPS = 6


def deepspeed_command(record: Record, *, python: str = "python", steps: int = STEPS) -> list[str]:
    wl = record.workload
    p = wl.parallelism
    if p.tp > 1 or p.cp > 1 or p.ep > 1:
        raise UnsupportedCase("the DeepSpeed workload has ZeRO data parallelism and the pipeline engine, no tensor, "
                              "context or expert parallelism")
    if wl.compile or wl.float8:
        raise UnsupportedCase("the DeepSpeed workload trains without torch.compile or FP8")
    try:
        return deepspeed_argv(model=wl.model, gpus=record.hardware.gpus, pp=p.pp, micro_batch=wl.micro_batch,
                              global_batch=wl.global_batch, seq=wl.seq_len,
                              activation_checkpointing=wl.activation_checkpointing, precision=wl.precision,
                              steps=steps, python=python, options=wl.options)
    except PresetError as exc:
        raise UnsupportedCase(str(exc)) from None
