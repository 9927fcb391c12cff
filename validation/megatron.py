"""The Megatron-core command that reproduces a ground-truth record (framework "megatron-core":
presets/workloads/megatron_gpt.py, built by phantora/frameworks/megatron/command.py)."""

from __future__ import annotations

from phantora.errors import PresetError
from phantora.frameworks.megatron import megatron_argv
from phantora.groundtruth.schema import Record

from .torchtitan import UnsupportedCase

STEPS = 6


def megatron_command(record: Record, *, python: str = "python", steps: int = STEPS) -> list[str]:
    wl = record.workload
    p = wl.parallelism
    if p.cp > 1 or p.ep > 1 or p.dp_shard > 1:
        raise UnsupportedCase("the Megatron-core workload has no context or expert parallelism, and its data "
                              "parallelism is replicated (dp_replicate, with options.distributed_optimizer)")
    if wl.compile or wl.float8 or wl.precision != "bf16":
        raise UnsupportedCase("the Megatron-core workload trains in bf16 without torch.compile or FP8")
    try:
        return megatron_argv(model=wl.model, tp=p.tp, pp=p.pp, micro_batch=wl.micro_batch,
                             global_batch=wl.global_batch, seq=wl.seq_len, recompute=wl.activation_checkpointing,
                             steps=steps, python=python, options=wl.options)
    except PresetError as exc:
        raise UnsupportedCase(str(exc)) from None
