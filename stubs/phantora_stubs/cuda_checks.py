"""Checks CUDA kernels make that the fake (meta) kernels do not, so that a program that fails on a GPU fails in its
simulation too, with the GPU's message, instead of running on as something it is not.

- BatchNorm's backward with half-precision weights (bf16 / fp16, the input's dtype) needs the running statistics in
  that dtype too: CUDA raises "Expected running_mean to have type BFloat16 but got Float". The forward accepts the
  mix, and fp32 weights with a half input (mixed precision) pass both ways (measured on an H200:
  groundtruth/deepspeed/bn_dtypes.py, h200x2/bn_dtypes.txt). DeepSpeed's bf16 engine casts a model's parameters but
  not its buffers, so a ResNet trained that way stops in its first backward on a real GPU.
- A random op given a generator of another device type: each kernel takes its device's generator
  (`at::check_generator<CPUGeneratorImpl>` / `<CUDAGeneratorImpl>`, ATen/core/Generator.h) and raises "Expected a
  'cpu' device type for generator but found 'cuda'" (or the reverse). A shuffled DataLoader given
  `generator=torch.Generator(device="cuda")` stops there on a GPU host (its seed is drawn with `random_` of a host
  tensor). The simulation's CUDA generators are CPU generators underneath (cuda_rng.py), and a fake kernel ignores
  its generator, so without this check both ran.
- FP8 GEMMs (`torch._scaled_mm` and its grouped form) on a GPU without FP8 tensor cores (compute capability below
  8.9: the A100, the RTX 3090): CUDA raises; they had been costed at the bf16 rate. Two e5m2 operands: ATen
  refuses them on every NVIDIA GPU (a ValueError).
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


def generator_device(name: str, gen: Any, args: tuple, kwargs: dict) -> None:
    """Raise as `check_generator` does when random op `name`'s generator is of another device type than the op's
    kernel: its `device` argument, else its first tensor argument's device (`out=` among them), else the host.
    `randperm` on CUDA draws through `random_` on the device (Randperm.cu), so it checks too."""
    from .cuda_rng import generator_device_type
    gen_type = generator_device_type(gen)
    if gen_type not in ("cpu", "cuda"):
        return
    dev = kwargs.get("device")
    if dev is not None:
        op_type = torch.device(dev).type
    else:
        first = next((a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)), None)
        op_type = first.device.type if first is not None else "cpu"     # a tensor argument, or `out=`
    if op_type not in ("cpu", "cuda") or op_type == gen_type:
        return
    raise RuntimeError(f"Expected a '{op_type}' device type for generator but found '{gen_type}'")


SM_VERSION = [90]
"""The simulated GPU's compute capability as 10 x major + minor (set by the interceptor from the GPU preset)."""


def _scaled_mm(args: tuple, kwargs: dict) -> None:
    """FP8 GEMMs need FP8 tensor cores: sm89 (Ada) or sm90 and later. ATen's check (native/cuda/Blas.cpp) raises
    on an A100 or an RTX 3090, where the simulation had costed them at the bf16 rate."""
    sm = SM_VERSION[0]
    if sm < 89:
        raise RuntimeError("torch._scaled_mm is only supported on CUDA devices with compute capability >= 9.0 or "
                           f"8.9, or ROCm MI300+ (this GPU: {sm // 10}.{sm % 10})")
    a = args[0] if args else kwargs.get("self")
    b = args[1] if len(args) > 1 else kwargs.get("mat2")
    if getattr(a, "dtype", None) == torch.float8_e5m2 and getattr(b, "dtype", None) == torch.float8_e5m2:
        raise ValueError("Multiplication of two Float8_e5m2 matrices is not supported")     # ATen's own check


def _scaled_grouped_mm(args: tuple, kwargs: dict) -> None:
    """The grouped FP8 GEMM (MoE experts) has kernels for sm90 and later only."""
    sm = SM_VERSION[0]
    if sm < 90:
        raise RuntimeError(f"torch._scaled_grouped_mm is only supported on CUDA devices with compute capability 9.0 "
                           f"or later (this GPU: {sm // 10}.{sm % 10})")


CHECKS: dict[str, Callable[[tuple, dict], None]] = {
    "native_batch_norm_backward": _batch_norm_backward,
    "_scaled_mm": _scaled_mm,
    "_scaled_mm_v2": _scaled_mm,
    "_scaled_grouped_mm": _scaled_grouped_mm,
}


def check(name: str, args: tuple, kwargs: dict) -> Any:
    """Raise as the CUDA kernel of op `name` would for these arguments (no-op for ops without a check)."""
    fn = CHECKS.get(name)
    if fn is not None:
        fn(args, kwargs)
