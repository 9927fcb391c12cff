"""DeepSpeed (release 0.19.8), run unmodified under `phantora run -- python presets/workloads/deepspeed_gpt.py`.

- `command.py`: `deepspeed_argv`, the command line of presets/workloads/deepspeed_gpt.py (a Llama trained through
  `deepspeed.initialize` with a ZeRO config) for a workload: the framework's ground-truth records and its model
  presets run through it; and the commands of its workloads that are not language models (`NON_LANGUAGE_MODELS`:
  ResNet-50, Stable Diffusion 1.5's UNet, a GAT), which ground-truth records name with `task = "other"`.

In the ranks, DeepSpeed's compiled ops (FusedAdam, FusedLamb, the CPU optimizers of ZeRO-Offload) are
answered by stand-ins costed like the kernels they replace (stubs/phantora_stubs/standins/deepspeed.py,
docs/deepspeed.md);
everything else DeepSpeed needs from `torch.cuda` and `torch.distributed` is filled for every framework. The registry
(phantora/frameworks/__init__.py) reaches this package as `framework_module("deepspeed")`.
"""

from __future__ import annotations

from .command import ACTIVATION_CHECKPOINTING, NON_LANGUAGE_MODELS, deepspeed_argv, workload_script

__all__ = ["ACTIVATION_CHECKPOINTING", "NON_LANGUAGE_MODELS", "deepspeed_argv", "workload_script"]
