"""Which fused attention kernel `F.scaled_dot_product_attention` runs on fake CUDA tensors, as a CUDA build decides.

A CPU build of torch has no CUDA attention backends: its SDPA would decompose into the math path's matmuls and
softmax, and `torch.backends.cuda.can_use_*_attention` and `torch._fused_sdp_choice` answer "no" or fail for CUDA
tensors. Here `aten::scaled_dot_product_attention` is re-registered for the CUDA and AutogradCUDA keys: it tries the
backends in torch's priority order (`cuda_dispatch.sdpa_order`) and calls the first whose constraints hold
(`accepts`), preparing its inputs as ATen's `scaled_dot_product_attention` does. The backend queries answer from
the same rules, so a script (or torch's own `CausalBias`) that asks before it calls sees what it would on a GPU.

The constraints are those measured on an H200 with torch 2.11 (CUDA 13.0, cuDNN 9.19) over 236 input cases by
groundtruth/insitu/sdpa_choice.py (`h200-sdpa/sdpa_choice.json`; tests/test_sdpa_choice.py replays every case):

- cuDNN: sm80 or newer; fp16/bf16; query and key head dims equal, at most 256 and multiples of 8 (the value's may
  differ, with the same bounds); masks (a boolean mask becomes an additive one of the query's dtype, its shape
  kept), dropout, grouped-query attention and causal attention with fewer queries than keys all accepted.
- flash: sm80 or newer; fp16/bf16; no mask; one head dim for query, key and value, at most 256 (one that is not a
  multiple of 8 is padded to one, and the output sliced back); not causal with fewer queries than keys.
- memory-efficient: fp32/fp16/bf16; query and key head dims equal; every head dim a multiple of 16 bytes (8
  elements in fp16/bf16, 4 in fp32); one head count for query, key and value (`enable_gqa` with equal counts is
  fine); masks expanded to (batch, heads, queries, keys).
- math: everything else.
"""

from __future__ import annotations

import math

import torch

_NAMES = ("flash", "efficient", "cudnn")
_ENUM = {"math": 0, "flash": 1, "efficient": 2, "cudnn": 3}


def _sm_version() -> int:
    from .context import CTX
    if CTX is None:
        return 90
    return CTX.gpu.sm_version


def _enabled(name: str) -> bool:
    flag = {"flash": "flash_sdp_enabled", "efficient": "mem_efficient_sdp_enabled",
            "cudnn": "cudnn_sdp_enabled"}[name]
    fn = getattr(torch.backends.cuda, flag, None)
    return bool(fn()) if fn is not None else False


def accepts(name: str, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, enable_gqa=False) -> bool:
    """Whether backend `name` ('cudnn', 'flash' or 'efficient') would run this attention on the simulated GPU."""
    if not _enabled(name):
        return False
    if not (q.dim() == 4 and k.dim() == 4 and v.dim() == 4):
        return False
    if not (q.dtype == k.dtype == v.dtype):
        return False
    half = q.dtype in (torch.float16, torch.bfloat16)
    d_qk, d_v = q.size(-1), v.size(-1)
    equal_heads = q.size(1) == k.size(1) == v.size(1)
    grouped = enable_gqa and k.size(1) == v.size(1) and k.size(1) > 0 and q.size(1) % k.size(1) == 0
    sm = _sm_version()
    if name == "cudnn":
        return (sm >= 80 and half and k.size(-1) == d_qk and 0 < d_qk <= 256 and d_qk % 8 == 0
                and 0 < d_v <= 256 and d_v % 8 == 0 and (equal_heads or grouped))
    if name == "flash":
        return (sm >= 80 and half and attn_mask is None and k.size(-1) == d_qk == d_v and 0 < d_qk <= 256
                and (equal_heads or grouped) and not (is_causal and q.size(-2) != k.size(-2)))
    if name == "efficient":
        align = 8 if half else 4
        return (q.dtype in (torch.float32, torch.float16, torch.bfloat16) and k.size(-1) == d_qk
                and d_qk > 0 and d_qk % align == 0 and d_v > 0 and d_v % align == 0 and equal_heads)
    raise ValueError(f"unknown SDPA backend {name!r}")


def choice(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, enable_gqa=False) -> str:
    """The backend SDPA runs: the first in the priority order that accepts the inputs, else math; where math is
    disabled too (`sdpa_kernel([SDPBackend.FLASH_ATTENTION])` with inputs flash refuses), PyTorch's error."""
    from . import cuda_dispatch
    for name in cuda_dispatch.sdpa_order():
        if name == "math":
            break
        if accepts(name, q, k, v, attn_mask, dropout_p, is_causal, enable_gqa):
            return name
    math_enabled = getattr(torch.backends.cuda, "math_sdp_enabled", None)
    if math_enabled is not None and not math_enabled():
        enabled = [n for n in ("flash", "efficient", "cudnn") if _enabled(n)]
        raise RuntimeError(f"No available kernel. Aborting execution. (phantora: the enabled SDPA backends "
                           f"({', '.join(enabled) or 'none'}) do not accept these inputs (query {q.dtype} "
                           f"{tuple(q.shape)}, mask {'given' if attn_mask is not None else 'none'}) and the math "
                           f"backend is disabled, as a CUDA build refuses them)")
    return "math"


def _additive(mask, dtype):
    """A boolean mask as the additive mask ATen converts it to (0 where kept, -inf where masked)."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, float("-inf"))


def plan_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """The op CUDA's SDPA would run: (op, args, kwargs, a function from the op's outputs to the attention output)."""
    q, k, v = query, key, value
    need_lse = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    name = choice(q, k, v, attn_mask, dropout_p, is_causal, enable_gqa)
    if name == "cudnn":
        return (torch.ops.aten._scaled_dot_product_cudnn_attention.default,
                (q, k, v, _additive(attn_mask, q.dtype), need_lse, float(dropout_p), bool(is_causal), False),
                {"scale": scale}, lambda o: o[0])
    if name == "flash":
        head = q.size(-1)
        pad = -head % 8
        if pad == 0:
            return (torch.ops.aten._scaled_dot_product_flash_attention.default,
                    (q, k, v, float(dropout_p), bool(is_causal), False), {"scale": scale}, lambda o: o[0])
        # ATen pads the head dim to a multiple of 8 and scales by the unpadded one
        padded = [torch.nn.functional.pad(t, (0, pad)) for t in (q, k, v)]
        return (torch.ops.aten._scaled_dot_product_flash_attention.default,
                (*padded, float(dropout_p), bool(is_causal), False),
                {"scale": scale if scale is not None else 1.0 / math.sqrt(head)}, lambda o: o[0][..., :head])
    if name == "efficient":
        bias = _additive(attn_mask, q.dtype)
        if bias is not None:
            bias = bias.expand(q.size(0), q.size(1), q.size(2), k.size(2))
        return (torch.ops.aten._scaled_dot_product_efficient_attention.default,
                (q, k, v, bias, need_lse, float(dropout_p), bool(is_causal)), {"scale": scale}, lambda o: o[0])
    return (torch.ops.aten._scaled_dot_product_attention_math.default,
            (q, k, v, attn_mask, float(dropout_p), bool(is_causal)), {"scale": scale, "enable_gqa": enable_gqa},
            lambda o: o[0])


def validate(query, key, value, attn_mask=None) -> None:
    """ATen's checks of SDPA's inputs (`validate_sdpa_input`, run on every device before a backend is chosen), with
    its messages, and the mask's broadcast to (..., queries, keys), which every backend needs."""
    if not (query.dtype == key.dtype == value.dtype):
        raise RuntimeError(f"Expected query, key, and value to have the same dtype, but got query.dtype: "
                           f"{query.dtype} key.dtype: {key.dtype} and value.dtype: {value.dtype} instead.")
    if not (query.device == key.device == value.device):
        raise RuntimeError(f"Expected query, key, and value to have the same device type, but got query.device: "
                           f"{query.device} key.device: {key.device} and value.device: {value.device} instead.")
    if query.dim() < 2 or key.dim() < 2 or value.dim() < 2:
        raise RuntimeError(f"Expected query, key, and value to all be  at least 2 dimensional, but got query.dim: "
                           f"{query.dim()} key.dim: {key.dim()} and value.dim: {value.dim()} instead.")
    if attn_mask is not None:
        if attn_mask.dtype not in (torch.bool, torch.float32, query.dtype):
            raise RuntimeError(f"Expected attn_mask dtype to be bool or float or to match query dtype, but got "
                               f"attn_mask.dtype: {attn_mask.dtype} and  query.dtype: {query.dtype} instead.")
        torch.broadcast_shapes(tuple(attn_mask.shape), tuple(query.shape[:-1]) + (key.size(-2),))


def sdpa_cuda_kernel(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                     enable_gqa=False):
    """Kernel registered for aten::scaled_dot_product_attention on the CUDA (autograd) keys."""
    validate(query, key, value, attn_mask)
    func, args, kwargs, pick = plan_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    return pick(func(*args, **kwargs))


def _fake_cuda(t) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor
    return isinstance(t, FakeTensor) and t.device.type == "cuda"


def _answering(name: str, original):
    """torch._C._can_use_<name>_attention for SDPAParams on fake CUDA tensors; others go to the original."""
    def can_use(params, debug=False):
        if not _fake_cuda(params.query):
            return original(params, debug)
        return accepts(name, params.query, params.key, params.value, params.attn_mask, params.dropout,
                       params.is_causal, params.enable_gqa)
    can_use.__name__ = getattr(original, "__name__", f"_can_use_{name}_attention")
    return can_use


def _choosing(original):
    def fused_sdp_choice(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                         enable_gqa=False):
        if not _fake_cuda(query):
            return original(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
        return _ENUM[choice(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa)]
    fused_sdp_choice.__name__ = "_fused_sdp_choice"
    return fused_sdp_choice


_SDPA_LIB = None


def install() -> None:
    """Route aten::scaled_dot_product_attention for CUDA tensors and answer the backend queries (idempotent)."""
    global _SDPA_LIB
    if _SDPA_LIB is not None:
        return
    lib = torch.library.Library("aten", "IMPL")
    lib.impl("scaled_dot_product_attention", sdpa_cuda_kernel, "AutogradCUDA")
    lib.impl("scaled_dot_product_attention", sdpa_cuda_kernel, "CUDA")
    _SDPA_LIB = lib
    for name, attr in (("flash", "_can_use_flash_attention"), ("efficient", "_can_use_mem_efficient_attention"),
                       ("cudnn", "_can_use_cudnn_attention")):
        original = getattr(torch._C, attr, None)
        if original is not None:
            setattr(torch._C, attr, _answering(name, original))
    if hasattr(torch, "_fused_sdp_choice"):
        torch._fused_sdp_choice = _choosing(torch._fused_sdp_choice)
