"""transformer_engine.pytorch.optimizers: FusedAdam, FusedSGD and the multi-tensor helpers, as the torch ops of the
same memory traffic (standins/kernels.py)."""

from __future__ import annotations

from typing import Any

import torch

from phantora_stubs.standins import kernels


def multi_tensor_applier(op: Any, noop_flag_buffer: Any, tensor_lists: list, *args: Any) -> Any:
    return op(2048 * 32, noop_flag_buffer, tensor_lists, *args)


def multi_tensor_l2norm(chunk_size: int, noop_flag: Any, tensor_lists: list, per_tensor: bool = False, *args: Any):
    return kernels.multi_tensor_l2norm(tensor_lists[0], per_tensor)


def multi_tensor_scale(chunk_size: int, noop_flag: Any, tensor_lists: list, scale: float) -> None:
    kernels.multi_tensor_scale(tensor_lists[0], tensor_lists[1], scale)


class FusedAdam(torch.optim.Optimizer):
    """TE's FusedAdam (multi_tensor_adam): fp32 moments beside the parameters; adam_w_mode is decoupled decay."""

    def __init__(self, params: Any, lr: float = 1e-3, bias_correction: bool = True, betas=(0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, amsgrad: bool = False, adam_w_mode: bool = True,
                 master_weights: bool = False, **kwargs: Any):
        if amsgrad:
            raise RuntimeError("FusedAdam does not support the AMSGrad variant.")
        if master_weights or kwargs.get("use_decoupled_grad"):
            from ..module.base import NotModelled
            raise NotModelled("FusedAdam(master_weights=True) (TE-managed master weights of the precision-aware "
                              "optimizer) is not modelled")
        defaults = dict(lr=lr, bias_correction=bias_correction, betas=betas, eps=eps, weight_decay=weight_decay)
        super().__init__(params, defaults)
        self.adam_w_mode = adam_w_mode
        self._steps = kernels.StepTensors()

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none=set_to_none)

    @torch.no_grad()
    def step(self, closure: Any = None, grad_scaler: Any = None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            params, grads, ms, vs = [], [], [], []
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["exp_avg"] = torch.zeros_like(p, dtype=torch.float32)
                    state["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.float32)
                params.append(p)
                grads.append(p.grad)
                ms.append(state["exp_avg"])
                vs.append(state["exp_avg_sq"])
            if not params:
                continue
            group["step"] = group.get("step", 0) + 1
            beta1, beta2 = group["betas"]
            kernels.fused_adam(params, grads, ms, vs, self._steps, lr=group["lr"], beta1=beta1, beta2=beta2,
                               eps=group["eps"], weight_decay=group["weight_decay"], adam_w_mode=self.adam_w_mode)
        return loss


class FusedSGD(torch.optim.SGD):
    """TE's FusedSGD: torch's SGD with its foreach kernels."""

    def __init__(self, params: Any, lr: float = 1e-3, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False, **kwargs: Any):
        super().__init__(params, lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                         nesterov=nesterov, foreach=True)
