"""Expert routing on placeholder scores: the one place where a simulated mixture-of-experts step gets its token
counts, for every framework.

A router's top-k (or argmax) over its expert scores reads values a fake tensor does not have. Without a rule its
indices are placeholders, every per-expert count derived from them reads 0, and the all-to-all split sizes and
grouped-GEMM offsets a framework computes from those counts are 0 too (its experts get no tokens). Here the
indices are marked instead, as a *route*: "each of these rows picks `top_k` of `experts` experts". The mark follows
the tensor through reshapes, copies and the one-hot routing maps frameworks build from it (`scatter` into the
expert dimension, `one_hot`, the sum of two maps), and an op that counts the picks per expert (a sum of a routing
map over every token dimension, `bincount`, `histc`) gets a known value: the counts of the run's routing distribution
(`phantora.routing.expert_counts`, `phantora run --routing`, balanced by default). From there the values rules
(values.py) and the collectives that carry small known values (exchange.py) take the counts to the split lists and
offsets, so the all-to-all moves, and the expert GEMMs compute, the tokens the distribution assigns.

Nothing here is framework code: TorchTitan (`scatter_` of the top-k ids, `sum(dim=(0, 1))`), Megatron-core
(`scatter` into a routing map, `sum(dim=0)`) and DeepSpeed (`one_hot` of an argmax, top-2's two masks added,
`sum(dim=0)`) count the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily
from torch.utils.weak import WeakIdKeyDictionary

from phantora import routing


@dataclass(frozen=True)
class Route:
    kind: str          # "ids": expert indices, `top_k` per token; "map": one row of `experts` flags per token
    experts: int
    top_k: int
    expert_last: bool = True     # a map's expert dimension is its last (False: a transposed [experts, tokens] map)
    first: int = 0               # a map's columns are experts first .. first + experts - 1 of the router's
    total: int = 0               # the router's experts (0: `experts`, the whole map)
    capacity: int = 0            # a map's tokens per expert at most (0: no capacity); "cap": the capacity a
                                 # top-k over the tokens keeps per expert, "capmask": the mask it scatters into

    @property
    def router_experts(self) -> int:
        return self.total or self.experts


_KEEP = {"view", "_unsafe_view", "reshape", "flatten", "detach", "alias", "clone", "_to_copy", "contiguous",
         "unsqueeze", "squeeze", "lift_fresh", "_reshape_alias"}
_SCATTER = {"scatter", "scatter_", "scatter_add", "scatter_add_", "scatter_reduce", "scatter_reduce_"}
_COUNT = {"sum", "count_nonzero", "bincount", "histc"}
_TRANSPOSE = {"t", "transpose", "permute", "numpy_T"}


def _dim(d: Any, ndim: int) -> int | None:
    if not isinstance(d, int):
        return None
    return d + ndim if d < 0 else d


class RouteTable:
    def __init__(self) -> None:
        self.table: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.spec: routing.RoutingSpec | None = None

    def distribution(self) -> routing.RoutingSpec:
        if self.spec is None:
            from . import context
            ctx = context.CTX
            self.spec = getattr(getattr(ctx, "config", None), "routing", None) or routing.BALANCED
        return self.spec

    def get(self, t: Any) -> Route | None:
        return self.table.get(t) if isinstance(t, FakeTensor) else None

    def picks(self, mask: Any) -> int | None:
        """The set flags of a routing map used as a mask (`masked_select`), None if `mask` is not one."""
        route = self.get(mask)
        return self._picks(route, mask.numel()) if route is not None and route.kind == "map" else None

    def _counts(self, route: Route, tokens: int) -> list[int]:
        """Tokens per expert of the map's columns, for `tokens` rows (at most the map's capacity, where the
        framework drops what exceeds it)."""
        counts = routing.expert_counts(self.distribution(), tokens, route.top_k, route.router_experts)
        counts = list(counts[route.first:route.first + route.experts])
        return [min(c, route.capacity) for c in counts] if route.capacity else counts

    def _picks(self, route: Route, numel: int) -> int:
        """How many entries of a routing map of `numel` flags are set: `top_k` per token, or what falls in its
        columns when it holds some of the router's experts or has a capacity."""
        tokens = numel // route.experts
        if route.experts == route.router_experts and not route.capacity:
            return tokens * route.top_k
        return int(sum(self._counts(route, tokens)))

    def gathered(self, output: Any, inputs: list) -> None:
        """Members' routes concatenated along the tokens (an all-gather of a routing map or of expert ids, as
        Megatron-core's all-gather dispatcher gathers its routing map over TP x EP): the output is one too."""
        if not self.table or not isinstance(output, FakeTensor):
            return
        routes = {self.get(x) for x in inputs}
        if len(routes) != 1 or None in routes:
            return
        route = routes.pop()
        x = inputs[0]
        if route.kind == "map" and route.expert_last and output.dim() == x.dim() and output.shape[-1] == x.shape[-1]:
            self._mark(output, route)
        elif route.kind == "ids" and output.dim() == x.dim() and tuple(output.shape[1:]) == tuple(x.shape[1:]):
            self._mark(output, route)

    def _mark(self, t: Any, route: Route) -> None:
        if isinstance(t, FakeTensor):
            self.table[t] = route

    def after_op(self, packet: str, args: tuple, kwargs: dict, out: Any, values: Any) -> None:
        """Mark the outputs of routing ops; give counting ops on routes their value (`values`: the ValueTable)."""
        if packet in ("topk", "argmax", "max") and args and isinstance(args[0], FakeTensor):
            self._router(packet, args, kwargs, out, values)
            return
        if not self.table or not args:
            return
        src = self.get(args[0])
        if packet in _KEEP:
            if src is not None and isinstance(out, FakeTensor):
                if src.kind == "ids" or (out.dim() and out.shape[-1 if src.expert_last else 0] == src.experts):
                    self._mark(out, src)
        elif packet == "slice":
            self._slice(src, args, kwargs, out)
        elif packet in _TRANSPOSE:
            # a [tokens, experts] map transposed to [experts, tokens] (Megatron-core's permute), and back
            if src is not None and src.kind == "map" and isinstance(out, FakeTensor) and out.dim() == 2 \
                    and _swaps(packet, args, kwargs):
                self._mark(out, replace(src, expert_last=not src.expert_last))
        elif packet in _SCATTER:
            self._scatter(args, kwargs, out)
        elif packet == "eq":
            self._compare(args, out)
        elif packet == "add" and len(args) > 1:
            other = self.get(args[1])          # two routing maps added: every row carries both picks
            if src is not None and other is not None and src.kind == other.kind == "map" \
                    and src.experts == other.experts and isinstance(out, FakeTensor):
                self._mark(out, Route("map", src.experts, src.top_k + other.top_k))
        elif packet in ("logical_and", "bitwise_and") and len(args) > 1:
            self._capped(src, self.get(args[1]), out)
        elif packet == "one_hot":
            ids = src
            if ids is not None and ids.kind == "ids" and isinstance(out, FakeTensor) and out.shape[-1] == ids.experts:
                self._mark(out, Route("map", ids.experts, ids.top_k))
        elif packet in _COUNT and src is not None and isinstance(out, FakeTensor):
            self._count(packet, src, args, kwargs, out, values)

    def _slice(self, src: Route | None, args, kwargs, out) -> None:
        # slice(self, dim, start, end, step): a map's rows (tokens), or some of its experts (Megatron-core's
        # all-gather dispatcher keeps its local experts' columns)
        if src is None or src.kind != "map" or not isinstance(out, FakeTensor) or out.dim() != args[0].dim():
            return
        x = args[0]
        dim = _dim(args[1] if len(args) > 1 else kwargs.get("dim", 0), x.dim())
        step = args[4] if len(args) > 4 else kwargs.get("step", 1)
        expert_dim = x.dim() - 1 if src.expert_last else 0
        if dim != expert_dim:
            self._mark(out, src)
            return
        start = args[2] if len(args) > 2 else kwargs.get("start", 0)
        if step != 1 or not isinstance(start, int):
            return
        start = max(start + src.experts if start < 0 else start, 0)
        self._mark(out, replace(src, experts=int(out.shape[dim]), first=src.first + start, total=src.router_experts))

    def _capped(self, a: Route | None, b: Route | None, out) -> None:
        # a routing map and a mask: the map, less what the mask drops (Megatron-core's token dropping:
        # logical_and(routing_map, capacity_mask)). A capacity mask caps each expert's tokens; another mask (all
        # ones where the capacity exceeds the tokens, a padding mask) is taken to keep every pick
        if not isinstance(out, FakeTensor):
            return
        routes = [r for r in (a, b) if r is not None]
        maps = [r for r in routes if r.kind == "map"]
        if len(maps) != 1 or out.dim() != 2:
            return
        m = maps[0]
        caps = [r.capacity for r in routes if r.kind == "capmask" and r.experts == m.experts]
        cap = min(caps + ([m.capacity] if m.capacity else [])) if caps else m.capacity
        self._mark(out, Route("map", m.experts, m.top_k, m.expert_last, m.first, m.total, cap))

    def _router(self, packet, args, kwargs, out, values) -> None:
        x = args[0]
        if values.get(x) is not None or x.dim() == 0:
            return
        if packet != "argmax" and not isinstance(out, (tuple, list)):
            return
        if packet == "topk":
            k = args[1] if len(args) > 1 else kwargs.get("k")
            dim = _dim(args[2] if len(args) > 2 else kwargs.get("dim", -1), x.dim())
            ids = out[1]
            if dim == 0 and x.dim() == 2 and isinstance(k, int) and 0 < k < x.shape[0]:
                # the top-k tokens of each expert's column: the tokens an expert keeps at its capacity k
                self._mark(ids, Route("cap", int(x.shape[-1]), 0, capacity=int(k)))
                return
        elif packet == "argmax":
            k, ids = 1, out
            dim = _dim(args[1] if len(args) > 1 else kwargs.get("dim"), x.dim())
        else:                                        # max.dim: (values, indices)
            if len(args) < 2 and "dim" not in kwargs:
                return
            k, ids = 1, out[1]
            dim = _dim(args[1] if len(args) > 1 else kwargs.get("dim"), x.dim())
        experts = x.shape[-1]
        if dim != x.dim() - 1 or not isinstance(k, int) or not 0 < k < experts:
            return
        self._mark(ids, Route("ids", int(experts), int(k)))

    def _scatter(self, args, kwargs, out) -> None:
        # scatter(self, dim, index, src|value): a one-hot routing map when the index is a route over self's last dim
        if len(args) < 3:
            return
        target, dim, index = args[0], args[1], args[2]
        ids = self.get(index)
        if ids is not None and ids.kind == "cap" and isinstance(target, torch.Tensor) and target.dim() == 2 \
                and _dim(dim, 2) == 0 and target.shape[-1] == ids.experts:
            route = Route("capmask", ids.experts, 0, capacity=ids.capacity)    # each column's kept tokens
            self._mark(out, route)
            if packet_is_inplace(out, target):
                self._mark(target, route)
            return
        if ids is None or ids.kind != "ids" or not isinstance(target, torch.Tensor):
            return
        if _dim(dim, target.dim()) != target.dim() - 1 or target.shape[-1] != ids.experts:
            return
        route = Route("map", ids.experts, ids.top_k)
        self._mark(out, route)
        if packet_is_inplace(out, target):
            self._mark(target, route)

    def _compare(self, args, out) -> None:
        # one_hot's decomposition: ids.unsqueeze(-1) == arange(experts), one flag row per pick
        if len(args) < 2:
            return
        ids = self.get(args[0]) or self.get(args[1])
        if ids is None or ids.kind != "ids" or not isinstance(out, FakeTensor) or not out.dim():
            return
        if out.shape[-1] == ids.experts:
            self._mark(out, Route("map", ids.experts, 1))     # each pick its own row of flags

    def _count(self, packet, src: Route, args, kwargs, out, values) -> None:
        experts = src.experts
        if packet in ("sum", "count_nonzero") and src.kind == "map" and out.dim() == 0 \
                and not (args[1:] or kwargs.get("dim")):
            with unset_fake_temporarily():                # every flag of the map: the tokens routed in all
                values.set(out, torch.tensor(self._picks(src, args[0].numel()), dtype=out.dtype))
            return
        if not src.expert_last:
            return
        if tuple(out.shape) != (experts,) and tuple(s for s in out.shape if s != 1) != (experts,):
            return
        if packet in ("sum", "count_nonzero"):
            x = args[0]
            dims = args[1] if len(args) > 1 else kwargs.get("dim")
            dims = [dims] if isinstance(dims, int) else list(dims or ())
            if src.kind != "map" or not dims or x.dim() - 1 in {_dim(d, x.dim()) for d in dims}:
                return                               # the expert dimension itself is summed: not a count
            tokens = x.numel() // experts
            counts = self._counts(src, tokens)
        else:                                        # bincount / histc over the ids
            if src.kind != "ids":
                return
            tokens = args[0].numel() // src.top_k
            counts = routing.expert_counts(self.distribution(), tokens, src.top_k, experts)
        with unset_fake_temporarily():
            value = torch.tensor(counts, dtype=out.dtype).reshape(out.shape)
        values.set(out, value)


def _swaps(packet: str, args: tuple, kwargs: dict) -> bool:
    """Whether a transpose-like op on a 2-D tensor swaps its two dimensions (`t`, `.T`, `transpose(0, 1)`,
    `permute([1, 0])`), whatever their sizes."""
    if packet in ("t", "numpy_T"):
        return True
    if packet == "transpose":
        d0 = args[1] if len(args) > 1 else kwargs.get("dim0")
        d1 = args[2] if len(args) > 2 else kwargs.get("dim1")
        return isinstance(d0, int) and isinstance(d1, int) and d0 % 2 != d1 % 2
    dims = args[1] if len(args) > 1 else kwargs.get("dims")
    return dims is not None and [d % 2 for d in dims] == [1, 0]


def packet_is_inplace(out: Any, target: Any) -> bool:
    return out is target


ROUTES = RouteTable()
