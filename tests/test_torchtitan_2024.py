"""TorchTitan's 2024 recipe (phantora/frameworks/torchtitan/recipe_2024.py) built by TorchTitan 0.3.0's own config
parser.

Skipped unless torchtitan is importable. Checked against TorchTitan's 2024 code as the module's docstring cites it:
- every block projects q, k and v with three linears of the model's shapes (2024's `Attention`: wq is dim x dim,
  wk and wv dim x n_kv_heads x head_dim);
- every RMSNorm (two per block and the final one) computes `(x.float() * rsqrt(mean(x.float()^2) + eps))
  .type_as(x) * weight`, and keeps 2 bytes per element less for backward than torch's `nn.RMSNorm` composed of the
  same ops (the normalized value in bf16, not float32);
- `<model>_ac_layer` checkpoints every second block (1, 3, 5, ...) fully and leaves the others alone, wrapped as
  2024 wrapped them (`preserve_rng_state=False`, torch's default early stop).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torchtitan") is None,
                                reason="torchtitan is not installed (pip install phantora[torchtitan])")

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def parse():
    sys.path.insert(0, str(ROOT / "stubs"))
    from phantora_stubs import triton_stub

    triton_stub.install()                      # TorchTitan imports triton, absent from a CPU build of torch
    from torchtitan.config.manager import ConfigManager

    def run(config: str, *extra: str):
        return ConfigManager().parse_args(["--module", "phantora.frameworks.torchtitan.recipe_2024", "--config", config,
                                           *extra])
    return run


@pytest.fixture(scope="module")
def parse_base(parse):
    from torchtitan.config.manager import ConfigManager

    def run(config: str):
        return ConfigManager().parse_args(["--module", "llama3", "--config", config])
    return run


def test_projections_are_separate_linears_of_the_model_shapes(parse):
    from phantora.models import load_model

    m = load_model("llama2-70b")
    hd = m.dim // m.n_heads
    layers = parse("llama2_70b").model_spec.model.layers
    assert len(layers) == m.n_layers
    for layer in layers:
        qkv = layer.attention.qkv_linear
        assert (qkv.wq.in_features, qkv.wq.out_features) == (m.dim, m.n_heads * hd)
        assert (qkv.wkv.in_features, qkv.wkv.out_features) == (m.dim, m.n_kv_heads * hd)
        assert qkv.wq.param_init is not None and qkv.wkv.param_init is not None


def test_rmsnorm_is_2024s_and_keeps_less_for_backward(parse, parse_base):
    import torch

    spec = parse("llama3_8b").model_spec.model
    norms = [spec.norm] + [n for layer in spec.layers for n in (layer.attention_norm, layer.ffn_norm)]
    assert len({type(n) for n in norms}) == 1 and len(norms) == 2 * len(spec.layers) + 1
    base = parse_base("llama3_8b").model_spec.model          # 0.3.0's own config: the fields carried over
    assert (norms[0].normalized_shape, norms[0].eps) == (base.norm.normalized_shape, base.norm.eps)
    assert norms[1].param_init is base.layers[0].attention_norm.param_init
    dim = 64
    cfg = type(norms[0])(normalized_shape=dim, eps=1e-5)
    norm = cfg.build()
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(0.5, 1.5, dim))
    x = torch.randn(3, 5, dim, dtype=torch.bfloat16)
    xf = x.float()
    expected = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).type_as(x) * norm.weight
    assert torch.equal(norm(x), expected)

    def saved_bytes(module, inp):
        """Bytes of the distinct storages autograd keeps for backward (a tensor saved twice counts once)."""
        kept = {}

        def pack(t):
            s = t.untyped_storage()
            kept[s.data_ptr()] = s.nbytes()
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            module(inp)
        return sum(kept.values())

    torch_norm = torch.nn.RMSNorm(dim, eps=1e-5)
    torch_norm.weight.data = norm.weight.data.clone()
    xg = x.detach().clone().requires_grad_(True)
    n = xg.numel()
    # torch's keeps the normalized value in float32 for the weight's product, 2024's in bf16: 2 bytes less each
    assert saved_bytes(torch_norm, xg) - saved_bytes(norm, xg) == 2 * n


def test_layer_checkpointing_wraps_every_second_block_as_2024_did(parse):
    import torch
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    config = parse("llama3_8b_ac_layer")
    ac = config.activation_checkpoint
    assert ac.every == 2 and ac.preserve_rng_state is False

    class Blocks(torch.nn.Module):
        def __init__(self, n: int):
            super().__init__()
            self.layers = torch.nn.ModuleDict({str(i): torch.nn.Linear(4, 4) for i in range(n)})
    model = Blocks(7)
    ac.build().apply(model)
    wrapped = [isinstance(b, CheckpointWrapper) for b in model.layers.values()]
    assert wrapped == [i % 2 == 1 for i in range(7)]
    # 2024 called ptd_checkpoint_wrapper(block, preserve_rng_state=False): torch's defaults otherwise, so the
    # recomputation stops early (0.3.0's FullAC passes early_stop=False)
    options = model.layers["1"].checkpoint_fn.keywords
    assert options.get("preserve_rng_state") is False
    assert options.get("early_stop", True) is True


def test_float8_config_is_december_2024s_tensorwise_recipe(parse):
    """`llama3_8b_float8`: every linear of the blocks (not the output projection) a Float8Linear with torchao's
    tensorwise dynamic scaling, FSDP Float8 all-gathers and float8 weights recast in the backward; one hook that
    precomputes the weights' scales after each optimizer step (TorchTitan's docs/float8.md of December 2024)."""
    pytest.importorskip("torchao")
    from torchao.float8.config import ScalingGranularity
    from torchtitan.models.common.linear import Linear

    config = parse("llama3_8b_float8")
    spec = config.model_spec
    linears = list(spec.model.traverse(Linear.Config))
    float8 = [(fqn, c) for fqn, c, _p, _a in linears if getattr(c, "_torchao_config", None) is not None]
    plain = [fqn for fqn, c, _p, _a in linears if getattr(c, "_torchao_config", None) is None]
    assert plain == ["lm_head"]                 # 0.3.0's name of 2024's `output`, which 2024 left in bf16
    # each of the 32 blocks: wq, wkv (one config for 2024's wk and wv), wo, w1, w2, w3
    assert len(float8) == 6 * len(spec.model.layers) == 6 * 32
    assert {fqn.split(".", 2)[2] for fqn, _c in float8} == {
        "attention.qkv_linear.wq", "attention.qkv_linear.wkv", "attention.wo", "feed_forward.w1",
        "feed_forward.w2", "feed_forward.w3"}
    for _fqn, c in float8:
        t = c._torchao_config
        assert t.enable_fsdp_float8_all_gather and t.force_recompute_fp8_weight_in_bwd
        for cast in (t.cast_config_input, t.cast_config_weight, t.cast_config_grad_output):
            assert cast.scaling_granularity is ScalingGranularity.TENSORWISE
    hooks = []

    class Optimizers:
        def register_step_post_hook(self, hook):
            hooks.append(hook)
    spec.post_optimizer_build_fn(Optimizers(), [], None)
    assert len(hooks) == 1
    base = parse("llama3_8b").model_spec
    assert base.post_optimizer_build_fn is None


def test_float8_weight_is_all_gathered_in_float8(parse, monkeypatch):
    """The block linears' weights are torchao's float8-cast wrappers (what FSDP2 all-gathers as 1 byte per
    element); a random initialization of the wrapped weight (TorchTitan's, through DTensor's higher-order op on a
    GPU) runs on the wrapped tensor."""
    pytest.importorskip("torchao")
    import torch
    from torch._prims.rng_prims import run_dtensor_rng_op
    from torchao.float8.fsdp_utils import WeightWithDynamicFloat8CastTensor
    from torchtitan.models.common.linear import Linear

    config = parse("llama3_8b_float8")
    fqn, c, _p, _a = next(x for x in config.model_spec.model.traverse(Linear.Config)
                          if getattr(x[1], "_torchao_config", None) is not None)
    small = type(c)(in_features=32, out_features=16, bias=False, param_init=c.param_init,
                    _torchao_config=c._torchao_config)
    module = small.build()
    assert isinstance(module.weight.data, WeightWithDynamicFloat8CastTensor)
    rule = run_dtensor_rng_op.python_key_table[WeightWithDynamicFloat8CastTensor]
    seen = []
    # the higher-order op itself runs on CUDA only: record what the rule hands on to it
    monkeypatch.setattr(type(run_dtensor_rng_op), "__call__",
                        lambda self, start, end, op, *args, **kwargs: seen.append((start, end, op, args)))
    rule(3, 5, torch.ops.aten.normal_.default, module.weight.data)
    (start, end, op, args), = seen
    assert (start, end, op) == (3, 5, torch.ops.aten.normal_.default)
    assert not isinstance(args[0], WeightWithDynamicFloat8CastTensor) and args[0] is module.weight.data._tensor


def test_float8_module_converts_mid_2025s_llama(parse):
    """`float8_tensorwise --config llama3_8b`: Llama 3 8B as TorchTitan trained it in mid-2025 (separate q/k/v
    projections, causal SDPA, the whole-logit loss, torch's RMSNorm) with the same tensorwise Float8: every block
    linear converted, `lm_head` left in bf16, the scales' hook installed."""
    pytest.importorskip("torchao")
    from torchtitan.components.loss import CrossEntropyLoss
    from torchtitan.config.manager import ConfigManager
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.common.linear import Linear

    config = ConfigManager().parse_args(["--module", "phantora.frameworks.torchtitan.float8_tensorwise",
                                         "--config", "llama3_8b"])
    base = ConfigManager().parse_args(["--module", "llama3", "--config", "llama3_8b"])
    model = config.model_spec.model
    converted = {fqn: getattr(c, "_torchao_config", None) for fqn, c, _p, _a in model.traverse(Linear.Config)}
    assert converted.pop("lm_head") is None
    assert converted and all(t is not None and t.enable_fsdp_float8_all_gather for t in converted.values())
    assert not any(fqn.endswith("wqkv") for fqn in converted) and any(fqn.endswith(".wq") for fqn in converted)
    assert all(isinstance(layer.attention.inner_attention, ScaledDotProductAttention.Config)
               for layer in model.layers)
    assert isinstance(config.loss, CrossEntropyLoss.Config)
    # torch's RMSNorm as in 0.3.0 (2024's own norm only in the 2024 recipe)
    assert type(model.layers[0].attention_norm) is type(base.model_spec.model.layers[0].attention_norm)
    assert config.model_spec.post_optimizer_build_fn is not None
