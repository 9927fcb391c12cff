"""The TorchTitan command that reproduces a ground-truth record.

`torchtitan_args(record)` is the one place where a record's workload becomes TorchTitan (0.3.0) flags; tune it here.
`torchtitan_command(record)` is the whole training command (`python -m torchtitan.train ...`) that the case runner
puts after `phantora run ... --`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from phantora.errors import PhantoraError
from phantora.software import CUDNN_FIRST_FROM, parse_release
from phantora.groundtruth.schema import Record

STEPS = 6            # optimizer steps per simulated run: the first is set-up, the rest give the median iteration

# record's activation checkpointing -> TorchTitan 0.3.0's sub-command (its selective AC is per-op only;
# "selective-layer" is a config of the 2024 recipe, phantora/frameworks/torchtitan/recipe_2024.py)
AC_COMMANDS = {"none": "none", "full": "full", "selective-op": "selective"}


def assets_root() -> Path:
    """Where the local tokenizer and dataset of each model are written (once) for the simulated runs."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "phantora" / "torchtitan-assets"


def prepare_assets(model: str) -> Path:
    """The assets directory of `model`, written now if missing (`phantora assets torchtitan`)."""
    from phantora.frameworks.torchtitan.assets import write_torchtitan_assets

    out = assets_root() / model
    if (out / "tokenizer").exists():
        return out
    # cases run in parallel: each writes into a private folder and renames it into place; the first one wins
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{model}-", dir=out.parent))
    try:
        write_torchtitan_assets(tmp, model=model)
        for _ in range(8):
            try:
                tmp.rename(out)
                break
            except OSError:
                if (out / "tokenizer").exists():      # another case put a whole folder in place first
                    break
                # a half-written folder of an older version: set it aside (unless another case just did)
                stale = Path(tempfile.mkdtemp(prefix=f".{model}-stale-", dir=out.parent))
                try:
                    out.rename(stale / model)
                except OSError:
                    pass
                shutil.rmtree(stale, ignore_errors=True)
        if not (out / "tokenizer").exists():
            raise PhantoraError(f"could not put the {model} assets in place at {out}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


# torch releases and the day each was published: a run of date D used that day's nightly or the latest release,
# whose CUDA kernel choices are those of the first release published after D (its development line)
TORCH_RELEASES = (("2.3", "2024-04-24"), ("2.4", "2024-07-24"), ("2.5", "2024-10-17"), ("2.6", "2025-01-29"),
                  ("2.7", "2025-04-23"), ("2.8", "2025-08-06"), ("2.9", "2025-10-15"))


def torch_release_of(record: Record) -> str | None:
    """The torch release line of the record's run, from its date; None for runs after the last release listed."""
    date = record.source.date
    for release, published in TORCH_RELEASES:
        if date < published:
            return release
    return None


def torchtitan_run_options(record: Record) -> list[str]:
    """`phantora run` options that give the simulated ranks the record's software: the CUDA kernel choices of its
    torch release (`--torch-cuda`; before 2.8 RMSNorm is not one fused kernel), and, before torch 2.9, flash
    attention first: TorchTitan then called SDPA without an order and torch put flash first, where TorchTitan
    0.3.0 asks for cuDNN first."""
    release = torch_release_of(record)
    if release is None:
        return []
    out = ["--torch-cuda", release]
    if _release_before(record, CUDNN_FIRST_FROM):
        out += ["--sdpa", "flash,efficient,math"]
    return out


# How the caching allocator was set up is not stated by the published runs. TorchTitan 0.3.0's run_train.sh sets
# expandable segments; the 2024 runs (Meta's Grand Teton and A100 clusters) were not necessarily launched by the
# repository's script, and their published memory matches PyTorch's default allocator: the 8- and 128-GPU H100 rows
# replay at 81.8 / 66.8 GiB with the defaults (82.4 / 67.0 measured) and 77.2 / 63.0 GiB with expandable segments.
EXPANDABLE_FROM = (2, 8)      # records of this torch release line on ran TorchTitan 0.3.0's launcher


def torchtitan_environment(record: Record) -> dict[str, str]:
    """The allocator settings of the record's launcher: PyTorch's defaults for the 2024 recipe's runs (see above),
    `expandable_segments:True` for later ones, as TorchTitan's run_train.sh exports."""
    if _release_before(record, EXPANDABLE_FROM):
        return {}
    return {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}


def _release_before(record: Record, release: tuple[int, int]) -> bool:
    """True when the record's torch release line is known and older than `release`."""
    own = torch_release_of(record)
    return own is not None and parse_release(own) < release


def recipe_2024_config(model: str, variant: str = "") -> str | None:
    """The phantora/frameworks/torchtitan/recipe_2024.py config of a model preset (TorchTitan's 2024 recipe: causal
    SDPA over the whole sequence, loss over the whole logits), with a variant suffix (e.g. "_float8") if given, or
    None if it has none."""
    from phantora.frameworks.torchtitan import recipe_2024

    name = model.replace("-", "_") + variant
    return name if callable(getattr(recipe_2024, name, None)) else None


def float8_tensorwise_config(model: str) -> str | None:
    """The phantora/frameworks/torchtitan/float8_tensorwise.py config of a model preset (TorchTitan 0.3.0's own
    config with the published runs' tensorwise Float8), or None if it has none."""
    from phantora.frameworks.torchtitan import float8_tensorwise

    name = model.replace("-", "_")
    return name if callable(getattr(float8_tensorwise, name, None)) else None


class UnsupportedCase(PhantoraError):
    """The record's workload cannot be expressed as a TorchTitan command yet."""


def torchtitan_args(record: Record, *, steps: int = STEPS) -> list[str]:
    """TorchTitan flags for the record's model, batch, sequence length, parallelism and checkpointing (through
    `phantora.frameworks.torchtitan.torchtitan_argv`, which holds the model configs and the flags of a simulated
    run)."""
    from phantora.frameworks import load_framework
    from phantora.frameworks.torchtitan import torchtitan_argv

    wl = record.workload
    recipe = load_framework("torchtitan").recipe(wl.model)
    if not recipe.supported:
        raise UnsupportedCase(f"TorchTitan 0.3.0 has no config for model preset '{wl.model}': {recipe.notes}")
    p = wl.parallelism
    if p.ep > 1:
        raise UnsupportedCase("expert parallelism is not mapped yet")
    # records measured before torch 2.8 ran the TorchTitan of 2024, whose recipe
    # phantora/frameworks/torchtitan/recipe_2024.py keeps
    config = recipe_2024_config(wl.model) if _release_before(record, (2, 8)) else None
    module = "phantora.frameworks.torchtitan.recipe_2024" if config else None
    if wl.float8:
        # the published Float8 runs: tensorwise scaling, FSDP Float8 all-gathers, precomputed scales
        # (phantora/frameworks/torchtitan/float8_tensorwise.py), on the 2024 recipe or on 0.3.0's own config
        if wl.activation_checkpointing == "selective-layer":
            raise UnsupportedCase("Float8 with per-layer selective checkpointing has no config")
        if config is not None:
            config = recipe_2024_config(wl.model, "_float8")
        else:
            config, module = float8_tensorwise_config(wl.model), "phantora.frameworks.torchtitan.float8_tensorwise"
        if config is None:
            raise UnsupportedCase(f"no tensorwise Float8 config for model preset '{wl.model}' (TorchTitan 0.3.0's "
                                  f"own Float8 converter takes rowwise recipes)")
    if wl.activation_checkpointing == "selective-layer":
        # 2024's per-layer checkpointing: a config of the 2024 recipe sets it (TorchTitan 0.3.0 has no sub-command)
        from phantora.frameworks.torchtitan.recipe_2024 import LAYER_AC_EVERY

        period = wl.ac_layer_period or LAYER_AC_EVERY
        if config is None or period != LAYER_AC_EVERY:
            raise UnsupportedCase(f"per-layer selective checkpointing (every {period} blocks) is simulated only in "
                                  f"TorchTitan's 2024 recipe, every {LAYER_AC_EVERY} blocks (TorchTitan 0.3.0 "
                                  f"checkpoints per op)")
        config, ac = f"{config}_ac_layer", None
    else:
        ac = AC_COMMANDS.get(wl.activation_checkpointing)
        if ac is None:
            raise UnsupportedCase(f"activation checkpointing '{wl.activation_checkpointing}' has no TorchTitan "
                                  f"0.3.0 equivalent")
    argv = torchtitan_argv(wl.model, assets_dir=assets_root() / wl.model, dp_shard=p.dp_shard, tp=p.tp, pp=p.pp,
                           cp=p.cp, dp_replicate=p.dp_replicate, local_batch=wl.micro_batch, seq_len=wl.seq_len,
                           ac=ac, steps=steps, python="python",
                           extra=["--compile.enable"] if wl.compile else None,
                           module=module, config=config)
    return argv[argv.index("--module"):]      # without `python -m torchtitan.train`


def torchtitan_command(record: Record, *, python: str = "python", steps: int = STEPS) -> list[str]:
    """`python -m torchtitan.train ...` for the record."""
    return [python, "-m", "torchtitan.train", *torchtitan_args(record, steps=steps)]
