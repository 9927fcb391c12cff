"""TorchTitan 0.3.0 training configs that reproduce TorchTitan's 2024 recipe, for its published measurements.

The published TorchTitan tables (groundtruth/torchtitan: A100 in 2024, H100 in December 2024) were measured with
a TorchTitan whose Llama trained with `F.scaled_dot_product_attention(..., is_causal=True)` over the whole sequence
and computed the cross-entropy over the whole [batch, seq, vocab] logits. TorchTitan 0.3.0's own configs train the
same decoder with FlexAttention over per-document (block-causal) masks and a chunked loss: less attention work and
far smaller logits, not what those runs did. These configs keep 0.3.0's decoder, parallelisation and trainer and
put back the 2024 attention and loss:

- attention: TorchTitan's maskless `ScaledDotProductAttention` (causal), so the trainer builds no document masks;
  which SDPA kernel runs is torch's choice (`phantora run --torch-cuda/--sdpa`, validation/torchtitan.py);
- loss: `CrossEntropyLoss` on the full logits (no `ChunkedLossWrapper`);
- projections: separate `wq`, `wk`, `wv` linears (2024's `Attention`), not 0.3.0's fused `wqkv`. It matters to
  per-op selective checkpointing, which recomputes every second matmul of a block: of wq, wk, wv, wo, w1, w3, w2
  it recomputes wk, wo and w3, where with the fused projection it recomputes wo and w3;
- normalization: 2024's `RMSNorm` (`torchtitan/models/norms.py`, `norm_type = "rmsnorm"`, the default of the
  time): `(x.float() * rsqrt(mean(x.float()^2) + eps)).type_as(x) * weight`. For backward it keeps the float32
  input and the bf16 normalized value, where torch's `nn.RMSNorm` (0.3.0) composed of the same ops keeps that value
  in float32: 2 bytes more per token and hidden unit for each of a block's two norms (the Llama 2 13B run without
  checkpointing fits in 80 GB only without them);
- per-layer selective checkpointing (2024's `selective_ac_option = "2"`, the "selective layer" rows): every second
  transformer block fully checkpointed (blocks 1, 3, 5, ...), the others not, each wrapped as 2024 wrapped it
  (`ptd_checkpoint_wrapper(block, preserve_rng_state=False)`: no RNG state kept, torch's default early stop of
  the recomputation, which 0.3.0's FullAC turns off); configs `<model>_ac_layer`, which set it themselves: run
  them without an `activation-checkpoint:` sub-command, which would replace it;
- Float8 as December 2024's TorchTitan trained it (tensorwise scaling, FSDP Float8 all-gathers, precomputed
  scales: `float8_tensorwise.py`); configs `<model>_float8`.

`python -m torchtitan.train --module phantora.frameworks.torchtitan.recipe_2024 --config llama3_8b ...`
(TorchTitan imports this module by its path). Llama 2 shapes come from Phantora's model presets as in
`phantora.frameworks.torchtitan.llama2`. The module imports without TorchTitan (validation reads `LAYER_AC_EVERY`
and the config names on the host); its configs and classes need TorchTitan.
"""

from __future__ import annotations

import functools


LAYER_AC_EVERY = 2        # 2024's default selective_ac_option: checkpoint every second block


def _sdpa_layers(spec) -> None:
    from torchtitan.models.common.attention import ScaledDotProductAttention

    for layer in spec.model.layers:
        attention = getattr(layer, "attention", None)
        if attention is not None and hasattr(attention, "inner_attention"):
            attention.inner_attention = ScaledDotProductAttention.Config()


def _separate_projections(spec) -> None:
    """Each block's fused wqkv replaced by 2024's three linears of the same shapes."""
    from torchtitan.models.common.attention import FusedQKVLinear, QKVLinear
    from torchtitan.models.common.linear import Linear
    from torchtitan.models.llama3 import _LINEAR_INIT

    for layer in spec.model.layers:
        attention = getattr(layer, "attention", None)
        fused = getattr(attention, "qkv_linear", None)
        if not isinstance(fused, FusedQKVLinear.Config):
            continue
        dim, hd = fused.wqkv.in_features, fused.head_dim
        attention.qkv_linear = QKVLinear.Config(
            head_dim=hd,
            wq=Linear.Config(in_features=dim, out_features=fused.n_heads * hd, param_init=_LINEAR_INIT),
            wkv=Linear.Config(in_features=dim, out_features=fused.n_kv_heads * hd, param_init=_LINEAR_INIT))


def _rmsnorm_2024_config(norm):
    from dataclasses import fields

    return _classes()[0].Config(**{f.name: getattr(norm, f.name) for f in fields(norm)})


def _rmsnorms_2024(spec) -> None:
    """Every RMSNorm of the decoder (two per block and the final one) as 2024's."""
    model = spec.model
    model.norm = _rmsnorm_2024_config(model.norm)
    for layer in model.layers:
        layer.attention_norm = _rmsnorm_2024_config(layer.attention_norm)
        layer.ffn_norm = _rmsnorm_2024_config(layer.ffn_norm)


def with_sdpa_and_whole_loss(config):
    """A 0.3.0 config with the attention, projections and loss TorchTitan trained with until mid-2025 (causal SDPA,
    `use_flex_attn` off by default; separate wq, wk, wv; the cross-entropy over the whole logits); its norms stay
    torch's `nn.RMSNorm`, which TorchTitan used from 2025 on."""
    from torchtitan.components.loss import CrossEntropyLoss
    from torchtitan.models.common.config_utils import decoder_vocab_size

    _sdpa_layers(config.model_spec)
    _separate_projections(config.model_spec)
    config.loss = CrossEntropyLoss.Config(global_vocab_size=decoder_vocab_size(config.model_spec))
    return config


def _with_2024_recipe(config):
    with_sdpa_and_whole_loss(config)
    _rmsnorms_2024(config.model_spec)
    return config


def _with_layer_ac(config):
    config.activation_checkpoint = _classes()[1].Config(every=LAYER_AC_EVERY)
    return config


@functools.cache
def _classes():
    """(RMSNorm2024, EveryNthBlockAC), defined on first use (they subclass TorchTitan's classes, which the host
    running validation may not have), once, so that configs and modules built from them share one class."""
    from dataclasses import dataclass

    import torch
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torchtitan.distributed.activation_checkpoint import ActivationCheckpointing
    from torchtitan.models.common.nn_modules import RMSNorm

    class RMSNorm2024(RMSNorm):
        """TorchTitan's 2024 RMSNorm: normalized in float32, cast back, then scaled by the weight."""

        @dataclass(kw_only=True, slots=True)
        class Config(RMSNorm.Config):
            pass

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            xf = x.float()
            out = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x)
            return out * self.weight if self.weight is not None else out

    class EveryNthBlockAC(ActivationCheckpointing):
        """TorchTitan 2024's per-layer selective checkpointing: every `every`-th transformer block (the 2nd, 4th,
        ... for every=2) wrapped as 2024 wrapped it, `ptd_checkpoint_wrapper(block, preserve_rng_state=False)`
        (torch's default early stop, unlike 0.3.0's FullAC), the rest not checkpointed."""

        @dataclass(kw_only=True, slots=True)
        class Config(ActivationCheckpointing.Config):
            every: int = LAYER_AC_EVERY
            preserve_rng_state: bool = False

        def apply(self, model) -> None:
            if self.config.every < 1:
                raise ValueError(f"every must be at least 1 (got {self.config.every})")
            self._seen = 0
            super().apply(model)

        def _wrap_block(self, module, *, base_fqn=None):
            self._seen += 1
            if self._seen % self.config.every:
                return module
            return checkpoint_wrapper(module, preserve_rng_state=self.config.preserve_rng_state)

    return RMSNorm2024, EveryNthBlockAC


def _model_config(name: str):
    if name.startswith("llama3"):
        from torchtitan.models.llama3 import config_registry as registry
    else:
        from . import llama2 as registry
    return getattr(registry, name)()


def llama3_8b():
    return _with_2024_recipe(_model_config("llama3_8b"))


def llama3_70b():
    return _with_2024_recipe(_model_config("llama3_70b"))


def llama2_7b():
    return _with_2024_recipe(_model_config("llama2_7b"))


def llama2_13b():
    return _with_2024_recipe(_model_config("llama2_13b"))


def llama2_70b():
    return _with_2024_recipe(_model_config("llama2_70b"))


def llama3_8b_ac_layer():
    return _with_layer_ac(llama3_8b())


def llama3_70b_ac_layer():
    return _with_layer_ac(llama3_70b())


def llama2_7b_ac_layer():
    return _with_layer_ac(llama2_7b())


def llama2_13b_ac_layer():
    return _with_layer_ac(llama2_13b())


def llama2_70b_ac_layer():
    return _with_layer_ac(llama2_70b())


def llama3_8b_float8():
    from .float8_tensorwise import with_float8_tensorwise

    return with_float8_tensorwise(llama3_8b())
