"""transformer_engine.pytorch.module: the layers."""

from .base import NotModelled, TransformerEngineBaseModule  # noqa: F401
from .grouped_linear import GroupedLinear  # noqa: F401
from .layernorm import LayerNorm, RMSNorm  # noqa: F401
from .linear import LayerNormLinear, Linear  # noqa: F401


class _NotModelledModule(TransformerEngineBaseModule):
    feature = ""

    def __init__(self, *args, **kwargs):
        raise NotModelled(f"transformer_engine.pytorch.{type(self).__name__} ({self.feature}) is not modelled by the "
                          f"Transformer Engine stand-in")


class LayerNormMLP(_NotModelledModule):
    feature = "the fused norm-and-MLP block"
