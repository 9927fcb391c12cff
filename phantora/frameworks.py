"""Training frameworks and the model presets they can train: presets/frameworks/<name>.toml.

A framework preset says, per model preset, which of the framework's own model definitions and configs reproduces
it (TorchTitan: `--module` and `--config`), whether the framework release supports the model at all, and whether
a simulated run of it has been verified; plus the flags every simulated run gets (no checkpoints, no profiler,
no CUDA graphs...). `framework_table()` is the model × framework table `phantora presets` prints;
`torchtitan_argv(...)` builds the full command line of a simulated TorchTitan run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from .errors import PhantoraError, PresetError
from .paths import presets_dir
from .tomlconf import build, read_toml

AC_MODES = ("selective", "full", "none", "memory-budget")
"""TorchTitan 0.3.0's activation-checkpointing choices (the `activation-checkpoint:<mode>` sub-command)."""


@dataclass(frozen=True)
class ModelRecipe:
    """How one framework trains one model preset."""

    module: str              # TorchTitan --module ("" when unsupported)
    config: str              # TorchTitan --config ("" when unsupported)
    supported: bool          # the framework release can train this model
    verified: bool           # a simulated run of it has been checked to run to the end
    notes: str = ""


@dataclass(frozen=True)
class FrameworkSpec:
    name: str
    version: str
    package: str                                   # pip requirement of the release
    entry: list[str]                               # after the Python interpreter, e.g. ["-m", "torchtitan.train"]
    default_flags: list[str] = field(default_factory=list)
    models: dict[str, ModelRecipe] = field(default_factory=dict)

    def recipe(self, model: str) -> ModelRecipe:
        r = self.models.get(model)
        if r is None:
            raise PresetError(f"framework '{self.name}' has no entry for model preset '{model}'; "
                              f"known: {', '.join(sorted(self.models))}")
        return r


def framework_dir() -> Path:
    return presets_dir() / "frameworks"


def list_frameworks() -> list[str]:
    return sorted(p.stem for p in framework_dir().glob("*.toml"))


@lru_cache(maxsize=None)
def _load(path: str) -> FrameworkSpec:
    table = read_toml(Path(path))
    models = table.pop("models", {})
    if not isinstance(models, dict):
        raise PresetError("expected a table of model recipes", file=path, key="models")
    recipes = {name: build(ModelRecipe, t, file=path, prefix=f"models.{name}.") for name, t in models.items()}
    spec = build(FrameworkSpec, table, file=path)
    for name, r in recipes.items():
        if r.supported and not (r.module and r.config):
            raise PresetError("a supported model needs a module and a config", file=path, key=f"models.{name}")
    return FrameworkSpec(**{**spec.__dict__, "models": recipes})


def load_framework(name: str) -> FrameworkSpec:
    """A framework preset by name (`torchtitan`)."""
    path = framework_dir() / f"{name}.toml"
    if not path.exists():
        raise PresetError(f"unknown framework preset '{name}'; known: {', '.join(list_frameworks()) or '(none)'}")
    return _load(str(path))


@dataclass(frozen=True)
class TableRow:
    """One (model, framework) cell of the table `phantora presets` prints."""

    model: str
    framework: str
    supported: bool
    verified: bool
    module: str
    config: str
    notes: str


def framework_table(frameworks: list[str] | None = None) -> list[TableRow]:
    """Every model preset × framework: whether the framework trains it, and with which module/config."""
    from .models import list_models

    rows = []
    for fw_name in frameworks or list_frameworks():
        fw = load_framework(fw_name)
        for model in list_models():
            r = fw.models.get(model)
            if r is None:
                rows.append(TableRow(model, fw_name, False, False, "", "", "no entry in the framework preset"))
            else:
                rows.append(TableRow(model, fw_name, r.supported, r.verified, r.module, r.config, r.notes))
    return rows


def format_table(rows: list[TableRow]) -> str:
    """The table as text: model, framework, status, module/config."""
    lines = [f"  {'model':<16} {'framework':<12} {'status':<12} {'module / config'}"]
    for r in rows:
        status = "verified" if r.verified else ("supported" if r.supported else "-")
        where = f"{r.module} / {r.config}" if r.supported else r.notes
        lines.append(f"  {r.model:<16} {r.framework:<12} {status:<12} {where}")
    return "\n".join(lines)


def torchtitan_argv(model: str, *, assets_dir: str | Path, dp_shard: int = -1, tp: int = 1, pp: int = 1,
                    cp: int = 1, dp_replicate: int = 1, local_batch: int | None = None, seq_len: int | None = None,
                    ac: str | None = None, steps: int = 10, extra: list[str] | None = None,
                    python: str = "python", module: str | None = None, config: str | None = None) -> list[str]:
    """The command line of a simulated TorchTitan run of `model` (a model preset name).

    `assets_dir` is what `phantora assets torchtitan --out DIR` wrote (tokenizer/ and dataset/). Parallel degrees
    are TorchTitan's (`dp_shard=-1`: whatever the world size leaves); `local_batch`, `seq_len` and `ac` (one of
    `AC_MODES`) default to the TorchTitan config's own values. `extra` flags come last but before the
    activation-checkpointing sub-command, which tyro needs at the end. `module` and `config` replace the
    recipe's TorchTitan module and config (e.g. phantora.torchtitan_2024's).
    """
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
