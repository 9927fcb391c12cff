"""Ops whose traffic an index tensor sets: advanced indexing, gather / scatter / index_put, embedding lookups
and their backward, and nll_loss (one value gathered per row).
"""

from __future__ import annotations

from ..signature import Signature
from .common import (EMBEDDING, INDEX, LOSS, OTHER, Work, _list_bytes, _other, _packet, broadcast, itemsize,
                     numel)


def _embedding(sig: Signature, family: str) -> Work:
    _, name, _ = _packet(sig.op)
    if name == "embedding_dense_backward" or name == "embedding_backward":
        g, idx = sig.tensor(0), sig.tensor(1)
        d = g[0][-1]
        n_idx = numel(idx[0])
        nw = int(sig.scalar("num_weights", 0))
        out = nw * d * itemsize(g[1])
        # read grad rows and indices (sorted in a pre-pass: 2 more passes over them), zero-fill and
        # read-modify-write the weight gradient
        nbytes = n_idx * d * itemsize(g[1]) + 3 * n_idx * itemsize(idx[1]) + out + 2 * n_idx * d * itemsize(g[1])
        return Work(EMBEDDING, float(n_idx * d), float(nbytes))
    w, idx = sig.tensor(0), sig.tensor(1)
    if w is None or idx is None:
        return _other(sig, OTHER)
    d = w[0][-1]
    out_n = numel(idx[0]) * d
    return Work(EMBEDDING, 0.0, float(numel(idx[0]) * itemsize(idx[1]) + 2 * out_n * itemsize(w[1])))


def _loss(sig: Signature, family: str) -> Work:
    _, name, _ = _packet(sig.op)
    if name.endswith("_backward"):
        x, target = sig.tensor(1), sig.tensor(2)
        n = numel(x[0])
        # zero-fill grad_input, then scatter one value per row
        nbytes = n * itemsize(x[1]) + numel(target[0]) * (itemsize(target[1]) + itemsize(x[1]))
        return Work(LOSS, float(numel(target[0])), float(nbytes))
    x, target = sig.tensor(0), sig.tensor(1)
    if x is None or target is None:
        return _other(sig, OTHER)
    rows = numel(target[0])
    nbytes = rows * (itemsize(target[1]) + itemsize(x[1])) + (rows if sig.scalar("reduction", 1) == 0 else 1) * \
        itemsize(x[1]) + 4
    return Work(LOSS, float(rows), float(nbytes))


def _index(sig: Signature, family: str) -> Work:
    _, name, _ = _packet(sig.op)
    t = sig.tensor
    base = name.rstrip("_")
    if base in ("index", "_unsafe_index"):
        self_ = t(0)
        out_n = _advanced_index_numel(self_[0], sig.tensor_list(1))
        idx_bytes = _list_bytes(sig.tensor_list(1))
        return Work(INDEX, 0.0, float(idx_bytes + 2 * out_n * itemsize(self_[1])))
    if base in ("index_put", "_index_put_impl", "_unsafe_index_put"):
        self_, values = t(0), t(2)
        n = numel(values[0]) if values else 0
        idx_entries = sig.tensor_list(1)
        indexed = any(s is not None for s, _, _ in idx_entries)
        # the values broadcast over the indexed positions (x[idx] = v writes what x[idx] reads: the indexed
        # positions times the dims not indexed; a bool mask covers as many dims as it has, assumed all true):
        # the written elements are the larger of the two
        written = max(n, _advanced_index_numel(self_[0], idx_entries)) if indexed else n
        accumulate = bool(sig.scalar("accumulate", False))
        nbytes = _list_bytes(idx_entries) + n * itemsize(values[1]) + written * itemsize(self_[1]) * \
            (2 if accumulate else 1)
        if not name.endswith("_"):                 # functional form copies self first
            nbytes += 2 * numel(self_[0]) * itemsize(self_[1])
        return Work(INDEX, float(written if accumulate else 0), float(nbytes))
    if base == "gather":
        self_, idx = t(0), t(2)
        out_n = numel(idx[0])
        return Work(INDEX, 0.0, float(out_n * itemsize(idx[1]) + 2 * out_n * itemsize(self_[1])))
    if base == "index_select":
        self_, idx = t(0), t(2)
        dim = int(sig.scalar("dim", 0))
        shape = list(self_[0]) or [1]
        shape[dim % len(shape)] = numel(idx[0])
        out_n = numel(tuple(shape))
        return Work(INDEX, 0.0, float(numel(idx[0]) * itemsize(idx[1]) + 2 * out_n * itemsize(self_[1])))
    if base in ("scatter", "scatter_add", "scatter_reduce", "index_add", "index_copy"):
        self_, idx, src = t(0), t(2), t(3)
        m = numel(src[0]) if src else numel(idx[0])
        nbytes = numel(idx[0]) * itemsize(idx[1]) + m * itemsize(self_[1]) * (3 if src else 2)
        if not name.endswith("_"):
            nbytes += 2 * numel(self_[0]) * itemsize(self_[1])
        return Work(INDEX, float(m if base in ("scatter_add", "scatter_reduce", "index_add") else 0), float(nbytes))
    return _other(sig, OTHER)


def _advanced_index_numel(shape: tuple[int, ...], entries) -> int:
    """Output elements of x[indices]: broadcast index shape times the dims not indexed.

    Index entries are taken in the recorded order (None = a full slice of that dim); a bool mask is assumed all
    true (an upper bound: its true count is data)."""
    idx_shapes = []
    kept = 1
    dim = 0
    for s, d, n in entries:
        for _ in range(n):
            if s is None:
                kept *= shape[dim] if dim < len(shape) else 1
                dim += 1
            elif d in ("bool", "uint8"):
                idx_shapes.append((numel(s),))
                dim += len(s)
            else:
                idx_shapes.append(s)
                dim += 1
    for rest in shape[dim:]:
        kept *= rest
    return numel(broadcast(idx_shapes)) * kept if idx_shapes else numel(shape)
