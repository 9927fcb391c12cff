"""DistributedDataParallel's start-up helpers, which are C++ that reads tensor data: the parameter-shape check,
`dist._broadcast_coalesced`, DDP's logger, bucket rebuilding and the static graph's first step."""

from __future__ import annotations

import functools
import sys
import weakref
from typing import Any

import torch
import torch.distributed as dist

from .clock import unmetered
from .dist_emit import BACKWARD
from .dist_groups import PhantoraProcessGroup
from .errors import note_once
from .values import VALUES


# ---- DistributedDataParallel's start-up helpers (C++ that reads tensor data) ------------------------------------

def _ddp_logger_class() -> Any:
    """DDP's C++ `dist.Logger` with the runtime-statistics call made a no-op: it needs a CUDA timer that the CPU
    build of torch lacks (the statistics it would log are not simulated)."""

    class PhantoraDDPLogger(dist.Logger):
        def set_runtime_stats_and_log(self) -> None:
            return None

    return PhantoraDDPLogger


def patch_ddp_module(module) -> None:
    """torch.nn.parallel.distributed imported the helpers by name."""
    module._verify_param_shape_across_processes = verify_param_shapes
    module.dist = _DistProxy(module.dist)
    # After the first iteration the Reducer re-orders its buckets by the order gradients arrived, agreeing on it
    # with a broadcast it reads back in C++ (from a tensor that holds no data here), and from then on reduces them
    # in buckets of bucket_cap_mb (the first of 1 MiB) while the backward pass runs. Here the rebuild is skipped
    # and the buckets are made at construction with those limits, in the reverse order of the parameters, the
    # order their gradients are produced in (DistributedDataParallel's own approximation before its first
    # iteration, where today's torch puts every parameter in one bucket until the rebuild).
    # The rebuild first checks that the previous backward pass reduced every bucket (a parameter that got no
    # gradient leaves its bucket unreduced): `_check_reducer_finalized` runs that check alone, raising as on a GPU.
    try:
        dist.Reducer._rebuild_buckets = _no_rebuild
    except (AttributeError, TypeError):
        pass
    try:
        dist.Reducer.prepare_for_backward = _prepare_for_backward
    except (AttributeError, TypeError):
        pass
    # static_graph=True: the Reducer's first backward pass delays every all-reduce to its end and all-reduces its map
    # of used parameters, copied through pinned host memory and compared by data pointer in C++ (tensors that hold
    # no data here). The Reducer is left as without it: from the first step it reduces in buckets while the backward
    # pass runs, as a static-graph run does from its second.
    try:
        dist.Reducer._set_static_graph = lambda self: _note_static_graph()
        dist.Reducer._delay_all_reduce = lambda self: None
    except (AttributeError, TypeError):
        pass
    config = getattr(module, "_BucketCapacityConfig", None) or getattr(module, "BucketCapacityConfig", None)
    original = getattr(config, "compute_bucket_size_limits", None)
    if original is not None and not getattr(original, "_phantora", False):
        def compute_bucket_size_limits(self, static_graph: bool, find_unused_parameters: bool):
            limits, rebuilding = original(self, static_graph, find_unused_parameters)
            if limits == [sys.maxsize] and not self.has_custom_per_bucket_caps:
                limits = ([self.first_bucket_bytes_cap, self.bucket_bytes_cap]
                          if self.first_bucket_bytes_cap < self.bucket_bytes_cap else [self.bucket_bytes_cap])
            return limits, rebuilding
        compute_bucket_size_limits._phantora = True        # type: ignore[attr-defined]
        config.compute_bucket_size_limits = compute_bucket_size_limits


_REAL_PREPARE = getattr(dist.Reducer, "prepare_for_backward", None)


def _no_rebuild(self) -> bool:
    self._check_reducer_finalized()
    return False


def _prepare_for_backward(self, outputs) -> None:
    """`find_unused_parameters=True` (simulated with the Reducer's own search off, see `_DistProxy`): the search as
    the Reducer runs it, in Python, over the autograd graph from the forward's outputs; each parameter it does not
    reach is marked ready now (the Reducer marks them at the first gradient of the backward pass), so that its
    bucket is reduced as on a GPU."""
    _REAL_PREPARE(self, outputs)
    params = _FIND_UNUSED.get(id(self))
    if params is None:
        return
    outputs = [outputs] if isinstance(outputs, torch.Tensor) else list(outputs)
    seen, stack, reached = set(), [t.grad_fn for t in outputs if isinstance(t, torch.Tensor) and t.grad_fn], set()
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        var = getattr(fn, "variable", None)
        if var is not None:
            reached.add(id(var))
        stack.extend(nxt for nxt, _ in fn.next_functions)
    unused = [index for index, p in enumerate(params) if id(p) not in reached]
    for index in unused:
        self._autograd_hook(index)
    if unused:
        before = {index: params[index].grad for index in unused}
        BACKWARD.after[("ddp-unused", id(self))] = functools.partial(
            _keep_globally_unused, _FIND_UNUSED_GROUP.get(id(self)), params, unused, before)


@unmetered
def _keep_globally_unused(group, params: list, unused: list[int], before: dict) -> None:
    """After the backward pass: the Reducer with `find_unused_parameters=True` all-reduces its map of used
    parameters and leaves the gradient of a parameter no rank used as it was (None stays None), where the Reducer
    simulated without the search wrote its bucket's zeros into it. The map is all-reduced here as the Reducer does
    (int32, one element per parameter) and read on the host; where its values are not known (more parameters than
    a small integer tensor carries), the parameters this rank did not use are taken as unused by every rank."""
    unused_here = set(unused)
    flags = [0 if index in unused_here else 1 for index in range(len(params))]
    used = torch.tensor(flags, dtype=torch.int32, device=params[0].device)
    dist.all_reduce(used, group=group)
    known = VALUES.get(used) is not None
    counts = used.tolist() if known else flags
    for index in unused:
        if counts[index] == 0:
            params[index].grad = before[index]


_FIND_UNUSED: dict[int, list] = {}
"""Reducers made with `find_unused_parameters=True` (by id) -> their parameters, in the Reducer's order."""

_FIND_UNUSED_GROUP: dict[int, Any] = {}
"""The same Reducers (by id) -> their process group."""

GROUP_ARG = 3
"""Position of the process group among dist.Reducer's arguments."""


FIND_UNUSED_ARG = 6
"""Position of `find_unused_parameters` among dist.Reducer's arguments."""


class _DistProxy:
    """`torch.distributed` as DDP's module sees it, with `Logger` replaced and the Reducer made without the search
    for unused parameters: after each backward pass it copies its map of used parameters through pinned host
    memory and reads it in C++ (tensors that hold no data here). `find_unused_parameters=True` is simulated as
    False, with the search made in Python (`_prepare_for_backward`) and the map's all-reduce after the backward pass
    (`_keep_globally_unused`; docs/stubs.md)."""

    def __init__(self, real: Any):
        self._real = real
        self.Logger = _ddp_logger_class()

    def Reducer(self, *args: Any, **kwargs: Any) -> Any:          # noqa: N802 - torch's name
        args = list(args)
        find_unused = False
        if len(args) > FIND_UNUSED_ARG and args[FIND_UNUSED_ARG] is True:
            args[FIND_UNUSED_ARG] = False
            find_unused = True
        elif kwargs.get("find_unused_parameters") is True:
            kwargs["find_unused_parameters"] = False
            find_unused = True
        reducer = self._real.Reducer(*args, **kwargs)
        if find_unused:
            _note_find_unused()
            params = args[0] if args else kwargs.get("params")
            _FIND_UNUSED[id(reducer)] = list(params)
            _FIND_UNUSED_GROUP[id(reducer)] = args[GROUP_ARG] if len(args) > GROUP_ARG else kwargs.get("process_group")
            weakref.finalize(reducer, _FIND_UNUSED.pop, id(reducer), None)
            weakref.finalize(reducer, _FIND_UNUSED_GROUP.pop, id(reducer), None)
        return reducer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def _note_static_graph() -> None:
    note_once("static_graph", "DistributedDataParallel(static_graph=True): its first step reduces gradients while the "
              "backward pass runs, as its later steps do, instead of after it (docs/stubs.md)")


def _note_find_unused() -> None:
    note_once("find_unused", "DistributedDataParallel(find_unused_parameters=True): the parameters the forward pass "
              "did not use are found in Python and their buckets reduced (docs/stubs.md)")


def verify_param_shapes(process_group, tensors, logger=None):
    """DDP's check that every rank has the same parameter shapes (an all-gather of the shapes in C++): SPMD ranks
    agree by construction; costs one small all-gather."""
    pg = process_group if process_group is not None else dist.distributed_c10d._get_default_group()
    if isinstance(pg, PhantoraProcessGroup):
        pg._collective("all_gather", 8 * (1 + sum(t.dim() for t in tensors))).wait()


def broadcast_coalesced(process_group, tensors, buffer_size, src=0):
    """`dist._broadcast_coalesced`: the tensors broadcast from `src` in buckets of at most `buffer_size` bytes."""
    pg = process_group if process_group is not None else dist.distributed_c10d._get_default_group()
    if not isinstance(pg, PhantoraProcessGroup):
        return
    bucket, size = [], 0
    for t in list(tensors) + [None]:
        nbytes = 0 if t is None else t.numel() * t.element_size()
        if bucket and (t is None or size + nbytes > buffer_size):
            pg._collective("broadcast", size, root=int(src)).wait()
            bucket, size = [], 0
        if t is not None:
            bucket.append(t)
            size += nbytes
