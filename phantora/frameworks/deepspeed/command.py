"""The command line of a simulated (or measured) DeepSpeed run: presets/workloads/deepspeed_gpt.py's flags."""

from __future__ import annotations

from pathlib import Path

from ...errors import PresetError
from ...paths import presets_dir
from ..flags import option_flags

# a record's activation checkpointing -> deepspeed_gpt.py's --ac (deepspeed.checkpointing of every block)
ACTIVATION_CHECKPOINTING = {"none": "none", "full": "full"}
PRECISIONS = ("bf16", "fp16")
# workload options (groundtruth records' `options`) -> (flag, kind): "int"/"str" pass a value, "bool" is a switch
OPTIONS = {
    "zero": ("--zero", "int"),
    "layers": ("--layers", "int"),
    "offload_optimizer": ("--offload-optimizer", "str"),
    "torch_adam": ("--torch-adam", "bool"),
    "bucket_mb": ("--bucket-mb", "str"),
    "no_overlap_comm": ("--no-overlap-comm", "bool"),
}


def workload_script() -> Path:
    return presets_dir() / "workloads" / "deepspeed_gpt.py"


def deepspeed_argv(*, model: str, gpus: int, pp: int = 1, micro_batch: int = 1, global_batch: int | None = None,
                   seq: int = 2048, activation_checkpointing: str = "none", precision: str = "bf16",
                   steps: int = 6, python: str = "python", options: dict | None = None) -> list[str]:
    """`python presets/workloads/deepspeed_gpt.py ...` for one workload on `gpus` ranks, `pp` pipeline stages
    (DeepSpeed's PipelineEngine) times gpus / pp data-parallel ranks; the gradient accumulation (micro-batches per
    step) is global_batch / (micro_batch x data-parallel ranks); `options` are a record's workload options (unknown
    keys are an error naming them)."""
    if activation_checkpointing not in ACTIVATION_CHECKPOINTING:
        raise PresetError(f"the DeepSpeed workload has no '{activation_checkpointing}' activation checkpointing "
                          f"(known: {', '.join(ACTIVATION_CHECKPOINTING)})", key="workload.activation_checkpointing")
    if precision not in PRECISIONS:
        raise PresetError(f"the DeepSpeed workload trains in {' or '.join(PRECISIONS)}, not {precision}",
                          key="workload.precision")
    if pp < 1 or gpus % pp:
        raise PresetError(f"{gpus} GPUs do not split into {pp} pipeline stages", key="workload.parallelism.pp")
    dp = gpus // pp
    accum = 1
    if global_batch is not None:
        if global_batch % (micro_batch * dp):
            raise PresetError(f"global batch {global_batch} is not a multiple of micro-batch x data-parallel ranks "
                              f"= {micro_batch * dp}", key="workload.global_batch")
        accum = global_batch // (micro_batch * dp)
    argv = [python, str(workload_script()), "--model", model, "--pp", str(pp), "--micro-batch", str(micro_batch),
            "--seq", str(seq),
            "--grad-accum", str(accum), "--ac", ACTIVATION_CHECKPOINTING[activation_checkpointing],
            "--precision", precision, "--steps", str(steps)]
    argv += option_flags(options, OPTIONS, "DeepSpeed")
    return argv
