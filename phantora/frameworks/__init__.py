"""The training frameworks Phantora knows, and the model presets they can train.

One package per framework (`phantora/frameworks/<name>/`: its command line, the model configs it imports by module
path inside a simulated rank, its local assets), named in `FRAMEWORKS`, and one preset per framework
(`presets/frameworks/<name>.toml`). A framework preset says, per model preset, which of the framework's own model
definitions and configs reproduces it (TorchTitan: `--module` and `--config`), whether the framework release
supports the model at all, and whether a simulated run of it has been verified; plus the flags every simulated run
gets (no checkpoints, no profiler, no CUDA graphs...). `framework_table()` is the model × framework table
`phantora presets` prints; `commands.assets_cmd` is `phantora assets <framework>`, one sub-command per framework
package that has an `assets_command()`.

Adding a framework: copy `phantora/frameworks/torchtitan/` to `phantora/frameworks/<name>/` and adapt it, add its
line to `FRAMEWORKS`, and write `presets/frameworks/<name>.toml` (docs/architecture.md, "Adding a framework").
Nothing here imports a framework package until it is asked for, and none of it imports the framework itself: a
framework imports its config modules inside every simulated rank, and with them this package, so it stays light.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from types import ModuleType

from ..errors import PresetError
from ..paths import presets_dir
from ..tomlconf import build, read_toml

FRAMEWORKS: dict[str, str] = {
    "torchtitan": "phantora.frameworks.torchtitan",
    "megatron": "phantora.frameworks.megatron",
    "deepspeed": "phantora.frameworks.deepspeed",
}
"""Framework name (its preset's file name) -> its package: the registry."""

@dataclass(frozen=True)
class ModelRecipe:
    """How one framework trains one model preset."""

    module: str              # TorchTitan --module ("" when unsupported)
    config: str              # TorchTitan --config ("" when unsupported)
    supported: bool          # the framework release can train this model
    verified: bool           # a simulated run of it has been checked to run to the end
    notes: str = ""
    run_options: str = ""    # options of `phantora run` the recipe needs (the cluster's software: --transformer-engine)


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
    run_options: str = ""


def framework_table(frameworks: list[str] | None = None) -> list[TableRow]:
    """Every model preset × framework: whether the framework trains it, and with which module/config."""
    from ..models import list_models

    rows = []
    for fw_name in frameworks or list_frameworks():
        fw = load_framework(fw_name)
        for model in list_models():
            r = fw.models.get(model)
            if r is None:
                rows.append(TableRow(model, fw_name, False, False, "", "", "no entry in the framework preset"))
            else:
                rows.append(TableRow(model, fw_name, r.supported, r.verified, r.module, r.config, r.notes,
                                     r.run_options))
    return rows


def format_table(rows: list[TableRow]) -> str:
    """The table as text: model, framework, status, module/config (after `[run: OPTIONS]` when the recipe needs
    options of `phantora run`)."""
    lines = [f"  {'model':<16} {'framework':<12} {'status':<12} {'module / config'}"]
    for r in rows:
        status = "verified" if r.verified else ("supported" if r.supported else "-")
        where = f"{r.module} / {r.config}" if r.supported else r.notes
        if r.supported and r.run_options:
            where = f"[run: {r.run_options}] {where}"
        lines.append(f"  {r.model:<16} {r.framework:<12} {status:<12} {where}")
    return "\n".join(lines)


def non_language_models(name: str) -> tuple[str, ...]:
    """The workloads of a framework's package that are not language models (its `NON_LANGUAGE_MODELS`: names a
    ground-truth record with `task = "other"` may give as its model); none for an unknown framework."""
    if name not in FRAMEWORKS:
        return ()
    return tuple(getattr(framework_module(name), "NON_LANGUAGE_MODELS", ()))


def framework_module(name: str) -> ModuleType:
    """The package of a framework of the registry (imported now)."""
    module = FRAMEWORKS.get(name)
    if module is None:
        raise PresetError(f"unknown framework '{name}'; known: {', '.join(sorted(FRAMEWORKS))}")
    return importlib.import_module(module)
