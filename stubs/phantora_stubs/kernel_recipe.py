"""The recipe of a generated kernel: the aten ops Inductor fused into it, with the shapes, strides and dtypes of
what it reads, as compact JSON. `phantora profile` rebuilds the ops from it on a GPU host, compiles them with
Inductor there and times the kernel (phantora/costmodel/generated.py, which documents the format).

A recipe is made only where every value is static and every argument can be written down (tensors, numbers,
strings, dtypes, devices, memory formats, layouts and lists of these); otherwise the kernel has none and stays
costed by the roofline.
"""

from __future__ import annotations

import json
from typing import Any

import torch

_NAMESPACES = ("aten", "prims")          # ops a GPU host can call by name; Inductor's own (random seeds...) are not


class _NoRecipe(Exception):
    pass


def static_ints(xs: Any) -> list[int]:
    """Sizes or strides as ints; _NoRecipe where one is symbolic (int() of a SymInt would specialize the graph's
    shape environment to the size at hand: a torch.SymInt is not an int)."""
    out = []
    for x in xs:
        if not isinstance(x, int):
            raise _NoRecipe
        out.append(x)
    return out


def _target_name(target: Any) -> str:
    if not isinstance(target, torch._ops.OpOverload) or target._schema.is_mutable:
        raise _NoRecipe             # post-grad graphs' kernels are functional; a mutating op is not rebuilt
    ns, rest = target.name().split("::", 1)
    if ns not in _NAMESPACES:
        raise _NoRecipe
    packet, _, overload = rest.partition(".")
    return f"{ns}.{packet}.{overload or 'default'}"


def _tensor_meta(node: torch.fx.Node) -> list:
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        raise _NoRecipe
    try:
        shape, stride = static_ints(val.shape), static_ints(val.stride())
    except RuntimeError:
        raise _NoRecipe from None       # no strides (sparse, nested)
    return [shape, stride, str(val.dtype).removeprefix("torch.")]


def _nbytes(meta: list) -> int:
    shape, _stride, dtype = meta
    n = 1
    for s in shape:
        n *= s
    return n * getattr(torch, dtype).itemsize


def recipe(nodes: list[torch.fx.Node], outputs: list[torch.fx.Node]) -> tuple[str | None, int]:
    """(recipe, bytes its inputs and stored values hold) of a kernel computing `nodes` (in graph order) and storing
    `outputs`; (None, 0) where it cannot be written down."""
    local = {n: i for i, n in enumerate(nodes)}
    inputs: dict[torch.fx.Node, int] = {}
    metas: list = []

    def encode(v: Any) -> Any:
        if isinstance(v, torch.fx.Node):
            if v in local:
                return {"n": local[v]}
            if v not in inputs:
                metas.append(_tensor_meta(v))
                inputs[v] = len(metas) - 1
            return {"in": inputs[v]}
        if v is None or isinstance(v, (bool, int, str)):
            return v
        if isinstance(v, float):
            if v != v or v in (float("inf"), float("-inf")):
                return {"float": str(v)}
            return v
        if isinstance(v, torch.dtype):
            return {"dtype": str(v).removeprefix("torch.")}
        if isinstance(v, torch.device):
            return {"device": v.type}
        if isinstance(v, (torch.memory_format, torch.layout)):
            return {"enum": str(v).removeprefix("torch.")}
        if isinstance(v, (list, tuple)):
            return [encode(x) for x in v]
        raise _NoRecipe

    try:
        ops = [[_target_name(n.target), encode(list(n.args)), {k: encode(v) for k, v in n.kwargs.items()}]
               for n in nodes]
        out = [local[n] for n in outputs]
        moved = sum(_nbytes(m) for m in metas) + sum(_nbytes(_tensor_meta(n)) for n in outputs)
    except _NoRecipe:
        return None, 0
    if not out:
        return None, 0
    return json.dumps({"in": metas, "ops": ops, "out": out}, separators=(",", ":")), moved
