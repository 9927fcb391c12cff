"""Multi-tensor ops: `_foreach_*` and the fused optimizers (Adam(W), SGD, Adagrad), with the launch count of
PyTorch's multi_tensor_apply.
"""

from __future__ import annotations

from ..signature import Signature
from .common import OPTIMIZER, Work, _bytes_in, _list_bytes, _list_count, _list_numel, _packet, numel


# PyTorch's multi_tensor_apply (ATen/native/cuda/MultiTensorApply.cuh): chunks of 65536 elements, at most 320
# blocks and depth_to_max_tensors[depth-1] tensors per launch.
_MTA_CHUNK = 65536
_MTA_BLOCKS = 320
_MTA_MAX_TENSORS = (110, 64, 48, 36, 30)


def _mta_launches(entries, depth: int) -> int:
    count = _list_count(entries)
    if count == 0:
        return 1
    chunks = sum(-(-numel(s) // _MTA_CHUNK) * n for s, _, n in entries if s is not None)
    max_t = _MTA_MAX_TENSORS[min(max(depth, 1), 5) - 1]
    return max(1, -(-chunks // _MTA_BLOCKS), -(-count // max_t))


_ADAM_FLOPS_PER_ELEMENT = 18       # weight decay 2, two moment updates 7, bias corrections, sqrt, divide, update


def _optimizer(sig: Signature, family: str) -> Work:
    _, name, _ = _packet(sig.op)
    lists = dict(sig.lists)
    if name.startswith(("_fused_adam", "_fused_adamw")):
        amsgrad = bool(sig.scalar("amsgrad", False))
        states = [0, 2, 3] + ([4] if amsgrad else [])
        read = sum(_list_bytes(lists.get(s, ())) for s in states + [1]) + _list_bytes(lists.get(5, ()))
        write = sum(_list_bytes(lists.get(s, ())) for s in states)
        params = lists.get(0, ())
        return Work(OPTIMIZER, float(_ADAM_FLOPS_PER_ELEMENT * _list_numel(params)), read + write,
                    launches=_mta_launches(params, 5 if amsgrad else 4))
    if name.startswith("_fused_"):
        params = lists.get(0, ())
        read = sum(_list_bytes(e) for e in lists.values())
        return Work(OPTIMIZER, float(4 * _list_numel(params)), read + 2 * _list_bytes(params),
                    launches=_mta_launches(params, len(lists)))
    # _foreach_*: first list is self; in-place forms write it back, out-of-place ones write a new list like it
    first = lists.get(min(lists)) if lists else ()
    n_lists = len(lists)
    base = name.rstrip("_")
    inplace = name.endswith("_")
    write_only = base in ("_foreach_zero",)
    read = 0.0 if write_only else sum(_list_bytes(e) for s, e in lists.items()
                                      if not (base == "_foreach_copy" and s == min(lists)))
    read += _bytes_in(sig, lists=False)            # single tensors (e.g. a tensor alpha)
    if base in ("_foreach_norm", "_foreach_max"):
        write = 4.0 * _list_count(first)
    else:
        write = _list_bytes(first)
    flops = float(_list_numel(first) * max(1, n_lists - (1 if inplace else 0)))
    return Work(OPTIMIZER, flops, read + write, launches=_mta_launches(first, n_lists + (0 if inplace else 1)))
