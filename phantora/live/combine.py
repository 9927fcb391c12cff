"""How a collective combines real values (small host-known tensors, Python objects) across the members of a group.

Used by the engine server of a live run and by a rank simulated alone (where every member mirrors it).
`kind`: "sum", "avg", "max", "min", "product" (payloads: numpy arrays of one shape, or lists of them reduced
element by element; a None payload, an unknown value, makes the result None), "gather" (any objects: the result is
the list of the members' payloads in group-rank order) or "broadcast:R" (the payload of group rank R).
"""

from __future__ import annotations

from typing import Any

import numpy as np

REDUCTIONS = ("sum", "avg", "max", "min", "product")


def combine(kind: str, payloads: list[Any]) -> Any:
    """The result of a collective of `kind` over the members' payloads (in group-rank order)."""
    if not payloads:
        raise ValueError("no payloads to combine")
    if kind == "gather":
        return list(payloads)
    if kind.startswith("broadcast:"):
        root = int(kind.split(":", 1)[1])
        if not 0 <= root < len(payloads):
            raise ValueError(f"broadcast root {root} outside a group of {len(payloads)}")
        return payloads[root]
    if kind not in REDUCTIONS:
        raise ValueError(f"unknown value-exchange kind {kind!r}")
    if any(p is None for p in payloads):
        return None                                   # a member's value is unknown: so is the result
    if isinstance(payloads[0], (list, tuple)):
        if len({len(p) for p in payloads}) != 1:
            raise ValueError("members reduce different numbers of tensors")
        return [combine(kind, [p[i] for p in payloads]) for i in range(len(payloads[0]))]
    arrays = [np.asarray(p) for p in payloads]
    if len({a.shape for a in arrays}) != 1:
        raise ValueError(f"members reduce values of different shapes {sorted({a.shape for a in arrays})}")
    if kind in ("sum", "avg"):
        out = arrays[0].copy()
        for a in arrays[1:]:
            out = out + a
        if kind == "avg":
            out = out / len(arrays) if np.issubdtype(out.dtype, np.floating) else out // len(arrays)
        return out.astype(arrays[0].dtype)
    if kind == "max":
        return np.maximum.reduce(arrays)
    if kind == "min":
        return np.minimum.reduce(arrays)
    if kind == "product":
        return np.multiply.reduce(arrays).astype(arrays[0].dtype)
    raise ValueError(f"unknown value-exchange kind {kind!r}")


def combine_mirrored(kind: str, payload: Any, size: int) -> Any:
    """`combine` when every one of the `size` members holds `payload`."""
    return combine(kind, [payload] * size)
