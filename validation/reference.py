"""The command that reproduces a record of the reference workload (framework "phantora-llama":
presets/workloads/llama.py, the trainer the `local` suite was measured with). A Float8 record (`float8 = true`) was
measured with torchao's tensorwise recipe (`--float8 tensorwise`) unless its `options.float8` names the recipe
(`"tensorwise"` or `"rowwise"`)."""

from __future__ import annotations

from phantora.groundtruth.schema import Record
from phantora.paths import presets_dir

from .torchtitan import UnsupportedCase

STEPS = 6
AC = {"none": "none", "full": "full", "selective-layer": "selective"}
OPTION_KEYS = ("float8",)
FLOAT8_RECIPES = ("tensorwise", "rowwise")


def float8_recipe(record: Record) -> str | None:
    """The `--float8` recipe of a record: None without Float8, else `options.float8` (default tensorwise), checked."""
    wl = record.workload
    unknown = sorted(set(wl.options) - set(OPTION_KEYS))
    if unknown:
        raise UnsupportedCase(f"the reference workload has no option '{unknown[0]}' (options it takes: "
                              f"{', '.join(OPTION_KEYS)})")
    recipe = wl.options.get("float8")
    if recipe is not None and not wl.float8:
        raise UnsupportedCase("options.float8 names a Float8 recipe, but the record has float8 = false")
    if not wl.float8:
        return None
    recipe = "tensorwise" if recipe is None else recipe
    if recipe not in FLOAT8_RECIPES:
        raise UnsupportedCase(f"options.float8 must be one of {', '.join(FLOAT8_RECIPES)}, got {recipe!r}")
    return recipe


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
    recipe = float8_recipe(record)
    return [python, str(presets_dir() / "workloads" / "llama.py"), "--model", wl.model, "--dp-mode", dp_mode,
            "--tp", str(p.tp), "--pp", str(p.pp), "--batch", str(wl.micro_batch), "--seq", str(wl.seq_len),
            "--ac", AC[wl.activation_checkpointing], "--steps", str(steps), *(["--compile"] if wl.compile else []),
            *(["--float8", recipe] if recipe else [])]
