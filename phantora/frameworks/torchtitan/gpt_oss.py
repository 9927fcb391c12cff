"""TorchTitan 0.3.0's gpt-oss 20B config with FlexAttention instead of varlen attention.

TorchTitan's `gpt_oss_20b` attends through its varlen backend, which imports `flash_attn_interface` (FlashAttention
3, built only with CUDA): a CPU-only rank cannot import it. TorchTitan's gpt-oss model also supports FlexAttention
(its attention sinks through an output transform, the sliding-window layers through a block mask), as its own
`gpt_oss_debugmodel_flex` uses. `gpt_oss_20b` here is TorchTitan's `gpt_oss_20b` trainer config with the model
spec of flavour '20b' built with `attn_backend="flex"`: `python -m torchtitan.train --module
phantora.frameworks.torchtitan.gpt_oss --config gpt_oss_20b ...`. The attention kernels differ from a varlen run's
(FlexAttention's are costed instead of FlashAttention 3's). Imported only inside a rank that has TorchTitan.
"""

from __future__ import annotations


def gpt_oss_20b():
    from torchtitan.models.gpt_oss import config_registry, model_registry

    config = config_registry.gpt_oss_20b()
    config.model_spec = model_registry("20b", attn_backend="flex")
    return config
