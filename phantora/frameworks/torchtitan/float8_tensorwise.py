"""TorchTitan's tensorwise Float8 with FSDP Float8 all-gathers, as its published H100/H200 measurements ran it.

TorchTitan's docs/float8.md of December 2024 to mid-2025 trained Float8 with `--model.converters float8
--float8.enable_fsdp_float8_all_gather --float8.precompute_float8_dynamic_scale_for_fsdp
--float8.force_recompute_fp8_weight_in_bwd` (tensorwise scaling, the default then). TorchTitan 0.3.0's own
converter takes rowwise recipes only and builds its `Float8Linear` without the float8-cast weight. Here:

- every linear of the blocks becomes a `Float8Linear` with torchao's tensorwise dynamic scaling (not the output
  projection, 0.3.0's `lm_head`, which those releases left out as `output`; nor a linear with a dimension not a
  multiple of 16);
- its weight is torchao's `WeightWithDynamicFloat8CastTensor`, as `Float8Linear.from_float` wraps it, so FSDP2
  all-gathers it in float8 (1 byte per element) and the float8 weights are recast in the backward, not kept;
- after each optimizer step one all-reduce computes every float8 weight's scale
  (`precompute_float8_dynamic_scale_for_fsdp`, through the model spec's `post_optimizer_build_fn`);
- today's DTensor runs a random op on a CUDA shard (TorchTitan initializes every parameter with one) through the
  higher-order op `run_dtensor_rng_op`, which has no rule for the wrapper (on a real GPU as here: "no rule
  registered for HOP run_dtensor_rng_op and subclass"); those releases' DTensor called the op itself, which the
  wrapper unwraps. A rule is registered that does what the wrapper does for any op: run it on the inner tensor.

`python -m torchtitan.train --module phantora.frameworks.torchtitan.float8_tensorwise --config llama3_8b ...` is
Llama 3 8B as TorchTitan trained it in mid-2025 (the H200 Float8 runs of June 2025: causal SDPA, separate q/k/v
projections, the loss over the whole logits, torch's RMSNorm) so converted; `recipe_2024.py`'s `<model>_float8`
configs convert its 2024 recipe.
Needs torchao (`pip install 'phantora[float8]'`). Like the other config modules it imports without TorchTitan.
"""

from __future__ import annotations

import functools


def with_float8_tensorwise(config):
    """`config` (a TorchTitan 0.3.0 trainer config) with its linears converted and the scales' hook installed."""
    import dataclasses

    from torchtitan.models.common.linear import Linear

    float8_linear, torchao_config = _float8_linear_class(), _torchao_config()
    spec = config.model_spec
    for fqn, linear, parent, attr in list(spec.model.traverse(Linear.Config)):
        if fqn in ("lm_head", "output") or linear.in_features % 16 or linear.out_features % 16:
            continue
        new = float8_linear.Config(in_features=linear.in_features, out_features=linear.out_features,
                                   bias=linear.bias, param_init=linear.param_init, _torchao_config=torchao_config)
        if isinstance(parent, list):
            parent[attr] = new
        else:
            setattr(parent, attr, new)
    config.model_spec = dataclasses.replace(spec, post_optimizer_build_fn=_precompute_scales_after_step)
    return config


def _torchao_config():
    from torchao.float8 import Float8LinearConfig

    return Float8LinearConfig(enable_fsdp_float8_all_gather=True, force_recompute_fp8_weight_in_bwd=True)


def _precompute_scales_after_step(optimizers, model_parts, parallel_dims) -> None:
    """After each optimizer step, every float8 weight's scale for the next all-gather, in one all-reduce."""
    from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

    def hook(*_args, **_kwargs):
        for part in model_parts:
            precompute_float8_dynamic_scale_for_fsdp(part)

    optimizers.register_step_post_hook(hook)


@functools.cache
def _float8_linear_class():
    """Float8LinearTensorwise, defined on first use (it needs TorchTitan and torchao), once."""
    from dataclasses import dataclass

    import torch
    from torchtitan.components.quantization.float8 import Float8Linear

    class Float8LinearTensorwise(Float8Linear):
        """TorchTitan 0.3.0's Float8Linear whose weight, with FSDP Float8 all-gathers on, is wrapped as torchao's
        `Float8Linear.from_float` wraps it (0.3.0 builds the module directly and leaves it plain)."""

        @dataclass(kw_only=True, slots=True)
        class Config(Float8Linear.Config):
            pass

        def __init__(self, config):
            super().__init__(config)
            if self.config.enable_fsdp_float8_all_gather:
                from torchao.float8.fsdp_utils import WeightWithDynamicFloat8CastTensor

                self.weight = torch.nn.Parameter(
                    WeightWithDynamicFloat8CastTensor(self.weight, self.linear_mm_config,
                                                      self.config.cast_config_weight.target_dtype),
                    requires_grad=self.weight.requires_grad)

    _rng_op_through_float8_weights()
    return Float8LinearTensorwise


def _rng_op_through_float8_weights() -> None:
    """Let DTensor's random ops (TorchTitan initializes every parameter with one) run on a float8-wrapped weight.

    Today's DTensor runs a random op on a CUDA shard through the higher-order op `run_dtensor_rng_op`, which has no
    rule for torchao's `WeightWithDynamicFloat8CastTensor` (on a real GPU as here: "no rule registered for HOP
    run_dtensor_rng_op and subclass"); the DTensor of those releases called the op itself, which the wrapper
    unwraps. The rule runs the op on the inner tensors, as the wrapper's `__torch_dispatch__` does for an op that
    keeps no wrapper on its result (the random fill happens in place on the inner tensor). A torch without the
    higher-order op needs no rule."""
    try:
        from torch._prims.rng_prims import run_dtensor_rng_op
    except ImportError:
        return
    from torch.utils import _pytree as pytree
    from torchao.float8.fsdp_utils import WeightWithDynamicFloat8CastTensor

    if WeightWithDynamicFloat8CastTensor in run_dtensor_rng_op.python_key_table:
        return

    @run_dtensor_rng_op.py_impl(WeightWithDynamicFloat8CastTensor)
    def _inner(start_offset_incr, end_offset_incr, op, *args, **kwargs):
        args, kwargs = pytree.tree_map_only(WeightWithDynamicFloat8CastTensor, lambda t: t._tensor, (args, kwargs))
        return run_dtensor_rng_op(start_offset_incr, end_offset_incr, op, *args, **kwargs)


def llama3_8b():
    """Llama 3 8B as TorchTitan trained it in mid-2025 (causal SDPA, separate q/k/v projections, the loss over the
    whole logits, torch's RMSNorm: recipe_2024.with_sdpa_and_whole_loss) with this tensorwise Float8."""
    from torchtitan.models.llama3 import config_registry

    from .recipe_2024 import with_sdpa_and_whole_loss

    return with_float8_tensorwise(with_sdpa_and_whole_loss(config_registry.llama3_8b()))


def llama3_debugmodel():
    """TorchTitan's Llama 3 debug model (dim 256, 6 layers) the same way: a quick look at this Float8 anywhere."""
    from torchtitan.models.llama3 import config_registry

    from .recipe_2024 import with_sdpa_and_whole_loss

    return with_float8_tensorwise(with_sdpa_and_whole_loss(config_registry.llama3_debugmodel()))
