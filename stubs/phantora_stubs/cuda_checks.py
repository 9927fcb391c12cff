"""Checks CUDA kernels make that the fake (meta) kernels do not, so that a program that fails on a GPU fails in its
simulation too, with the GPU's message, instead of running on as something it is not.

- BatchNorm's backward with half-precision weights (bf16 / fp16, the input's dtype) needs the running statistics in
  that dtype too: CUDA raises "Expected running_mean to have type BFloat16 but got Float". The forward accepts the
  mix, and fp32 weights with a half input (mixed precision) pass both ways (measured on an H200:
  groundtruth/deepspeed/bn_dtypes.py, h200x2/bn_dtypes.txt). DeepSpeed's bf16 engine casts a model's parameters but
  not its buffers, so a ResNet trained that way stops in its first backward on a real GPU.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

_HALF = (torch.bfloat16, torch.float16)
_NAMES = {torch.bfloat16: "BFloat16", torch.float16: "Half", torch.float32: "Float", torch.float64: "Double"}


def _batch_norm_backward(args: tuple, kwargs: dict) -> None:
    """native_batch_norm_backward(grad_out, input, weight, running_mean, running_var, save_mean, save_invstd, ...)."""
    names = ("grad_out", "input", "weight", "running_mean", "running_var")
    got = {n: (args[i] if i < len(args) else kwargs.get(n)) for i, n in enumerate(names)}
    x, w = got["input"], got["weight"]
    if not isinstance(x, torch.Tensor) or not isinstance(w, torch.Tensor) or w.dtype not in _HALF \
            or w.dtype != x.dtype:
        return
    for stat in ("running_mean", "running_var"):
        t = got[stat]
        if isinstance(t, torch.Tensor) and t.dtype != w.dtype:
            raise RuntimeError(f"Expected {stat} to have type {_NAMES.get(w.dtype, str(w.dtype))} but got "
                               f"{_NAMES.get(t.dtype, str(t.dtype))}")


CHECKS: dict[str, Callable[[tuple, dict], None]] = {
    "native_batch_norm_backward": _batch_norm_backward,
}


def check(name: str, args: tuple, kwargs: dict) -> Any:
    """Raise as the CUDA kernel of op `name` would for these arguments (no-op for ops without a check)."""
    fn = CHECKS.get(name)
    if fn is not None:
        fn(args, kwargs)
