"""The command line of a simulated (or measured) DeepSpeed run: presets/workloads/deepspeed_gpt.py's flags, or those
of the workloads that are not language models (ResNet-50, Stable Diffusion 1.5's UNet, a GAT)."""

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
    "offload_param": ("--offload-param", "str"),
    "torch_adam": ("--torch-adam", "bool"),
    "bucket_mb": ("--bucket-mb", "str"),
    "no_overlap_comm": ("--no-overlap-comm", "bool"),
    "quantized_weights": ("--quantized-weights", "bool"),      # ZeRO++ qwZ
    "quantized_gradients": ("--quantized-gradients", "bool"),  # ZeRO++ qgZ
    "hpz": ("--hpz", "int"),                                   # ZeRO++ hpZ partition size
}


# the shapes of the workloads that are not language models, as their records' options (they are run with them)
SHAPE_OPTIONS = {
    "image_size": ("--image-size", "int"),          # ResNet-50
    "nodes": ("--nodes", "int"), "edges": ("--edges", "int"), "features": ("--features", "int"),   # GAT
    "classes": ("--classes", "int"), "heads": ("--heads", "int"), "hidden": ("--hidden", "int"),
}
# workloads that are not language models: model name (their SUMMARY's "model") -> (script, takes --batch, the shape
# options its records carry: the SUMMARY's config keys of the same names)
NON_LANGUAGE_MODELS = {
    "resnet50": ("deepspeed_resnet.py", True, ("image_size",)),      # images per GPU per micro-step
    "sd15-unet": ("deepspeed_unet.py", True, ()),                     # latents per GPU (needs diffusers)
    "gat": ("deepspeed_gat.py", False,                                # one full graph per step (torch_geometric)
            ("nodes", "edges", "features", "classes", "layers", "heads", "hidden")),
}


def workload_script(model: str | None = None) -> Path:
    script = NON_LANGUAGE_MODELS[model][0] if model in NON_LANGUAGE_MODELS else "deepspeed_gpt.py"
    return presets_dir() / "workloads" / script


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
    if model in NON_LANGUAGE_MODELS:
        return _other_argv(model, gpus=gpus, pp=pp, micro_batch=micro_batch, accum=accum,
                           activation_checkpointing=activation_checkpointing, precision=precision, steps=steps,
                           python=python, options=options)
    argv = [python, str(workload_script()), "--model", model, "--pp", str(pp), "--micro-batch", str(micro_batch),
            "--seq", str(seq),
            "--grad-accum", str(accum), "--ac", ACTIVATION_CHECKPOINTING[activation_checkpointing],
            "--precision", precision, "--steps", str(steps)]
    argv += option_flags(options, OPTIONS, "DeepSpeed")
    return argv


def _other_argv(model: str, *, gpus: int, pp: int, micro_batch: int, accum: int, activation_checkpointing: str,
                precision: str, steps: int, python: str, options: dict | None) -> list[str]:
    """The command of a workload that is not a language model: data parallelism only, no checkpointing; ZeRO and
    the optimizer options as for the language models."""
    if pp > 1:
        raise PresetError(f"the DeepSpeed {model} workload has no pipeline stages", key="workload.parallelism.pp")
    if activation_checkpointing != "none":
        raise PresetError(f"the DeepSpeed {model} workload has no activation checkpointing",
                          key="workload.activation_checkpointing")
    _script, batched, shapes = NON_LANGUAGE_MODELS[model]
    if not batched and micro_batch != 1:
        raise PresetError(f"the DeepSpeed {model} workload trains on one full graph per step: micro_batch is 1",
                          key="workload.micro_batch")
    argv = [python, str(workload_script(model))]
    if batched:
        argv += ["--batch", str(micro_batch)]
    argv += ["--grad-accum", str(accum), "--precision", precision, "--steps", str(steps)]
    common = {"zero", "offload_optimizer", "offload_param", "torch_adam", "bucket_mb", "no_overlap_comm",
              "quantized_weights", "quantized_gradients", "hpz"}
    unsupported = sorted(set(options or ()) - common - set(shapes))
    if unsupported:
        raise PresetError(f"the DeepSpeed {model} workload takes no {', '.join(unsupported)}",
                          key="workload.options")
    return argv + option_flags(options, {**OPTIONS, **SHAPE_OPTIONS}, "DeepSpeed")
