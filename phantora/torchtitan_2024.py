"""TorchTitan 0.3.0 training configs that reproduce TorchTitan's 2024 recipe, for its published measurements.

The published TorchTitan tables (groundtruth/torchtitan: A100 in 2024, H100 in December 2024) were measured with
a TorchTitan whose Llama trained with `F.scaled_dot_product_attention(..., is_causal=True)` over the whole sequence
and computed the cross-entropy over the whole [batch, seq, vocab] logits. TorchTitan 0.3.0's own configs train the
same decoder with FlexAttention over per-document (block-causal) masks and a chunked loss: less attention work and
far smaller logits, not what those runs did. These configs keep 0.3.0's decoder, parallelisation and trainer and
put back the 2024 attention and loss:

- attention: TorchTitan's maskless `ScaledDotProductAttention` (causal), so the trainer builds no document masks;
  which SDPA kernel runs is torch's choice (`phantora run --torch-cuda/--sdpa`, validation/torchtitan.py);
- loss: `CrossEntropyLoss` on the full logits (no `ChunkedLossWrapper`).

`python -m torchtitan.train --module phantora.torchtitan_2024 --config llama3_8b ...` (TorchTitan imports this
module by its path). Llama 2 shapes come from Phantora's model presets as in `phantora.torchtitan_llama2`. Imported
only inside a rank that has TorchTitan.
"""

from __future__ import annotations


def _sdpa_layers(spec) -> None:
    from torchtitan.models.common.attention import ScaledDotProductAttention

    for layer in spec.model.layers:
        attention = getattr(layer, "attention", None)
        if attention is not None and hasattr(attention, "inner_attention"):
            attention.inner_attention = ScaledDotProductAttention.Config()


def _with_2024_recipe(config):
    from torchtitan.components.loss import CrossEntropyLoss
    from torchtitan.models.common.config_utils import decoder_vocab_size

    _sdpa_layers(config.model_spec)
    config.loss = CrossEntropyLoss.Config(global_vocab_size=decoder_vocab_size(config.model_spec))
    return config


def llama3_8b():
    from torchtitan.models.llama3.config_registry import llama3_8b as base

    return _with_2024_recipe(base())


def llama3_70b():
    from torchtitan.models.llama3.config_registry import llama3_70b as base

    return _with_2024_recipe(base())


def llama2_7b():
    from .torchtitan_llama2 import llama2_7b as base

    return _with_2024_recipe(base())


def llama2_13b():
    from .torchtitan_llama2 import llama2_13b as base

    return _with_2024_recipe(base())


def llama2_70b():
    from .torchtitan_llama2 import llama2_70b as base

    return _with_2024_recipe(base())
