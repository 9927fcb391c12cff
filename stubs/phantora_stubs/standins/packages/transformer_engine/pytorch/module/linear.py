"""TE's Linear and LayerNormLinear: GEMMs with TE's tensor-parallel collectives.

Modes (TE's `parallel_mode`) on sequence-first activations [s, b, in]:
- "column": weight [out / tp, in]. With sequence parallelism the input shard is all-gathered before the GEMM and
  only the shard is kept for backward, where it is all-gathered again beside the dgrad GEMM; dgrad is
  reduce-scattered (all-reduced without sequence parallelism) beside the wgrad GEMM.
- "row": weight [out, in / tp]. The output is reduce-scattered (sequence parallel) or all-reduced; the bias is added
  after the reduction; backward all-gathers the output gradient with sequence parallelism.
- None: a plain GEMM.

With `fuse_wgrad_accumulation` the weight gradient is added into `weight.main_grad` (fp32) and a placeholder
gradient is returned, as TE does; the stand-in runs the wgrad GEMM and then the fp32 add, where TE's GEMM
accumulates in its epilogue.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from .base import (NotModelled, TransformerEngineBaseModule, all_reduce, gather_sequence, group_size, initialize,
                   new_parameter, reduce_scatter_sequence, refuse_unmodelled, set_tp_attributes, wait)
from .layernorm import apply_norm, make_norm_params


class _ParallelLinear(torch.autograd.Function):

    @staticmethod
    def forward(ctx, x, weight, mode, sequence_parallel, group, tp, fuse_wgrad):
        total = x
        if mode == "column" and sequence_parallel and tp > 1:
            total = gather_sequence(x, group)[0]
        out = torch.matmul(total, weight.t())
        if mode == "row" and tp > 1:
            out = (reduce_scatter_sequence(out, group) if sequence_parallel else all_reduce(out, group))[0]
        ctx.mode, ctx.sp, ctx.group, ctx.tp, ctx.fuse_wgrad = mode, sequence_parallel, group, tp, fuse_wgrad
        ctx.save_for_backward(x, weight)     # the shard, not the gathered input, under sequence parallelism
        return out

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        mode, sp, group, tp = ctx.mode, ctx.sp, ctx.group, ctx.tp
        if mode == "row" and sp and tp > 1:
            grad = gather_sequence(grad, group)[0]
        gather_work = None
        total = x
        if mode == "column" and sp and tp > 1:
            total, gather_work = gather_sequence(x, group, async_op=True)
        dgrad = torch.matmul(grad, weight)
        dgrad_work = None
        if mode == "column" and tp > 1:
            dgrad, dgrad_work = (reduce_scatter_sequence(dgrad, group, async_op=True) if sp
                                 else all_reduce(dgrad, group, async_op=True))
        wait(gather_work)
        g2 = grad.reshape(-1, grad.shape[-1])
        wgrad = torch.matmul(g2.t(), total.reshape(-1, total.shape[-1]))
        if ctx.fuse_wgrad and hasattr(weight, "main_grad"):
            weight.main_grad.add_(wgrad)
            if hasattr(weight, "grad_added_to_main_grad"):
                weight.grad_added_to_main_grad = True
                wgrad = torch.empty_like(weight)          # TE's dummy gradient: the hooks see one, skip the add
            else:
                wgrad = None
        wait(dgrad_work)
        return dgrad, wgrad, None, None, None, None, None


def parallel_linear(x, weight, bias, *, mode, sequence_parallel, group, tp, fuse_wgrad, return_bias):
    out = _ParallelLinear.apply(x, weight, mode, sequence_parallel, group, tp, fuse_wgrad)
    if bias is not None and not return_bias:
        out = out + bias
    return (out, bias) if return_bias else out


class Linear(TransformerEngineBaseModule):
    def __init__(self, in_features: int, out_features: int, sequence_parallel: bool = False,
                 fuse_wgrad_accumulation: bool = False, tp_group: Any = None, tp_size: int = 1,
                 get_rng_state_tracker: Any = None, rng_tracker_name: str | None = None,
                 init_method: Callable | None = None, bias: bool = True, return_bias: bool = False,
                 params_dtype: Any = None, parallel_mode: str | None = None, device: Any = "cuda", **kwargs: Any):
        super().__init__()
        name = type(self).__name__
        refuse_unmodelled(name, kwargs)
        if parallel_mode not in (None, "column", "row"):
            raise ValueError(f"transformer_engine.pytorch.{name}: parallel_mode {parallel_mode!r} is not one of "
                             f"None, 'column', 'row'")
        self.in_features, self.out_features = in_features, out_features
        self.use_bias, self.return_bias = bias, return_bias
        self.parallel_mode = parallel_mode
        self.tp_group = tp_group
        self.tp_size = group_size(tp_group, tp_size) if parallel_mode else 1
        if parallel_mode and tp_group is None and tp_size > 1:
            raise ValueError(f"transformer_engine.pytorch.{name}: tp_size={tp_size} without a tp_group")
        self.sequence_parallel = bool(sequence_parallel) and self.tp_size > 1
        self.fuse_wgrad_accumulation = fuse_wgrad_accumulation
        self.params_dtype, self.device = params_dtype, device
        out_local, in_local = out_features, in_features
        if parallel_mode == "column":
            out_local = _divide(out_features, self.tp_size, name)
        elif parallel_mode == "row":
            in_local = _divide(in_features, self.tp_size, name)
        self.weight = new_parameter((out_local, in_local), params_dtype, device)
        initialize(self.weight, init_method, get_rng_state_tracker, rng_tracker_name)
        # TE tags every weight, split or not (reset_parameters): Megatron's norm and zero counts read the tag
        set_tp_attributes(self.weight, 1 if parallel_mode == "row" else 0)
        if bias:
            self.bias = new_parameter((out_local,), params_dtype, device)
            with torch.no_grad():
                self.bias.zero_()
            if parallel_mode == "column":
                set_tp_attributes(self.bias, 0)
            elif parallel_mode == "row":
                self.bias.sequence_parallel = self.sequence_parallel
        else:
            self.register_parameter("bias", None)

    def _linear(self, x: torch.Tensor):
        return parallel_linear(x, self.weight, self.bias, mode=self.parallel_mode,
                               sequence_parallel=self.sequence_parallel, group=self.tp_group, tp=self.tp_size,
                               fuse_wgrad=self.fuse_wgrad_accumulation, return_bias=self.return_bias)

    def forward(self, inp: torch.Tensor, is_first_microbatch: bool | None = None, **kwargs: Any):
        return self._linear(inp)


def _divide(n: int, parts: int, name: str) -> int:
    if n % parts:
        raise ValueError(f"transformer_engine.pytorch.{name}: {n} features are not divisible by the "
                         f"tensor-parallel size {parts}")
    return n // parts


class LayerNormLinear(Linear):
    """The norm (RMSNorm or LayerNorm) of the input, then Linear; with sequence parallelism the norm runs on the
    sequence shard and its output is gathered."""

    def __init__(self, in_features: int, out_features: int, eps: float = 1e-5, normalization: str = "LayerNorm",
                 return_layernorm_output: bool = False, return_layernorm_output_gathered: bool = False,
                 zero_centered_gamma: bool = False, **kwargs: Any):
        if return_layernorm_output:
            raise NotModelled("transformer_engine.pytorch.LayerNormLinear(return_layernorm_output=True) is not "
                              "modelled")
        super().__init__(in_features, out_features, **kwargs)
        self.normalization, self.eps, self.zero_centered_gamma = normalization, eps, zero_centered_gamma
        make_norm_params(self, "layer_norm_", in_features, normalization, zero_centered_gamma, self.params_dtype,
                         self.device, self.sequence_parallel)

    def forward(self, inp: torch.Tensor, is_first_microbatch: bool | None = None, **kwargs: Any):
        ln_out = apply_norm(inp, self.layer_norm_weight, getattr(self, "layer_norm_bias", None), self.normalization,
                            self.eps, self.zero_centered_gamma)
        return self._linear(ln_out)
