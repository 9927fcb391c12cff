"""TE's GroupedLinear: one GEMM per expert over its rows of the input (`m_splits`), as TE's grouped GEMM launches
them (cuBLAS GEMMs over slices of one input and one output buffer, no copies); backward: per expert the dgrad GEMM
into its slice of the input gradient and the wgrad GEMM (added into `main_grad` when fused). Expert parallelism's
communication is the framework's (Megatron-core calls it with `parallel_mode=None`); a tensor-parallel
GroupedLinear is not modelled."""

from __future__ import annotations

from typing import Any, Callable

import torch

from .base import (NotModelled, TransformerEngineBaseModule, initialize, new_parameter, refuse_unmodelled,
                   set_tp_attributes)


def _accumulate(weight: torch.Tensor, wgrad: torch.Tensor, fuse: bool):
    """The wgrad to return: added into `main_grad` (and a placeholder returned) when fused, as TE does."""
    if fuse and hasattr(weight, "main_grad"):
        weight.main_grad.add_(wgrad)
        if hasattr(weight, "grad_added_to_main_grad"):
            weight.grad_added_to_main_grad = True
            return torch.empty_like(weight)
        return None
    return wgrad


def _skipped(weight: torch.Tensor, fuse: bool):
    """The wgrad of an expert that got no rows: nothing added into `main_grad` when fused, else zeros."""
    if fuse and hasattr(weight, "main_grad"):
        if hasattr(weight, "grad_added_to_main_grad"):
            weight.grad_added_to_main_grad = True
            return torch.empty_like(weight)
        return None
    return torch.zeros_like(weight)


class _GroupedGemm(torch.autograd.Function):

    @staticmethod
    def forward(ctx, x, m_splits, fuse_wgrad, *weights):
        out = torch.empty((x.shape[0], weights[0].shape[0]), dtype=x.dtype, device=x.device)
        start = 0
        for m, w in zip(m_splits, weights):
            if m:
                torch.mm(x[start:start + m], w.t(), out=out[start:start + m])
            start += m
        ctx.m_splits, ctx.fuse_wgrad = m_splits, fuse_wgrad
        ctx.save_for_backward(x, *weights)
        return out

    @staticmethod
    def backward(ctx, grad):
        x, *weights = ctx.saved_tensors
        grad = grad.contiguous()
        dgrad = torch.empty_like(x)
        wgrads = []
        start = 0
        for m, w in zip(ctx.m_splits, weights):
            if m:
                torch.mm(grad[start:start + m], w, out=dgrad[start:start + m])
                wgrads.append(_accumulate(w, torch.mm(grad[start:start + m].t(), x[start:start + m]), ctx.fuse_wgrad))
            else:                        # an expert without tokens: TE skips it (accumulating) or zeroes its wgrad
                wgrads.append(_skipped(w, ctx.fuse_wgrad))
            start += m
        return (dgrad, None, None, *wgrads)


class GroupedLinear(TransformerEngineBaseModule):
    def __init__(self, num_gemms: int, in_features: int, out_features: int, sequence_parallel: bool = False,
                 fuse_wgrad_accumulation: bool = False, tp_group: Any = None, tp_size: int = 1,
                 get_rng_state_tracker: Any = None, rng_tracker_name: str | None = None,
                 init_method: Callable | None = None, bias: bool = True, return_bias: bool = False,
                 params_dtype: Any = None, parallel_mode: str | None = None, device: Any = "cuda", **kwargs: Any):
        super().__init__()
        refuse_unmodelled("GroupedLinear", {k: v for k, v in kwargs.items() if k != "ub_name"})
        if parallel_mode is not None and tp_size > 1:
            raise NotModelled("transformer_engine.pytorch.GroupedLinear with tensor parallelism inside the layer is "
                              "not modelled (Megatron-core's expert layers communicate outside it)")
        if bias:
            raise NotModelled("transformer_engine.pytorch.GroupedLinear(bias=True) is not modelled")
        self.num_gemms, self.in_features, self.out_features = num_gemms, in_features, out_features
        self.use_bias, self.return_bias = bias, return_bias
        self.parallel_mode, self.tp_group, self.tp_size = parallel_mode, tp_group, 1
        self.fuse_wgrad_accumulation = fuse_wgrad_accumulation
        for i in range(num_gemms):
            w = new_parameter((out_features, in_features), params_dtype, device)
            initialize(w, init_method, get_rng_state_tracker, rng_tracker_name)
            set_tp_attributes(w, 1 if parallel_mode == "row" else 0)      # as TE tags every weight{i}
            self.register_parameter(f"weight{i}", w)

    def forward(self, inp: torch.Tensor, m_splits: list[int], is_first_microbatch: bool | None = None, **kwargs):
        splits = [int(m) for m in m_splits]
        if len(splits) != self.num_gemms:
            raise ValueError(f"transformer_engine.pytorch.GroupedLinear: {len(splits)} splits for {self.num_gemms} "
                             f"GEMMs")
        rows = inp.numel() // self.in_features
        if sum(splits) != rows:          # TE splits the input by m_splits (torch.split), which refuses this too
            raise RuntimeError(f"transformer_engine.pytorch.GroupedLinear: split_with_sizes expects split_sizes to sum "
                               f"exactly to {rows} (the input's rows), but got split_sizes={splits}")
        weights = [getattr(self, f"weight{i}") for i in range(self.num_gemms)]
        out = _GroupedGemm.apply(inp.reshape(-1, self.in_features), splits, self.fuse_wgrad_accumulation, *weights)
        out = out.reshape(*inp.shape[:-1], self.out_features)
        return (out, None) if self.return_bias else out
