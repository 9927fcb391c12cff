"""Torch ops that stand for the multi-tensor kernels of the frameworks' fused optimizers (DeepSpeed's FusedAdam,
Transformer Engine's FusedAdam and multi-tensor helpers, shared so that both are costed alike).

Each function issues the torch ops that read and write the same tensors as the kernel it stands for:

| kernel | stand-in |
|---|---|
| `multi_tensor_adam` (g, p, m, v read; p, m, v written) | `torch._fused_adam_` / `torch._fused_adamw_` |
| `multi_tensor_l2norm` (every tensor read once) | `torch._foreach_norm` and one `torch.stack(...).norm()` |
| `multi_tensor_scale` (one list read, one written) | `torch._foreach_copy_` into the output list, then `_foreach_mul_` in place (a scale of 1: the copy alone) |
"""

from __future__ import annotations

from typing import Any


class StepTensors:
    """The device scalar that holds a fused optimizer's step count (`torch._fused_adam_` takes its step as a device
    tensor, one per device; its value is a placeholder under simulation)."""

    def __init__(self) -> None:
        self._by_device: dict = {}

    def for_tensor(self, ref: Any):
        t = self._by_device.get(ref.device)
        if t is None:
            import torch
            t = self._by_device[ref.device] = torch.zeros((), dtype=torch.float32, device=ref.device)
        return t


def fused_adam(params: list, grads: list, exp_avgs: list, exp_avg_sqs: list, steps: StepTensors, *, lr: float,
               beta1: float, beta2: float, eps: float, weight_decay: float, adam_w_mode: bool) -> None:
    """One multi-tensor Adam (adam_w_mode: decoupled weight decay) update of the lists, in place."""
    import torch
    if not params:
        return
    fn = torch._fused_adamw_ if adam_w_mode else torch._fused_adam_
    fn(list(params), list(grads), list(exp_avgs), list(exp_avg_sqs), [], [steps.for_tensor(params[0])] * len(params),
       lr=float(lr), beta1=float(beta1), beta2=float(beta2), weight_decay=float(weight_decay), eps=float(eps),
       amsgrad=False, maximize=False)


def multi_tensor_l2norm(tensors: list, per_tensor: bool = False):
    """(total L2 norm, per-tensor norms or an empty tensor) as device fp32 tensors."""
    import torch
    norms = torch._foreach_norm(list(tensors))
    total = torch.stack([n.float() for n in norms]).norm() if norms else torch.zeros((), device="cuda")
    per = torch.stack(norms) if per_tensor and norms else torch.empty(0, device=total.device)
    return total, per


def multi_tensor_scale(sources: list, destinations: list, scale: float) -> None:
    """destinations[i] = sources[i] * scale, without a temporary (the kernel reads each source once and writes each
    destination once): in place when they are the same tensors, a copy alone when the scale is 1."""
    import torch
    if not sources:
        return
    src, dst = list(sources), list(destinations)
    if all(a is b for a, b in zip(src, dst)):
        if float(scale) != 1.0:
            torch._foreach_mul_(dst, float(scale))
        return
    torch._foreach_copy_(dst, src)
    if float(scale) != 1.0:
        torch._foreach_mul_(dst, float(scale))
