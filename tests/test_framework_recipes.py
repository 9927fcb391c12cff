"""The model x framework table's recipes whose training script is a workload of presets/workloads/ (Megatron-core,
DeepSpeed): every supported row's flags parse with that script, its model preset loads, and the layout the flags
describe is one the framework accepts; the `phantora run` options a recipe needs (its cluster software) are options
`phantora run` accepts, with values its cluster validation takes."""

from __future__ import annotations

import importlib.util
import shlex
import sys
from pathlib import Path

import pytest

from phantora.frameworks import load_framework

ROOT = Path(__file__).resolve().parent.parent


def load_script(path: Path):
    spec = importlib.util.spec_from_file_location(f"{path.stem}_workload", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    try:
        spec.loader.exec_module(mod)
    finally:
        del sys.modules[spec.name]
    return mod


def megatron_layout(mod, args, a) -> None:
    world = args.tp * args.pp * 2 * args.ep
    assert mod.check_layout(args, a, world, mod.load_moe_shape(args.model)) == 2 * args.ep


def deepspeed_layout(mod, args, a) -> None:
    assert mod.ds_config(args, 8)["zero_optimization"]["stage"] == args.zero
    moe = mod.moe_args(args, mod.resolve_model_path(args.model))
    if moe is not None:                  # DeepSpeed's MoE layer: ZeRO 0-2, experts split evenly over --ep
        assert args.zero <= 2 and args.pp == 1 and moe.experts % moe.ep == 0


@pytest.mark.parametrize("framework, script, layout", [
    ("megatron", "megatron_gpt.py", megatron_layout),
    ("deepspeed", "deepspeed_gpt.py", deepspeed_layout),
])
def test_every_recipe_of_the_framework_preset_is_accepted_by_the_workload(framework, script, layout):
    if importlib.util.find_spec({"megatron": "megatron", "deepspeed": "deepspeed"}[framework]) is None:
        pytest.skip(f"{framework} is not installed")
    mod = load_script(ROOT / "presets" / "workloads" / script)
    rows = [(name, r) for name, r in load_framework(framework).models.items() if r.supported]
    assert rows
    for name, r in rows:
        assert r.module == f"presets/workloads/{script}"
        args = mod.parse_args(["--model", name, *shlex.split(r.config)])
        a = mod.load_model_args(args.model, args.layers)
        layout(mod, args, a)
        if r.run_options:
            check_run_options(r.run_options)


def check_run_options(options: str) -> None:
    from phantora.cluster import load_cluster, software_overrides
    from phantora.live.command import run_cmd
    ctx = run_cmd.make_context("run", [*shlex.split(options), "--", "python", "train.py"])
    p = ctx.params
    load_cluster("h100-hgx", nodes=1, overrides=software_overrides(p["torch_cuda"], p["sdpa"],
                                                                    p["transformer_engine"]))


def test_megatron_workload_refuses_layers_it_does_not_build():
    """A preset whose layers megatron_gpt.py would build differently (Qwen3's query-key norms, gpt-oss's sinks,
    sliding windows and biases) is refused, naming what is missing, rather than trained as another model; the
    framework preset marks those rows unsupported."""
    if importlib.util.find_spec("megatron") is None:
        pytest.skip("megatron is not installed")
    import tomllib
    mod = load_script(ROOT / "presets" / "workloads" / "megatron_gpt.py")
    recipes = load_framework("megatron").models
    for name in ("qwen3-30b-a3b", "gpt-oss-20b"):
        preset = tomllib.loads((ROOT / "presets" / "models" / f"{name}.toml").read_text())
        unbuilt = [k for k in mod.UNBUILT if preset.get(k)]
        assert unbuilt, name
        with pytest.raises(mod.UsageError) as err:
            mod.load_moe_shape(name)
        assert all(k in str(err.value) for k in unbuilt), str(err.value)
        assert not recipes[name].supported
    assert mod.load_moe_shape("mixtral-8x7b").num_experts == 8
