"""The command line of a simulated TorchTitan run (`torchtitan_argv`), from the TorchTitan preset
(presets/frameworks/torchtitan.toml: the module and config per model preset, the flags of every simulated run)."""

from __future__ import annotations

from pathlib import Path

from ...errors import PhantoraError

AC_MODES = ("selective", "full", "none", "memory-budget")
"""TorchTitan 0.3.0's activation-checkpointing choices (the `activation-checkpoint:<mode>` sub-command)."""


def torchtitan_argv(model: str, *, assets_dir: str | Path, dp_shard: int = -1, tp: int = 1, pp: int = 1,
                    cp: int = 1, dp_replicate: int = 1, local_batch: int | None = None, seq_len: int | None = None,
                    ac: str | None = None, steps: int = 10, extra: list[str] | None = None,
                    python: str = "python", module: str | None = None, config: str | None = None) -> list[str]:
    """The command line of a simulated TorchTitan run of `model` (a model preset name).

    `assets_dir` is what `phantora assets torchtitan --out DIR` wrote (tokenizer/ and dataset/). Parallel degrees
    are TorchTitan's (`dp_shard=-1`: whatever the world size leaves); `local_batch`, `seq_len` and `ac` (one of
    `AC_MODES`) default to the TorchTitan config's own values. `extra` flags come last but before the
    activation-checkpointing sub-command, which tyro needs at the end. `module` and `config` replace the
    recipe's TorchTitan module and config (e.g. phantora.frameworks.torchtitan.recipe_2024's).
    """
    from .. import load_framework
    from .assets import DATASET_DIR, TOKENIZER_DIR

    fw = load_framework("torchtitan")
    r = fw.recipe(model)
    if not r.supported:
        raise PhantoraError(f"TorchTitan {fw.version} cannot train '{model}': {r.notes}")
    if ac is not None and ac not in AC_MODES:
        raise PhantoraError(f"activation checkpointing '{ac}' is not one of {', '.join(AC_MODES)}")
    for label, value in (("tp", tp), ("pp", pp), ("cp", cp), ("dp_replicate", dp_replicate), ("steps", steps)):
        if value < 1:
            raise PhantoraError(f"{label} must be at least 1 (got {value})")
    if dp_shard == 0 or dp_shard < -1:
        raise PhantoraError(f"dp_shard must be -1 or at least 1 (got {dp_shard})")
    root = Path(assets_dir)
    argv = [python, *fw.entry, "--module", module or r.module, "--config", config or r.config,
            "--hf-assets-path", str(root / TOKENIZER_DIR),
            "--dataloader.dataset", "c4_test", "--dataloader.dataset-path", str(root / DATASET_DIR),
            *fw.default_flags,
            "--training.steps", str(steps),
            "--parallelism.data-parallel-shard-degree", str(dp_shard),
            "--parallelism.data-parallel-replicate-degree", str(dp_replicate),
            "--parallelism.tensor-parallel-degree", str(tp),
            "--parallelism.pipeline-parallel-degree", str(pp),
            "--parallelism.context-parallel-degree", str(cp)]
    if local_batch is not None:
        argv += ["--training.local-batch-size", str(local_batch)]
    if seq_len is not None:
        argv += ["--training.seq-len", str(seq_len)]
    argv += list(extra or [])
    if ac is not None:
        argv.append(f"activation-checkpoint:{ac}")
    return argv
