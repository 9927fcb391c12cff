"""TE's LayerNorm and RMSNorm modules (the fused norm kernels: torch's fused RMSNorm and layer norm)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from .base import TransformerEngineBaseModule, new_parameter

NORMALIZATIONS = ("LayerNorm", "RMSNorm")


def make_norm_params(module: torch.nn.Module, prefix: str, hidden: int, normalization: str,
                     zero_centered_gamma: bool, params_dtype: Any, device: Any, sequence_parallel: bool) -> None:
    """`{prefix}weight` (and `{prefix}bias` for LayerNorm) on `module`, tagged `sequence_parallel` as TE tags them
    (Megatron all-reduces their gradients over the tensor-parallel group)."""
    if normalization not in NORMALIZATIONS:
        raise ValueError(f"Transformer Engine normalization {normalization!r} is not one of {NORMALIZATIONS}")
    weight = new_parameter((hidden,), params_dtype, device)
    with torch.no_grad():
        weight.fill_(0.0 if zero_centered_gamma else 1.0)
    weight.sequence_parallel = sequence_parallel
    setattr(module, prefix + "weight", weight)
    if normalization == "LayerNorm":
        bias = new_parameter((hidden,), params_dtype, device)
        with torch.no_grad():
            bias.zero_()
        bias.sequence_parallel = sequence_parallel
        setattr(module, prefix + "bias", bias)


def apply_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, normalization: str, eps: float,
               zero_centered_gamma: bool) -> torch.Tensor:
    if zero_centered_gamma:
        weight = weight + 1
    if normalization == "RMSNorm":
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


class _Norm(TransformerEngineBaseModule):
    normalization = "LayerNorm"

    def __init__(self, hidden_size: int, eps: float = 1e-5, sequence_parallel: bool = False,
                 params_dtype: Any = None, zero_centered_gamma: bool = False, device: Any = "cuda", **kwargs: Any):
        super().__init__()
        self.eps, self.zero_centered_gamma = eps, zero_centered_gamma
        self.sequence_parallel = sequence_parallel
        make_norm_params(self, "", hidden_size, self.normalization, zero_centered_gamma, params_dtype, device,
                         sequence_parallel)

    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        return apply_norm(inp, self.weight, getattr(self, "bias", None), self.normalization, self.eps,
                          self.zero_centered_gamma)


class LayerNorm(_Norm):
    normalization = "LayerNorm"


class RMSNorm(_Norm):
    normalization = "RMSNorm"
