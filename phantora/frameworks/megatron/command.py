"""The command line of a simulated (or measured) Megatron-core run: presets/workloads/megatron_gpt.py's flags."""

from __future__ import annotations

from pathlib import Path

from ...errors import PresetError
from ...paths import presets_dir
from ..flags import option_flags

# a record's activation checkpointing -> megatron_gpt.py's --recompute (Megatron's selective recompute is per op:
# the core attention of every layer)
RECOMPUTE = {"none": "none", "full": "full", "selective-op": "selective"}
# workload options (groundtruth records' `options`) -> (flag, kind): "int" passes a value, "bool" is a switch
OPTIONS = {
    "vpp": ("--vpp", "int"),
    "layers": ("--layers", "int"),
    "distributed_optimizer": ("--distributed-optimizer", "bool"),
    "overlap_grad_reduce": ("--overlap-grad-reduce", "bool"),
    "overlap_param_gather": ("--overlap-param-gather", "bool"),
    "sequence_parallel": ("--sequence-parallel", "bool"),
    "torch_fsdp2": ("--torch-fsdp2", "bool"),
    "spec": ("--spec", "str"),
}


def workload_script() -> Path:
    return presets_dir() / "workloads" / "megatron_gpt.py"


def megatron_argv(*, model: str, tp: int = 1, pp: int = 1, micro_batch: int = 1, global_batch: int | None = None,
                  seq: int = 2048, recompute: str = "none", steps: int = 6, python: str = "python",
                  options: dict | None = None) -> list[str]:
    """`python presets/workloads/megatron_gpt.py ...` for one workload; `recompute` is a record's activation
    checkpointing mode, `options` a record's workload options (unknown keys are an error naming them)."""
    if recompute not in RECOMPUTE:
        raise PresetError(f"Megatron-core has no '{recompute}' activation recompute (known: "
                          f"{', '.join(RECOMPUTE)})", key="workload.activation_checkpointing")
    argv = [python, str(workload_script()), "--model", model, "--tp", str(tp), "--pp", str(pp),
            "--micro-batch", str(micro_batch), "--seq", str(seq), "--recompute", RECOMPUTE[recompute],
            "--steps", str(steps)]
    if global_batch is not None:
        argv += ["--global-batch", str(global_batch)]
    argv += option_flags(options, OPTIONS, "Megatron-core")
    return argv
