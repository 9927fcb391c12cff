"""The TorchTitan command that reproduces a ground-truth record.

`torchtitan_args(record)` is the one place where a record's workload becomes TorchTitan (0.3.0) flags; tune it here.
`torchtitan_command(record)` is the whole training command (`python -m torchtitan.train ...`) that the case runner
puts after `phantora run ... --`.
"""

from __future__ import annotations

import os
from pathlib import Path

from phantora.errors import PhantoraError
from phantora.groundtruth.schema import Record

STEPS = 6            # optimizer steps per simulated run: the first is set-up, the rest give the median iteration

# record's activation checkpointing -> TorchTitan 0.3.0's sub-command (its selective AC is per-op only)
AC_COMMANDS = {"none": "none", "full": "full", "selective-op": "selective"}


def assets_root() -> Path:
    """Where the local tokenizer and dataset of each model are written (once) for the simulated runs."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "phantora" / "torchtitan-assets"


def prepare_assets(model: str) -> Path:
    """The assets directory of `model`, written now if missing (`phantora assets torchtitan`)."""
    from phantora.assets import write_torchtitan_assets

    out = assets_root() / model
    if not (out / "tokenizer").exists():
        write_torchtitan_assets(out, model=model)
    return out


class UnsupportedCase(PhantoraError):
    """The record's workload cannot be expressed as a TorchTitan command yet."""


def torchtitan_args(record: Record, *, steps: int = STEPS) -> list[str]:
    """TorchTitan flags for the record's model, batch, sequence length, parallelism and checkpointing (through
    `phantora.frameworks.torchtitan_argv`, which holds the model configs and the flags of a simulated run)."""
    from phantora.frameworks import load_framework, torchtitan_argv

    wl = record.workload
    recipe = load_framework("torchtitan").recipe(wl.model)
    if not recipe.supported:
        raise UnsupportedCase(f"TorchTitan 0.3.0 has no config for model preset '{wl.model}': {recipe.notes}")
    if wl.compile:
        raise UnsupportedCase("torch.compile is not simulated (compiled runs need a model of kernel fusion)")
    if wl.float8:
        raise UnsupportedCase("Float8 training is not simulated")
    ac = AC_COMMANDS.get(wl.activation_checkpointing)
    if ac is None:
        raise UnsupportedCase(f"activation checkpointing '{wl.activation_checkpointing}' has no TorchTitan 0.3.0 "
                              f"equivalent (its selective AC is per-op)")
    p = wl.parallelism
    if p.ep > 1:
        raise UnsupportedCase("expert parallelism is not mapped yet")
    argv = torchtitan_argv(wl.model, assets_dir=assets_root() / wl.model, dp_shard=p.dp_shard, tp=p.tp, pp=p.pp,
                           cp=p.cp, dp_replicate=p.dp_replicate, local_batch=wl.micro_batch, seq_len=wl.seq_len,
                           ac=ac, steps=steps, python="python")
    return argv[3:]      # without `python -m torchtitan.train`


def torchtitan_command(record: Record, *, python: str = "python", steps: int = STEPS) -> list[str]:
    """`python -m torchtitan.train ...` for the record."""
    return [python, "-m", "torchtitan.train", *torchtitan_args(record, steps=steps)]
