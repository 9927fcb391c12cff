"""The object collectives (broadcast_object_list, all_gather_object, gather_object, scatter_object_list) and
object point-to-point (send_object_list, recv_object_list) on a simulated process group: the costs of sizes and
payload as torch sends them, the objects themselves through the runtime (exchange.py).
"""

from __future__ import annotations

import io
import pickle
from typing import Any

import torch
import torch.distributed as dist
from phantora.engine.ops import Op, OpKind

from . import comm, context, exchange
from .clock import METER
from .dist_groups import PhantoraProcessGroup
from .values import VALUES, simulated


# ---- object collectives ---------------------------------------------------------------------------------------------

class _Pickler(pickle.Pickler):
    """Pickles an object as torch's object collectives do, with each simulated tensor in it (a fake tensor: no data)
    as its shape, dtype, device and known value (values.py): the receiving rank rebuilds a tensor of its own with
    them. `tensor_bytes` counts the bytes the tensors' data would add to a real pickle."""

    def __init__(self, f: io.BytesIO) -> None:
        super().__init__(f, protocol=pickle.HIGHEST_PROTOCOL)
        self.tensor_bytes = 0

    def reducer_override(self, obj: Any) -> Any:
        if not simulated(obj):
            return NotImplemented
        self.tensor_bytes += obj.numel() * obj.element_size()
        return _rebuild_tensor, (tuple(obj.shape), str(obj.dtype).removeprefix("torch."), str(obj.device),
                                 bool(obj.requires_grad), VALUES.as_list(obj), isinstance(obj, torch.nn.Parameter))


def _rebuild_tensor(shape: tuple, dtype: str, device: str, requires_grad: bool, known: Any,
                    parameter: bool) -> torch.Tensor:
    """A received tensor: new memory on `device` of the rank that unpickles it, with the sender's value if known."""
    dt = getattr(torch, dtype)
    t = torch.empty(shape, dtype=dt, device=device)
    if known is not None:
        VALUES.set_from_list(t, known)
    if parameter:
        return torch.nn.Parameter(t, requires_grad=requires_grad)
    return t.requires_grad_(requires_grad) if requires_grad and (dt.is_floating_point or dt.is_complex) else t


def _dumps(obj: Any) -> tuple[bytes, int]:
    """(the pickle the runtime carries, the size a real pickle of `obj` would have)."""
    f = io.BytesIO()
    p = _Pickler(f)
    p.dump(obj)
    data = f.getvalue()
    return data, len(data) + p.tensor_bytes


def _portable(objs: list) -> tuple[list, int]:
    """Each object as bytes to exchange (None where it cannot be pickled, as torch would fail there too: its
    stand-in is then the object itself), and the largest real size."""
    out, largest = [], 8
    for o in objs:
        try:
            data, size = _dumps(o)
        except Exception:  # noqa: BLE001 - unpicklable: sent as is (the runtime's pickler decides)
            out.append(_Raw(o))
            size = 64
        else:
            out.append(data)
        largest = max(largest, size)
    return out, largest


class _Raw:
    __slots__ = ("obj",)

    def __init__(self, obj: Any) -> None:
        self.obj = obj


def _restore(objs: list) -> list:
    """The objects from what `_portable` made of them (on the receiving rank)."""
    return [o.obj if isinstance(o, _Raw) else pickle.loads(o) if isinstance(o, bytes) else o for o in objs]


def _pickled_size(obj: Any) -> int:
    try:
        return _dumps(obj)[1]
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
        data, _ = _portable(list(object_list))
        objs = _restore(exchange.objects_broadcast(gid, data, root, event))
        return objs, sum(_pickled_size(o) for o in objs)

    objs = _object_collective(group, "broadcast", 8 * len(object_list), root, swap)
    if objs is not None and _group_rank(group) != root:
        object_list[:] = objs


def all_gather_object(object_list, obj, group=None):
    """object_list[i] receives group rank i's object (padded to the largest, as torch sends it)."""
    def swap(gid, event):
        (data,), _ = _portable([obj])
        objs = _restore(exchange.objects_gather(gid, data, event))
        return objs, max(_pickled_size(o) for o in objs)

    objs = _object_collective(group, "all_gather", 8, -1, swap)
    if objs is not None:
        for i in range(min(len(object_list), len(objs))):
            object_list[i] = objs[i]


def gather_object(obj, object_gather_list=None, dst=None, group=None, group_dst=None):
    root = _group_root(group, dst, group_dst)

    def swap(gid, event):
        (data,), _ = _portable([obj])
        objs = _restore(exchange.objects_gather(gid, data, event))
        return objs, max(_pickled_size(o) for o in objs)

    objs = _object_collective(group, "all_gather", 8, root, swap)
    if objs is not None and _group_rank(group) == root and object_gather_list is not None:
        for i in range(min(len(object_gather_list), len(objs))):
            object_gather_list[i] = objs[i]


def scatter_object_list(scatter_object_output_list, scatter_object_input_list=None, src=None, group=None,
                        group_src=None):
    root = _group_root(group, src, group_src)

    def swap(gid, event):
        data, _ = _portable(list(scatter_object_input_list or []))
        objs = _restore(exchange.objects_broadcast(gid, data, root, event))
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
            ctx.runtime.put_object(key, _portable(list(object_list))[0])
            ctx.runtime.wait(sync)
        else:
            found, objs = ctx.runtime.take_object(key, sync)
            if found and objs is not None:
                objs = _restore(objs)
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
