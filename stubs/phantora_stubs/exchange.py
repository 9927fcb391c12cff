"""Real values through collectives: small tensors whose values are known (phantora_stubs.values) and Python objects.

A collective on small tensors (every tensor at most `values.SMALL_NUMEL` elements) exchanges their values through the
runtime (`Runtime.exchange`); shapes are the same on every rank of an SPMD program, so every member takes part, and a
member whose value is unknown sends None, which makes the result unknown (the outputs forget their values). A rank
simulated alone stands for every member of the group (each mirrors it), so an all-reduce SUM of x gives size × x.
Ranks mirrored in a live run (`--ranks auto`) contribute the value of the rank they mirror.

Large tensors carry model data, whose values are never known: nothing is exchanged for them.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import unset_fake_temporarily

from . import context
from .clock import METER
from .values import SMALL_NUMEL, VALUES


def _small(tensors: list[torch.Tensor]) -> bool:
    return bool(tensors) and all(isinstance(t, torch.Tensor) and t.numel() <= SMALL_NUMEL for t in tensors)


def _payload(tensors: list[torch.Tensor]) -> list | None:
    out = []
    with unset_fake_temporarily():
        for t in tensors:
            v = VALUES.get(t)
            if v is None:
                return None
            out.append(v.detach().cpu().numpy().copy())
    return out


def _exchange(gid: int, kind: str, payload: Any) -> Any:
    rt = context.get().runtime
    METER.enter()
    try:
        return rt.exchange(gid, kind, payload)
    finally:
        METER.exit()


def _store(tensors: list[torch.Tensor], arrays: list | None) -> None:
    if arrays is None:
        for t in tensors:
            VALUES.drop(t)
        return
    with unset_fake_temporarily():
        for t, a in zip(tensors, arrays):
            VALUES.set(t, torch.as_tensor(a).to(t.dtype).reshape(t.shape).clone())


_REDUCE = {"SUM": "sum", "AVG": "avg", "MAX": "max", "MIN": "min", "PRODUCT": "product"}


def reduce_kind(opts: Any) -> str | None:
    op = getattr(opts, "reduceOp", dist.ReduceOp.SUM) if opts is not None else dist.ReduceOp.SUM
    name = getattr(op, "name", None) or str(op).rsplit(".", 1)[-1]
    if hasattr(op, "op"):                     # a ReduceOp instance wrapping RedOpType
        name = str(op.op).rsplit(".", 1)[-1]
    return _REDUCE.get(str(name).upper())


def all_reduce(gid: int, tensors: list[torch.Tensor], opts: Any) -> None:
    if not _small(tensors):
        return
    kind = reduce_kind(opts)
    payload = _payload(tensors) if kind else None
    result = _exchange(gid, kind or "sum", payload)
    _store(tensors, _reduce_lists(kind, result))


def _reduce_lists(kind: str | None, result: Any) -> list | None:
    """Turn the combined result (a list of per-member payloads for "gather") into per-tensor arrays."""
    return None if kind is None else result


def broadcast(gid: int, tensors: list[torch.Tensor], root: int) -> None:
    if not _small(tensors):
        return
    _store(tensors, _exchange(gid, f"broadcast:{root}", _payload(tensors)))


def all_gather(gid: int, outputs: list[torch.Tensor], inputs: list[torch.Tensor]) -> None:
    """outputs[i] receives member i's input (list form) — one input tensor."""
    if not _small(inputs) or not _small(outputs):
        return
    members = _exchange(gid, "gather", _payload(inputs))
    if any(m is None for m in members):
        _store(outputs, None)
        return
    _store(outputs, [m[0] for m in members])


def all_gather_into(gid: int, output: torch.Tensor, input: torch.Tensor) -> None:
    """output = the members' inputs concatenated along dim 0."""
    if not _small([input]) or not _small([output]):
        return
    members = _exchange(gid, "gather", _payload([input]))
    if any(m is None for m in members):
        _store([output], None)
        return
    import numpy as np
    _store([output], [np.concatenate([np.reshape(m[0], (-1,) + tuple(input.shape[1:])) for m in members])])


def objects_gather(gid: int, obj: Any) -> list:
    return list(_exchange(gid, "gather", obj))


def objects_broadcast(gid: int, objs: Any, root: int) -> Any:
    return _exchange(gid, f"broadcast:{root}", objs)
