"""The TorchTitan command that reproduces a ground-truth record.

`torchtitan_args(record)` is the one place where a record's workload becomes TorchTitan (0.3.0) flags; tune it here.
`torchtitan_command(record)` is the whole training command (`python -m torchtitan.train ...`) that the case runner
puts after `phantora run ... --`.
"""

from __future__ import annotations

from phantora.errors import PhantoraError
from phantora.groundtruth.schema import Record

# model preset -> (TorchTitan --module, --config) in TorchTitan 0.3.0's config registry.
MODEL_CONFIGS: dict[str, tuple[str, str]] = {
    "llama3-8b": ("llama3", "llama3_8b"),
    "llama3-70b": ("llama3", "llama3_70b"),
    "llama3-405b": ("llama3", "llama3_405b"),
    "llama3-debug": ("llama3", "llama3_debugmodel"),
}

STEPS = 6            # optimizer steps per simulated run: the first is set-up, the rest give the median iteration

# Flags every simulated run needs (no checkpoints, evaluation, profiler or TensorBoard; the FSDP path that works on
# torch 2.13; no CUDA graphs).
HOUSEKEEPING = [
    "--checkpoint.no-enable", "--validator.no-enable", "--profiler.no-enable-profiling",
    "--metrics.no-enable-tensorboard", "--metrics.log_freq", "1",
    "--parallelism.spmd_backend", "partial_dtensor", "--training.disable_cuda_graphs",
]

PRECISION_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "tf32": "float32"}


class UnsupportedCase(PhantoraError):
    """The record's workload cannot be expressed as a TorchTitan command yet."""


def torchtitan_args(record: Record, *, steps: int = STEPS) -> list[str]:
    """TorchTitan flags for the record's model, batch, sequence length, parallelism, checkpointing and precision."""
    wl = record.workload
    if wl.model not in MODEL_CONFIGS:
        raise UnsupportedCase(f"no TorchTitan 0.3.0 config for model preset '{wl.model}' (known: "
                              f"{', '.join(sorted(MODEL_CONFIGS))}); add it to MODEL_CONFIGS in validation/torchtitan.py")
    module, config = MODEL_CONFIGS[wl.model]
    p = wl.parallelism
    args = ["--module", module, "--config", config,
            "--training.local_batch_size", str(wl.micro_batch),
            "--training.global_batch_size", str(wl.global_batch),
            "--training.seq_len", str(wl.seq_len),
            "--training.steps", str(steps),
            "--training.mixed_precision_param", PRECISION_DTYPES[wl.precision],
            "--parallelism.data_parallel_shard_degree", str(p.dp_shard),
            "--parallelism.data_parallel_replicate_degree", str(p.dp_replicate),
            "--parallelism.tensor_parallel_degree", str(p.tp),
            "--parallelism.pipeline_parallel_degree", str(p.pp),
            "--parallelism.context_parallel_degree", str(p.cp),
            "--parallelism.expert_parallel_degree", str(p.ep)]
    ac = wl.activation_checkpointing
    if ac in ("none", "full"):
        args += ["--activation_checkpoint.mode", ac]
    else:
        option = "op" if ac == "selective-op" else str(wl.ac_layer_period or 2)
        args += ["--activation_checkpoint.mode", "selective", "--activation_checkpoint.selective_ac_option", option]
    if wl.compile:
        args += ["--compile.enable"]
    if wl.float8:
        args += ["--model.converters", "float8", "--float8.enable_fsdp_float8_all_gather",
                 "--float8.precompute_float8_dynamic_scale_for_fsdp"]
    return args + HOUSEKEEPING


def torchtitan_command(record: Record, *, python: str = "python", steps: int = STEPS) -> list[str]:
    """`python -m torchtitan.train ...` for the record."""
    return [python, "-m", "torchtitan.train", *torchtitan_args(record, steps=steps)]
