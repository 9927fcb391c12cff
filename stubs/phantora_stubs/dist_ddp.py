"""DistributedDataParallel's start-up helpers, which are C++ that reads tensor data: the parameter-shape check,
`dist._broadcast_coalesced`, DDP's logger and bucket rebuilding."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from .dist_groups import PhantoraProcessGroup


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
    # after the first iteration the Reducer re-orders its buckets by the order gradients arrived, agreeing on it
    # with a broadcast read back in C++; the simulated ranks keep the construction order (same bucket sizes)
    try:
        dist.Reducer._rebuild_buckets = lambda self: False
    except (AttributeError, TypeError):
        pass


class _DistProxy:
    """`torch.distributed` as DDP's module sees it, with `Logger` replaced."""

    def __init__(self, real: Any):
        self._real = real
        self.Logger = _ddp_logger_class()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


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
