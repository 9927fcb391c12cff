"""Make ops on fake CUDA tensors dispatch as a CUDA build of torch dispatches them.

**Fused kernels.** A CPU-only torch has no CUDA kernels. For an op that has both a kernel for CUDA (in a CUDA build)
and a CompositeImplicitAutograd kernel, the dispatcher then sends CUDA tensors to the composite, and the rank records
its decomposition where a real GPU runs one kernel: RMSNorm became `_to_copy, pow, mean, add, rsqrt, mul, mul,
_to_copy` forward and a dozen ops backward, SiLU's backward `sigmoid, fill_, sub_, mul, add, mul, mul`. Measured on
an H100 (Llama 3 8B, 8 layers, torch 2.11): those decompositions cost 13% of the step the real run does not spend.
Registering a placeholder kernel for the CUDA key restores the CUDA build's dispatch table: the autograd kernel
runs, the Python key (fake mode and interceptor) sees the one fused op. The placeholder itself never runs on fake
tensors; it raises if anything reaches it.

`FUSED_CUDA_OPS` lists the ops, each with the first torch release whose CUDA build has the kernel (None: every
release Phantora supports). `_fused_rms_norm` is what `F.rms_norm` dispatches to from torch 2.8 (pytorch/pytorch
PR 153666); torch 2.6/2.7 ran RMSNorm as the composite, and emulating an older release (`PHANTORA_TORCH_CUDA`) keeps
the decomposition.

**SDPA order.** On an sm90/sm100 GPU with its bundled cuDNN, torch from 2.9 puts the cuDNN attention backend first
(`check_prefer_cudnn_attention` in aten/src/ATen/native/transformers/cuda/sdp_utils.cpp; observed: torch 2.11+cu130
on an H100 runs `_cudnn_attention_forward/backward`); earlier releases, and every other GPU, put flash attention
first. The CPU build's default order is the latter, so `install` sets the emulated release's order once; a script's
`sdpa_kernel(..., set_priority=True)` still changes it as on a GPU. `PHANTORA_SDPA` forces an order over both, for
reproducing a run whose framework version chose differently. `cuda_sdpa.plan_sdpa` walks `sdpa_order()`.
"""

from __future__ import annotations

import torch

from phantora.software import default_sdpa_order, parse_release

FUSED_CUDA_OPS: tuple[tuple[str, tuple[int, int] | None], ...] = (
    ("silu_backward", None),
    ("mish_backward", None),
    ("_fused_rms_norm", (2, 8)),
)
_ENUM = {"cudnn": "CUDNN_ATTENTION", "flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "math": "MATH"}

_LIB = None
_FORCED: tuple[str, ...] = ()
_DEFAULT_ORDER: tuple[str, ...] = ("flash", "efficient", "math", "cudnn")


def own_release() -> tuple[int, int]:
    release = parse_release(torch.__version__)
    assert release is not None, torch.__version__
    return release


def fused_ops(release: tuple[int, int]) -> list[str]:
    """The ops of FUSED_CUDA_OPS that a CUDA build of `release` runs as one kernel."""
    return [name for name, since in FUSED_CUDA_OPS if since is None or release >= since]


def _placeholder(name: str):
    def kernel(*args, **kwargs):
        raise RuntimeError(f"phantora: aten::{name} reached its placeholder CUDA kernel; fake CUDA tensors are "
                           f"handled by the fake mode before any backend kernel")
    return kernel


def install(release: tuple[int, int] | None, sm: int, forced: tuple[str, ...] = ()) -> list[str]:
    """Register the placeholder CUDA kernels and set the SDPA order, once per process. Returns the ops registered."""
    global _LIB, _FORCED, _DEFAULT_ORDER
    if _LIB is not None:
        return []
    release = release or own_release()
    _FORCED = tuple(forced)
    _DEFAULT_ORDER = default_sdpa_order(release, sm)
    _LIB = torch.library.Library("aten", "IMPL")
    registered = []
    for name in fused_ops(release):
        if not hasattr(torch.ops.aten, name):
            continue
        if torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{name}", "CUDA"):
            continue                                   # a CUDA build: nothing to restore
        _LIB.impl(name, _placeholder(name), "CUDA")
        registered.append(name)
    if hasattr(torch._C, "_set_sdp_priority_order"):
        backend = torch.nn.attention.SDPBackend
        ids = [int(getattr(backend, _ENUM[n])) for n in _DEFAULT_ORDER]
        torch._C._set_sdp_priority_order(ids + [int(backend.OVERRIDEABLE)])
    return registered


def sdpa_order() -> tuple[str, ...]:
    """The order the SDPA routing tries backends in: the forced one, else torch's current priority order (which
    `install` started at the emulated release's default and a script may have changed)."""
    if _FORCED:
        return _FORCED
    if not hasattr(torch._C, "_get_sdp_priority_order"):
        return _DEFAULT_ORDER
    names = {int(getattr(torch.nn.attention.SDPBackend, e)): n for n, e in _ENUM.items()}
    return tuple(names[i] for i in torch._C._get_sdp_priority_order() if i in names)
