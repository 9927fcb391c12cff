"""How process groups come into being on a simulated rank: init_process_group without other ranks, and the id,
ranks and name of every group new_group / split_group create.

Initialisation needs no other rank: `init_process_group` gets an in-process `HashStore` when no store is given (any
`init_method`, `MASTER_ADDR`/`MASTER_PORT` are ignored), rank and world size default to `PHANTORA_RANK` /
`PHANTORA_WORLD_SIZE`, `device_id` is accepted but not bound, and no store-based barrier runs.

Group ids (`Op.group`, `Runtime.register_group`): the world group is 0, every later group the next integer in
creation order. Every rank of the job creates the same groups in the same order (new_group and split_group must be
called by all ranks), so ids agree without communication. A group made with `new_group(...,
use_local_synchronization=True)` (only its members call it) gets `LOCAL_GROUP_BIT | hash(ranks, occurrence)`.
"""

from __future__ import annotations

import hashlib
import inspect
import threading
from typing import Any

import torch.distributed as dist

from . import context
from .errors import UnsupportedOpError, user_location

LOCAL_GROUP_BIT = 1 << 40
_PENDING = threading.local()      # (gid, global ranks, name) of the group being created


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
            out = original(*args, **kwargs)
        finally:
            _PENDING.value = prev
        pg = out[0] if isinstance(out, tuple) else out
        backends = _backend_map(bound.arguments.get("backend"))
        if backends and hasattr(pg, "default_devices"):       # a simulated group: the devices its backends serve
            pg._phantora_devices = tuple(backends)
            pg._phantora_nccl = backends.get("cuda") == "nccl"
        return out

    _new_process_group_helper.__phantora__ = True    # type: ignore[attr-defined]
    c10d._new_process_group_helper = _new_process_group_helper


def _backend_map(backend: Any) -> dict[str, str]:
    """The backend of each device type a backend string serves ("nccl": cuda; "gloo": cpu and cuda;
    "cpu:gloo,cuda:nccl": both)."""
    if not backend:
        return {}
    try:
        return {k: str(v) for k, v in dist.BackendConfig(dist.Backend(str(backend))).get_device_backend_map().items()}
    except (ValueError, RuntimeError, TypeError):
        return {}


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
