"""The torch.distributed backend of a simulated rank: collectives become ops, nothing travels.

`install(ctx)` registers `PhantoraProcessGroup` (a Python `dist.ProcessGroup` subclass) under the backend name
"phantora", and makes the names "nccl" and "gloo" (and so the default backend of every device) create it too, by
standing in for `ProcessGroupNCCL` / `ProcessGroupGloo` inside `torch.distributed.distributed_c10d`. `get_backend()`
still answers the name the program asked for.

Initialisation needs no other rank: `init_process_group` gets an in-process `HashStore` when no store is given (any
`init_method`, `MASTER_ADDR`/`MASTER_PORT` are ignored), rank and world size default to `PHANTORA_RANK` /
`PHANTORA_WORLD_SIZE`, `device_id` is accepted but not bound, and no store-based barrier runs.

Group ids (`Op.group`, `Runtime.register_group`): the world group is 0, every later group the next integer in
creation order. Every rank of the job creates the same groups in the same order (new_group and split_group must be
called by all ranks), so ids agree without communication. A group made with `new_group(...,
use_local_synchronization=True)` (only its members call it) gets `LOCAL_GROUP_BIT | hash(ranks, occurrence)`.

Every collective (all_reduce, all_gather incl. the single-tensor and coalesced forms, reduce_scatter likewise,
broadcast, reduce, all_to_all, barrier) becomes `OpKind.COLLECTIVE` on the group's communication stream; send/recv
become `OpKind.SEND` / `OpKind.RECV` (peer = group rank), and `batch_isend_irecv` is bracketed by GROUP_START /
GROUP_END (an NCCL group: its transfers run when it ends, and its one work completes after them; comm.py);
gather / scatter are point-to-point batches as NCCL does them. `Work.wait()` makes the current stream wait for the
collective; barrier's wait also blocks the host. Real values travel where they exist (exchange.py): small
tensors with known values through all_reduce, broadcast and all_gather, and the objects of the object collectives.
"""

from __future__ import annotations

import hashlib
import inspect
from datetime import timedelta
import pickle
import threading
from typing import Any

import torch
import torch.distributed as dist
from phantora.engine.ops import Op, OpKind

from . import comm, context, exchange
from .clock import METER
from .errors import UnsupportedOpError, user_location
from .values import VALUES

LOCAL_GROUP_BIT = 1 << 40
_PENDING = threading.local()      # (gid, global ranks, name) of the group being created


def _nbytes(tensors: Any) -> int:
    total = 0
    for t in _flat(tensors):
        total += t.numel() * t.element_size()
    return total


def _flat(tensors: Any) -> list[torch.Tensor]:
    if isinstance(tensors, torch.Tensor):
        return [tensors]
    out: list[torch.Tensor] = []
    for x in tensors or ():
        out.extend(_flat(x))
    return out


def _forget(tensors: Any) -> None:
    for t in _flat(tensors):
        VALUES.drop(t)


class PhantoraWork(dist._Work):
    """The handle of a simulated collective: wait() orders the current stream after it."""

    def __init__(self, event: int | None, result: Any = None, blocking: bool = False, source_rank: int = -1):
        super().__init__()
        self._event = event
        self._result = result if result is not None else []
        self._blocking = blocking
        self._waited = False
        self._source_rank = source_rank

    def wait(self, timeout: Any = None) -> bool:
        if self._waited:
            return True
        self._waited = True
        ctx = context.get()
        METER.enter()
        try:
            if self._event is not None:
                comm.join(ctx, self._event)
            if self._blocking:
                ctx.runtime.wait(Op(OpKind.SYNC_STREAM, stream=ctx.dev.stream(), cpu_delta=METER.claim()))
        finally:
            METER.exit()
        return True

    def synchronize(self) -> None:
        self.wait()

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def exception(self) -> Any:
        return None

    def source_rank(self) -> int:
        return self._source_rank

    def result(self) -> Any:
        return self._result

    def get_future(self) -> torch.futures.Future:
        self.wait()
        fut: torch.futures.Future = torch.futures.Future()
        fut.set_result(self._result)
        return fut

    def _get_duration(self) -> float:
        return 0.0


class PhantoraProcessGroup(dist.ProcessGroup):
    """A process group whose collectives are simulated (see the module docstring)."""

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

    # -- emission helpers -----------------------------------------------------------------------------------------
    def _collective(self, name: str, nbytes: int, root: int = -1, result: Any = None,
                    blocking: bool = False) -> PhantoraWork:
        ctx = context.get()
        METER.enter()
        try:
            event = comm.launch(ctx, OpKind.COLLECTIVE, name, self._info, nbytes, root)
        finally:
            METER.exit()
        return PhantoraWork(event, result, blocking)

    def _p2p(self, kind: OpKind, tensors: Any, peer: int) -> PhantoraWork:
        ctx = context.get()
        METER.enter()
        try:
            event = comm.launch(ctx, kind, "send" if kind == OpKind.SEND else "recv", self._info,
                                _nbytes(tensors), int(peer))
        finally:
            METER.exit()
        return PhantoraWork(event, list(_flat(tensors)), source_rank=int(peer))

    def _group_marker(self, kind: OpKind) -> None:
        METER.enter()
        try:
            comm.group_marker(context.get(), kind)
        finally:
            METER.exit()

    # -- collectives ---------------------------------------------------------------------------------------------------
    def allreduce(self, tensors, opts=None):
        work = self._collective("all_reduce", _nbytes(tensors), result=list(_flat(tensors)))
        exchange.all_reduce(self._info.gid, list(_flat(tensors)), opts, work._event)
        return work

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts)

    def allgather(self, output_tensors, input_tensors, opts=None):
        _forget(output_tensors)
        work = self._collective("all_gather", _nbytes(input_tensors), result=output_tensors)
        if len(input_tensors) == 1 and len(output_tensors) == 1:
            exchange.all_gather(self._info.gid, list(output_tensors[0]), list(input_tensors), work._event)
        return work

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        return self.allgather(output_lists, input_list, opts)

    def all_gather_single(self, output, input, opts=None):
        _forget(output)
        work = self._collective("all_gather", _nbytes(input), result=[output])
        exchange.all_gather_into(self._info.gid, output, input, work._event)
        return work

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        work = None
        for o, i in zip(outputs, inputs):
            work = self.all_gather_single(o, i, opts)
        return work if work is not None else PhantoraWork(None)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def reduce_scatter(self, output_tensors, input_lists, opts=None):
        _forget(output_tensors)
        return self._collective("reduce_scatter", _nbytes(input_lists), result=list(_flat(output_tensors)))

    def reduce_scatter_single(self, output, input, opts=None):
        _forget(output)
        return self._collective("reduce_scatter", _nbytes(input), result=[output])

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        work = None
        for o, i in zip(outputs, inputs):
            work = self.reduce_scatter_single(o, i, opts)
        return work if work is not None else PhantoraWork(None)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def broadcast(self, tensors, opts=None):
        root = int(getattr(opts, "rootRank", 0)) if opts is not None else 0
        work = self._collective("broadcast", _nbytes(tensors), root=root, result=list(_flat(tensors)))
        exchange.broadcast(self._info.gid, list(_flat(tensors)), root, self._rank, work._event)
        return work

    def reduce(self, tensors, opts=None):
        root = int(getattr(opts, "rootRank", 0)) if opts is not None else 0
        return self._collective("reduce", _nbytes(tensors), root=root, result=list(_flat(tensors)))

    def alltoall(self, output_tensors, input_tensors, opts=None):
        _forget(output_tensors)
        return self._collective("all_to_all", _nbytes(input_tensors), result=output_tensors)

    def all_to_all_single(self, output, input, output_split_sizes=None, input_split_sizes=None, opts=None):
        _forget(output)
        return self._collective("all_to_all", _nbytes(input), result=[output])

    alltoall_base = all_to_all_single

    def barrier(self, opts=None):
        return self._collective("barrier", 0, blocking=True)

    def monitored_barrier(self, timeout=None, wait_all_ranks=False):
        self.barrier().wait()

    def gather(self, output_lists, input_tensors, opts=None):
        root = int(getattr(opts, "rootRank", 0)) if opts is not None else 0
        self._group_marker(OpKind.GROUP_START)
        work = None
        if self._rank == root:
            _forget(output_lists)
            for peer in range(self._size):
                if peer != root:
                    work = self._p2p(OpKind.RECV, input_tensors, peer)
        else:
            work = self._p2p(OpKind.SEND, input_tensors, root)
        self._group_marker(OpKind.GROUP_END)
        return work if work is not None else PhantoraWork(None)

    def scatter(self, output_tensors, input_lists, opts=None):
        root = int(getattr(opts, "rootRank", 0)) if opts is not None else 0
        self._group_marker(OpKind.GROUP_START)
        work = None
        if self._rank == root:
            for peer in range(self._size):
                if peer != root:
                    work = self._p2p(OpKind.SEND, output_tensors, peer)
        else:
            _forget(output_tensors)
            work = self._p2p(OpKind.RECV, output_tensors, root)
        self._group_marker(OpKind.GROUP_END)
        return work if work is not None else PhantoraWork(None)

    def send(self, tensors, dst, tag=0):
        return self._p2p(OpKind.SEND, tensors, dst)

    def recv(self, tensors, src, tag=0):
        _forget(tensors)
        return self._p2p(OpKind.RECV, tensors, src)

    def recv_anysource(self, tensors, tag=0):
        _forget(tensors)
        return self._p2p(OpKind.RECV, tensors, -1)

    # -- coalescing (ncclGroupStart / ncclGroupEnd) ------------------------------------------------------------------
    def _start_coalescing(self, device=None):
        self._group_marker(OpKind.GROUP_START)

    def _end_coalescing(self, device=None):
        self._group_marker(OpKind.GROUP_END)
        return PhantoraWork(None)

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


class PhantoraNCCLGroup(PhantoraProcessGroup):
    """What `init_process_group("nccl")` / `new_group(backend="nccl")` create."""

    backend_label = "nccl"
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


# ---- group creation hooks ------------------------------------------------------------------------------------------

_LOCAL_SYNC = threading.local()
_LOCAL_OCCURRENCE: dict[tuple[int, ...], int] = {}


def _local_gid(ranks: list[int]) -> int:
    key = tuple(ranks)
    k = _LOCAL_OCCURRENCE.get(key, 0)
    _LOCAL_OCCURRENCE[key] = k + 1
    digest = hashlib.blake2b(f"{list(key)}#{k}".encode(), digest_size=5).digest()
    return LOCAL_GROUP_BIT | int.from_bytes(digest, "little")


def _wrap_new_process_group_helper(c10d) -> None:
    original = c10d._new_process_group_helper
    if getattr(original, "__phantora__", False):
        return
    sig = inspect.signature(original)

    def _new_process_group_helper(*args, **kwargs):
        ctx = context.get()
        bound = sig.bind_partial(*args, **kwargs)
        ranks = list(bound.arguments.get("global_ranks_in_group") or [])
        name = str(bound.arguments.get("group_name") or "")
        if not ranks:        # the default group
            ranks = list(range(int(bound.arguments.get("group_size") or ctx.config.world_size)))
        if getattr(_LOCAL_SYNC, "on", False):
            gid = _local_gid(ranks)
        else:
            gid = ctx.groups.next_gid()
        prev = getattr(_PENDING, "value", None)
        _PENDING.value = (gid, ranks, name)
        try:
            return original(*args, **kwargs)
        finally:
            _PENDING.value = prev

    _new_process_group_helper.__phantora__ = True    # type: ignore[attr-defined]
    c10d._new_process_group_helper = _new_process_group_helper


def _wrap_new_group(c10d) -> None:
    original = c10d._new_group_with_tag
    if getattr(original, "__phantora__", False):
        return
    sig = inspect.signature(original)

    def _new_group_with_tag(*args, **kwargs):
        bound = sig.bind_partial(*args, **kwargs)
        prev = getattr(_LOCAL_SYNC, "on", False)
        _LOCAL_SYNC.on = bool(bound.arguments.get("use_local_synchronization", False))
        try:
            return original(*args, **kwargs)
        finally:
            _LOCAL_SYNC.on = prev

    _new_group_with_tag.__phantora__ = True   # type: ignore[attr-defined]
    c10d._new_group_with_tag = _new_group_with_tag


def _split(parent, split_ranks, timeout=None, group_desc=None, pg_options=None):
    """split_group as new_group calls: one per split, on every rank of the parent, in order."""
    c10d = dist.distributed_c10d
    if not split_ranks:
        raise ValueError("split_ranks cannot be None or empty")
    parent_global = c10d.get_process_group_ranks(parent)
    me = c10d.get_rank()
    mine = None
    for split in split_ranks:
        members = [parent_global[r] for r in sorted(split)]
        g = c10d.new_group(ranks=members, timeout=timeout, group_desc=group_desc)
        if me in members:
            mine = g
    return mine


def split_group(parent_pg=None, split_ranks=None, timeout=None, pg_options=None, group_desc=None, backend=None):
    """torch.distributed.split_group for the phantora backend (no communicator splitting to do)."""
    parent = parent_pg if parent_pg is not None else dist.distributed_c10d._get_default_group()
    return _split(parent, split_ranks, timeout=timeout, group_desc=group_desc)


def _wrap_init(c10d) -> None:
    original = c10d.init_process_group
    if getattr(original, "__phantora__", False):
        return

    def init_process_group(backend=None, init_method=None, timeout=None, world_size=-1, rank=-1, store=None,
                           group_name="", pg_options=None, device_id=None, **kwargs):
        import os
        cfg = context.get().config
        if world_size in (-1, None):
            world_size = cfg.world_size
        if rank in (-1, None):
            rank = cfg.rank
        if world_size != cfg.world_size or rank != cfg.rank:
            raise UnsupportedOpError(
                f"init_process_group(rank={rank}, world_size={world_size}) at {user_location(2)} disagrees with the "
                f"simulated job (PHANTORA_RANK={cfg.rank}, PHANTORA_WORLD_SIZE={cfg.world_size})")
        if store is None:
            store = dist.HashStore()
        os.environ["TORCH_DIST_INIT_BARRIER"] = "0"
        return original(backend=backend, timeout=timeout, world_size=world_size, rank=rank, store=store,
                        group_name=group_name, pg_options=pg_options, **kwargs)

    init_process_group.__phantora__ = True   # type: ignore[attr-defined]
    init_process_group.__doc__ = original.__doc__
    c10d.init_process_group = init_process_group
    dist.init_process_group = init_process_group


# ---- batch_isend_irecv --------------------------------------------------------------------------------------------

def _wrap_batch_isend_irecv(c10d) -> None:
    original = c10d.batch_isend_irecv
    if getattr(original, "__phantora__", False):
        return

    def batch_isend_irecv(p2p_op_list):
        """One NCCL group (GROUP_START, the sends and receives, GROUP_END); as ProcessGroupNCCL's coalesced path
        does, an NCCL group returns a single work for the whole batch (a gloo group one work per op)."""
        ctx = context.get()
        METER.enter()
        try:
            comm.group_marker(ctx, OpKind.GROUP_START)
        finally:
            METER.exit()
        try:
            works = original(p2p_op_list)
        finally:
            METER.enter()
            try:
                comm.group_marker(ctx, OpKind.GROUP_END)
            finally:
                METER.exit()
        group = p2p_op_list[0].group if p2p_op_list else None
        if group is None and p2p_op_list:
            group = c10d._get_default_group()
        if works and isinstance(group, PhantoraProcessGroup) and group.backend_label != "gloo":
            return [works[-1]]
        return works

    batch_isend_irecv.__phantora__ = True   # type: ignore[attr-defined]
    batch_isend_irecv.__doc__ = original.__doc__
    c10d.batch_isend_irecv = batch_isend_irecv
    dist.batch_isend_irecv = batch_isend_irecv


# ---- object collectives ---------------------------------------------------------------------------------------------

def _pickled_size(obj: Any) -> int:
    try:
        return len(pickle.dumps(obj))
    except Exception:  # noqa: BLE001 - unpicklable objects still cost something
        return 64


def _object_collective(group: Any, name: str, sizes_bytes: int, root: int, swap: Any) -> Any:
    """Sizes, then the objects' values (exchanged through the runtime), then the payload, blocking the host as
    torch's object collectives do. `swap(gid, event)` exchanges the values once the sizes' collective (`event`) has
    completed and returns (result, payload bytes)."""
    c10d = dist.distributed_c10d
    pg = group if group is not None else c10d._get_default_group()
    if not isinstance(pg, PhantoraProcessGroup):
        return None
    ctx = context.get()
    METER.enter()
    try:
        e = comm.launch(ctx, OpKind.COLLECTIVE, name, pg.info, sizes_bytes, root)
        comm.join(ctx, e)
        result, data_bytes = swap(pg.info.gid, e)
        e = comm.launch(ctx, OpKind.COLLECTIVE, name, pg.info, data_bytes, root)
        comm.join(ctx, e)
        ctx.runtime.wait(Op(OpKind.SYNC_STREAM, stream=ctx.dev.stream(), cpu_delta=METER.claim()))
    finally:
        METER.exit()
    return result


def _group_rank(group: Any) -> int:
    c10d = dist.distributed_c10d
    pg = group if group is not None else c10d._get_default_group()
    return pg.rank()


def _group_root(group: Any, src: Any, group_src: Any) -> int:
    c10d = dist.distributed_c10d
    if group_src is not None:
        return int(group_src)
    if src is None:
        return 0
    pg = group if group is not None else c10d._get_default_group()
    try:
        return c10d.get_group_rank(pg, src)
    except Exception:  # noqa: BLE001
        return int(src)


def broadcast_object_list(object_list, src=None, group=None, device=None, group_src=None):
    """Every rank's list receives the root's objects."""
    root = _group_root(group, src, group_src)

    def swap(gid, event):
        objs = exchange.objects_broadcast(gid, list(object_list), root, event)
        return objs, sum(_pickled_size(o) for o in objs)

    objs = _object_collective(group, "broadcast", 8 * len(object_list), root, swap)
    if objs is not None and _group_rank(group) != root:
        object_list[:] = objs


def all_gather_object(object_list, obj, group=None):
    """object_list[i] receives group rank i's object (padded to the largest, as torch sends it)."""
    def swap(gid, event):
        objs = exchange.objects_gather(gid, obj, event)
        return objs, max(_pickled_size(o) for o in objs)

    objs = _object_collective(group, "all_gather", 8, -1, swap)
    if objs is not None:
        for i in range(min(len(object_list), len(objs))):
            object_list[i] = objs[i]


def gather_object(obj, object_gather_list=None, dst=None, group=None, group_dst=None):
    root = _group_root(group, dst, group_dst)

    def swap(gid, event):
        objs = exchange.objects_gather(gid, obj, event)
        return objs, max(_pickled_size(o) for o in objs)

    objs = _object_collective(group, "all_gather", 8, root, swap)
    if objs is not None and _group_rank(group) == root and object_gather_list is not None:
        for i in range(min(len(object_gather_list), len(objs))):
            object_gather_list[i] = objs[i]


def scatter_object_list(scatter_object_output_list, scatter_object_input_list=None, src=None, group=None,
                        group_src=None):
    root = _group_root(group, src, group_src)

    def swap(gid, event):
        objs = exchange.objects_broadcast(gid, list(scatter_object_input_list or []), root, event)
        return objs, max([_pickled_size(o) for o in objs] or [8])

    objs = _object_collective(group, "broadcast", 8, root, swap)
    me = _group_rank(group)
    if objs is not None and me < len(objs):
        scatter_object_output_list[0] = objs[me]


_OBJECT_P2P_COUNT: dict[tuple[int, int, int], int] = {}


def _object_p2p(kind: OpKind, object_list: list, peer: int, group: Any) -> None:
    """A point-to-point object message: sizes and payload as two transfers (costed with the sender's pickled size,
    which the receiver learns from the engine), the objects themselves through the runtime."""
    c10d = dist.distributed_c10d
    pg = group if group is not None else c10d._get_default_group()
    if not isinstance(pg, PhantoraProcessGroup):
        return
    ctx = context.get()
    info = pg.info
    me = info.ranks[pg.rank()]
    other = info.ranks[peer]
    src, dst = (me, other) if kind == OpKind.SEND else (other, me)
    n = _OBJECT_P2P_COUNT.get((info.gid, src, dst), 0)
    _OBJECT_P2P_COUNT[(info.gid, src, dst)] = n + 1
    key = (info.gid, src, dst, n)
    name = "send" if kind == OpKind.SEND else "recv"
    METER.enter()
    try:
        e = comm.launch(ctx, kind, name, info, 8 * len(object_list), peer)
        comm.join(ctx, e)
        sync = Op(OpKind.SYNC_STREAM, stream=ctx.dev.stream(), cpu_delta=METER.claim())
        if kind == OpKind.SEND:
            ctx.runtime.put_object(key, list(object_list))
            ctx.runtime.wait(sync)
        else:
            found, objs = ctx.runtime.take_object(key, sync)
            if found and objs is not None:
                object_list[:len(objs)] = objs
    finally:
        METER.exit()


def send_object_list(object_list, dst=None, group=None, device=None, group_dst=None, **kwargs):
    _object_p2p(OpKind.SEND, object_list, _group_root(group, dst, group_dst), group)


def recv_object_list(object_list, src=None, group=None, device=None, group_src=None, **kwargs):
    _object_p2p(OpKind.RECV, object_list, _group_root(group, src, group_src), group)
    return -1 if src is None else src


_OBJECT_COLLECTIVES = {f.__name__: f for f in (broadcast_object_list, all_gather_object, gather_object,
                                                scatter_object_list, send_object_list, recv_object_list)}


# ---- installation ---------------------------------------------------------------------------------------------------

def install(ctx) -> None:
    """Register the backend and patch torch.distributed (idempotent)."""
    if not dist.is_available() or ctx.extras.get("distributed_installed"):
        return
    c10d = dist.distributed_c10d
    if "phantora" not in dist.Backend.backend_list:
        dist.Backend.register_backend("phantora", _create_phantora_pg, devices=["cpu", "cuda"])
    c10d.ProcessGroupNCCL = PhantoraNCCLGroup
    dist.ProcessGroupNCCL = PhantoraNCCLGroup
    c10d.ProcessGroupGloo = PhantoraGlooGroup
    dist.ProcessGroupGloo = PhantoraGlooGroup
    if not isinstance(getattr(c10d, "default_pg_nccl_timeout", None), timedelta):
        c10d.default_pg_nccl_timeout = timedelta(minutes=10)       # ProcessGroupNCCL's default on CUDA builds
    c10d._NCCL_AVAILABLE = True
    c10d._GLOO_AVAILABLE = True

    def is_nccl_available() -> bool:
        return True

    def is_gloo_available() -> bool:
        return True

    c10d.is_nccl_available = is_nccl_available
    dist.is_nccl_available = is_nccl_available
    c10d.is_gloo_available = is_gloo_available
    dist.is_gloo_available = is_gloo_available
    dist.Backend.default_device_backend_map["cuda"] = "nccl"
    _wrap_init(c10d)
    _wrap_new_process_group_helper(c10d)
    _wrap_new_group(c10d)
    _wrap_batch_isend_irecv(c10d)
    c10d.split_group = split_group
    dist.split_group = split_group
    for name, fn in _OBJECT_COLLECTIVES.items():
        setattr(c10d, name, fn)
        setattr(dist, name, fn)
    dist._broadcast_coalesced = broadcast_coalesced
    import torch.distributed.utils as dist_utils
    dist_utils._verify_param_shape_across_processes = verify_param_shapes
    ctx.extras["distributed_installed"] = True


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
