"""transformer_engine.pytorch: the modules frameworks build layers from."""

from . import distributed, fp8, ops, optimizers  # noqa: F401
from .attention import DotProductAttention  # noqa: F401
from .fp8 import fp8_autocast, fp8_model_init  # noqa: F401
from .module import GroupedLinear, LayerNorm, LayerNormLinear, LayerNormMLP, Linear, RMSNorm  # noqa: F401
from .module.base import NotModelled  # noqa: F401

autocast = fp8_autocast
quantized_model_init = fp8_model_init
