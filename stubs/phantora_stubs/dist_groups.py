"""The process-group classes of the phantora backend: `PhantoraProcessGroup` (a Python `dist.ProcessGroup`
subclass, registered as "phantora") and the classes that stand in for `ProcessGroupNCCL` / `ProcessGroupGloo`, with
their options; each takes its group id, ranks and name from the group being created (dist_group_creation.py).

Its collectives and point-to-point calls come from dist_collectives.py and dist_p2p.py.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from . import comm, context
from .dist_collectives import CollectivesMixin
from .dist_emit import uncounted_methods
from .dist_group_creation import _PENDING, _split
from .dist_p2p import PointToPointMixin


@uncounted_methods
class PhantoraProcessGroup(CollectivesMixin, PointToPointMixin, dist.ProcessGroup):
    """A process group whose collectives are simulated (dist_collectives.py, dist_p2p.py)."""

    backend_label = "phantora"

    def __init__(self, rank: int, size: int, info: comm.GroupInfo):
        super().__init__(rank, size)
        self._rank = rank
        self._size = size
        self._info = info
        self._group_name = info.name
        self._group_desc = ""

    # -- identity ---------------------------------------------------------------------------------------------------
    @property
    def info(self) -> comm.GroupInfo:
        return self._info

    def _set_group_name(self, name: str) -> None:
        self._group_name = name
        groups = context.get().groups
        groups.rename(self._info, name)

    @property
    def group_name(self) -> str:
        return self._group_name

    def _set_group_desc(self, desc: str) -> None:
        self._group_desc = desc

    @property
    def group_desc(self) -> str:
        return self._group_desc

    @property
    def _device_types(self) -> list:
        """The device types of the backends the group was made with (`init_process_group("cpu:gloo,cuda:nccl")`:
        CPU and CUDA; "nccl": CUDA), as a real group lists its registered backends: `_get_pg_default_device`,
        FSDP's sharded state dicts and `dcp.async_save` read them."""
        devices = getattr(self, "_phantora_devices", None) or self.default_devices
        return [torch.device(d) for d in devices]

    default_devices = ("cpu", "cuda")

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size

    def getBackendName(self) -> str:
        return self.backend_label

    def name(self) -> str:
        return self.backend_label

    def _get_backend_name(self) -> str:
        return self.backend_label

    def _set_sequence_number_for_group(self) -> None:
        return None

    def _get_backend(self, device: Any = None) -> "PhantoraProcessGroup":
        """The backend serving `device`: the group itself (it is its own NCCL or gloo backend)."""
        return self

    @property
    def uid(self) -> int:
        """ProcessGroupNCCL's unique id of the communicator's group: the group id."""
        return self._info.gid

    @property
    def supports_splitting(self) -> bool:
        return True

    @property
    def supports_coalescing(self) -> bool:
        return True

    def __repr__(self) -> str:
        return f"PhantoraProcessGroup(gid={self._info.gid}, rank={self._rank}, size={self._size}, " \
               f"name={self._group_name!r})"

    # -- splitting ---------------------------------------------------------------------------------------------------
    def split_group(self, ranks, timeout=None, opts=None, group_name=None, group_desc=None, device_types=None):
        return _split(self, [list(ranks)], timeout=timeout, group_desc=group_desc)


class _NcclConfig:
    """Stands in for ProcessGroupNCCL.NCCLConfig (ncclConfig_t): every field unset (NCCL_CONFIG_UNDEF_INT), as
    torch creates it; frameworks set CTA counts and cluster sizes on it (only carried along)."""

    UNDEF = -2147483648

    def __init__(self) -> None:
        self.blocking = self.UNDEF
        self.cga_cluster_size = self.UNDEF
        self.min_ctas = self.UNDEF
        self.max_ctas = self.UNDEF
        self.split_share = self.UNDEF
        self.net_name = None


class _NcclOptions:
    """Stands in for ProcessGroupNCCL.Options (only carried along)."""

    def __init__(self, is_high_priority_stream: bool = False):
        self.is_high_priority_stream = is_high_priority_stream
        self._timeout = None
        self.split_from = None
        self.split_color = 0
        self.global_ranks_in_group: list[int] = []
        self.group_name = ""
        self.config = _NcclConfig()


@uncounted_methods
class PhantoraNCCLGroup(PhantoraProcessGroup):
    """What `init_process_group("nccl")` / `new_group(backend="nccl")` create."""

    backend_label = "nccl"
    default_devices = ("cuda",)
    Options = _NcclOptions
    NCCLConfig = _NcclConfig

    def __init__(self, store: Any, rank: int, size: int, options: Any = None):
        super().__init__(rank, size, _take_pending(rank, size))
        self.options = options if options is not None else _NcclOptions()


class _GlooOptions:
    def __init__(self) -> None:
        self.global_ranks_in_group: list[int] = []
        self.group_name = ""
        self._timeout = None


@uncounted_methods
class PhantoraGlooGroup(PhantoraProcessGroup):
    """What a "gloo" backend (explicit, or the default for CPU) creates."""

    backend_label = "gloo"

    def __init__(self, store: Any, rank: int, size: int, timeout: Any = None, **kwargs: Any):
        super().__init__(rank, size, _take_pending(rank, size))
        self.options = _GlooOptions()

    @staticmethod
    def create_device(*args: Any, **kwargs: Any) -> Any:
        return None

    @staticmethod
    def create_default_device(*args: Any, **kwargs: Any) -> Any:
        return None


def _take_pending(rank: int, size: int) -> comm.GroupInfo:
    ctx = context.get()
    pending = getattr(_PENDING, "value", None)
    if pending is None:      # created outside _new_process_group_helper (direct construction)
        gid = ctx.groups.next_gid()
        ranks, name = list(range(size)), f"phantora_direct_{gid}"
    else:
        gid, ranks, name = pending
    if len(ranks) != size:
        ranks = list(range(size))
    existing = ctx.groups.by_gid.get(gid)
    if existing is not None:
        return existing
    return ctx.groups.add(gid, ranks, name)


def _create_phantora_pg(store, group_rank, group_size, timeout):
    """Factory registered with Backend.register_backend("phantora", ...)."""
    return PhantoraProcessGroup(group_rank, group_size, _take_pending(group_rank, group_size))
