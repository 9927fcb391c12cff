"""TE's DotProductAttention: cuDNN fused attention, as torch's SDPA issues it.

TE's default backend on sm80+ for bf16/fp16 is cuDNN's fused attention (the library torch's cuDNN SDPA calls);
`NVTE_FUSED_ATTN=0` makes it FlashAttention, `NVTE_FLASH_ATTN=0` removes FlashAttention. The stand-in runs
`scaled_dot_product_attention` with that backend priority (the cost model then costs the kernel the backend
launches), grouped-query attention native (`enable_gqa`), on `sbhd` or `bshd` inputs. Context parallelism, `thd`
(packed) inputs, attention bias and sliding windows are not modelled. The backward's temporaries are those of
torch's cuDNN SDPA as measured on an H200 (stubs/phantora_stubs/cuda_scratch.py: with GQA, dk and dv expanded to
the query's heads); what TE's own cuDNN graph holds was not measured.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from ..module.base import NotModelled, TransformerEngineBaseModule

_CAUSAL = {"causal", "padding_causal", "causal_bottom_right", "padding_causal_bottom_right"}
_NO_MASK = {"no_mask", "padding"}


def _backends() -> list:
    order = []
    if os.environ.get("NVTE_FUSED_ATTN", "1") != "0":
        order.append(SDPBackend.CUDNN_ATTENTION)
    if os.environ.get("NVTE_FLASH_ATTN", "1") != "0":
        order.append(SDPBackend.FLASH_ATTENTION)
    return order + [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


class DotProductAttention(TransformerEngineBaseModule):

    def __init__(self, num_attention_heads: int, kv_channels: Any, num_gqa_groups: int | None = None,
                 attention_dropout: float = 0.0, qkv_format: str = "sbhd", attn_mask_type: str = "causal",
                 window_size: Any = None, sequence_parallel: bool = False, tp_size: int = 1,
                 get_rng_state_tracker: Any = None, tp_group: Any = None, layer_number: int | None = None,
                 attention_type: str = "self", cp_group: Any = None, softmax_scale: float | None = None,
                 softmax_type: str = "vanilla", **kwargs: Any):
        super().__init__()
        if cp_group is not None and _size(cp_group) > 1:
            raise NotModelled("transformer_engine.pytorch.DotProductAttention with context parallelism (cp_group) "
                              "is not modelled: run with a context-parallel size of 1 (Megatron's "
                              "context_parallel_size, --context-parallel-size)")
        if window_size is not None and tuple(window_size) not in ((-1, -1), (-1, 0)):
            raise NotModelled(f"transformer_engine.pytorch.DotProductAttention(window_size={window_size}): "
                              f"sliding-window attention is not modelled")
        if softmax_type != "vanilla":
            raise NotModelled(f"transformer_engine.pytorch.DotProductAttention(softmax_type={softmax_type!r}) is "
                              f"not modelled")
        self.num_attention_heads = num_attention_heads
        self.num_gqa_groups = num_gqa_groups or num_attention_heads
        self.kv_channels = kv_channels
        self.attention_dropout = attention_dropout
        self.qkv_format = qkv_format
        self.attn_mask_type = attn_mask_type
        self.softmax_scale = softmax_scale
        self.get_rng_state_tracker = get_rng_state_tracker
        self.tp_group, self.tp_size = tp_group, tp_size
        self.sequence_parallel = sequence_parallel

    def set_context_parallel_group(self, cp_group: Any, *args: Any, **kwargs: Any) -> None:
        if cp_group is not None and _size(cp_group) > 1:
            raise NotModelled("transformer_engine.pytorch.DotProductAttention with context parallelism is not "
                              "modelled: run with a context-parallel size of 1 (Megatron's context_parallel_size, "
                              "--context-parallel-size)")

    def forward(self, query_layer: torch.Tensor, key_layer: torch.Tensor, value_layer: torch.Tensor,
                attention_mask: Any = None, qkv_format: str | None = None, attn_mask_type: str | None = None,
                core_attention_bias_type: str = "no_bias", core_attention_bias: Any = None, **kwargs: Any):
        fmt = qkv_format or self.qkv_format
        mask_type = attn_mask_type or self.attn_mask_type
        if fmt not in ("sbhd", "bshd"):
            raise NotModelled(f"transformer_engine.pytorch.DotProductAttention(qkv_format={fmt!r}): only sbhd and "
                              f"bshd inputs are modelled (packed thd sequences are not)")
        if core_attention_bias_type != "no_bias" or core_attention_bias is not None:
            raise NotModelled("transformer_engine.pytorch.DotProductAttention: attention bias is not modelled")
        if mask_type not in _CAUSAL | _NO_MASK:
            raise NotModelled(f"transformer_engine.pytorch.DotProductAttention(attn_mask_type={mask_type!r}) is not "
                              f"modelled")
        for name in ("cu_seqlens_q", "cu_seqlens_kv"):
            if kwargs.get(name) is not None:
                raise NotModelled("transformer_engine.pytorch.DotProductAttention: packed sequences (cu_seqlens) "
                                  "are not modelled")
        # [s, b, h, d] or [b, s, h, d] -> [b, h, s, d]
        perm = (1, 2, 0, 3) if fmt == "sbhd" else (0, 2, 1, 3)
        q, k, v = (t.permute(*perm) for t in (query_layer, key_layer, value_layer))
        dropout = self.attention_dropout if self.training else 0.0
        with sdpa_kernel(_backends(), set_priority=True):
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=mask_type in _CAUSAL,
                                                 scale=self.softmax_scale, enable_gqa=q.size(1) != k.size(1))
        # [b, h, s, d] -> [s, b, h * d] or [b, s, h * d]
        out = out.permute(2, 0, 1, 3) if fmt == "sbhd" else out.permute(0, 2, 1, 3)
        return out.reshape(*out.shape[:2], -1)


def _size(group: Any) -> int:
    import torch.distributed as dist
    return dist.get_world_size(group) if dist.is_initialized() else 1
