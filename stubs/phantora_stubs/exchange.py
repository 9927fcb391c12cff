"""Real values through collectives: small tensors whose values are known (phantora_stubs.values) and Python objects.

A collective on small tensors (every tensor small enough by `values.small_enough`) whose values this rank knows
exchanges them through the runtime (`Runtime.exchange`), and the host then waits for the collective's completion, as
reading the result would make it. A member whose value is unknown asks nothing (its result is unknown anyway) and
counts as unknown for the others, whose results become unknown too (the outputs forget their values); a broadcast
receiver asks whatever it holds, since the result is the root's. A rank
simulated alone stands for every member of the group (each mirrors it), so an all-reduce SUM of x gives size × x.
Ranks mirrored in a live run (`--ranks auto`) contribute the value of the rank they mirror.

Large tensors carry model data, whose values are never known: nothing is exchanged for them. One that holds a known
constant (`torch.ones`, values.py) and is written by a collective or a receive forgets it: the value it held is
stale (until 2026-11-30 a broadcast left each receiver its own constant).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.utils import _pytree as pytree

from phantora.engine.ops import Op, OpKind

from . import context
from .clock import METER
from .values import SMALL_INT_NUMEL, SMALL_NUMEL, VALUES, small_enough


def _small(tensors: list[torch.Tensor]) -> bool:
    return bool(tensors) and all(isinstance(t, torch.Tensor) and small_enough(t) for t in tensors)


def _payload(tensors: list[torch.Tensor]) -> list | None:
    out = []
    with unset_fake_temporarily():
        for t in tensors:
            v = VALUES.get(t)
            if v is None:
                return None
            v = v.detach().cpu()
            if v.dtype in _NO_NUMPY:           # numpy has no bfloat16 or float8: carried as float32, stored back
                v = v.float()                  # in the tensor's dtype (_store)
            out.append(v.numpy().copy())
    return out


_NO_NUMPY = {torch.bfloat16, *(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
                                                           "float8_e5m2fnuz", "float8_e8m0fnu") if hasattr(torch, n))}


def _exchange(gid: int, kind: str, payload: Any, event: int | None) -> Any:
    ctx = context.get()
    METER.enter()
    try:
        sync = Op(OpKind.SYNC_EVENT, stream=ctx.dev.stream(), arg=-1 if event is None else int(event),
                  cpu_delta=METER.claim())
        return ctx.runtime.exchange(gid, kind, payload, sync)
    finally:
        METER.exit()


def _store(tensors: list[torch.Tensor], arrays: list | None) -> None:
    if arrays is None:
        for t in tensors:
            VALUES.drop(t)
        return
    with unset_fake_temporarily():
        for t, a in zip(tensors, arrays):
            VALUES.write(t, torch.as_tensor(a, device="cpu").to(t.dtype).reshape(t.shape))


_REDUCE = {"SUM": "sum", "AVG": "avg", "MAX": "max", "MIN": "min", "PRODUCT": "product"}


def reduce_kind(opts: Any) -> str | None:
    """The reduction of a c10d collective's options, or of a functional collective's `reduce_op` string."""
    if isinstance(opts, str):
        return _REDUCE.get(opts.upper())
    op = getattr(opts, "reduceOp", dist.ReduceOp.SUM) if opts is not None else dist.ReduceOp.SUM
    name = getattr(op, "name", None) or str(op).rsplit(".", 1)[-1]
    if hasattr(op, "op"):                     # a ReduceOp instance wrapping RedOpType
        name = str(op.op).rsplit(".", 1)[-1]
    return _REDUCE.get(str(name).upper())


def all_reduce(gid: int, tensors: list[torch.Tensor], opts: Any, event: int | None) -> None:
    if not _small(tensors):
        _store(tensors, None)            # too big to carry: a value they held (one constant) is stale
        return
    kind = reduce_kind(opts)
    payload = _payload(tensors) if kind else None
    if payload is None:                  # this member's value is unknown: so is the result; nothing to ask
        _store(tensors, None)
        return
    _store(tensors, _exchange(gid, kind, payload, event))


def reduce(gid: int, tensors: list[torch.Tensor], opts: Any, root: int, me: int, event: int | None) -> None:
    """The root's tensors receive the members' reduction, as all_reduce computes it; the others keep theirs (NCCL's
    reduce writes only the root's buffer)."""
    if not _small(tensors):
        if me == root:
            _store(tensors, None)
        return
    kind = reduce_kind(opts)
    payload = _payload(tensors) if kind else None
    result = _exchange(gid, kind, payload, event) if payload is not None else None
    if me == root:
        _store(tensors, result)


def reduce_scatter_into(gid: int, output: torch.Tensor, input: torch.Tensor, opts: Any, me: int, size: int,
                        event: int | None) -> bool:
    """output = chunk `me` (along dim 0) of the `size` members' reduced inputs. Whether the output's value was
    settled."""
    if not _small([input]) or not _small([output]) or input.numel() != output.numel() * size:
        return False
    kind = reduce_kind(opts)
    payload = _payload([input]) if kind else None
    result = _exchange(gid, kind, payload, event) if payload is not None else None
    if result is None:
        _store([output], None)
        return True
    n = output.numel()
    _store([output], [result[0].reshape(-1)[me * n:(me + 1) * n]])
    return True


def broadcast(gid: int, tensors: list[torch.Tensor], root: int, me: int, event: int | None) -> None:
    if not _small(tensors):
        if me != root:
            _store(tensors, None)
        return
    payload = _payload(tensors)
    if me == root and payload is None:
        return                           # the root's value is unknown: the members learn that without it
    _store(tensors, _exchange(gid, f"broadcast:{root}", payload, event))


def all_gather(gid: int, outputs: list[torch.Tensor], inputs: list[torch.Tensor], event: int | None) -> bool:
    """outputs[i] receives member i's input (list form) — one input tensor. Whether the outputs' values were
    settled (known, or forgotten as unknown); False, leaving them, for tensors too big to carry."""
    return _gather_list(gid, outputs, inputs, 0, event)


def all_to_all(gid: int, outputs: list[torch.Tensor], inputs: list[torch.Tensor], me: int,
               event: int | None) -> bool:
    """outputs[i] receives member i's inputs[me] (list form: one input and one output tensor per member). Whether
    the outputs' values were settled, as `all_gather`."""
    if len(inputs) != len(outputs):
        return False
    return _gather_list(gid, outputs, inputs, me, event)


def _gather_list(gid: int, outputs: list[torch.Tensor], inputs: list[torch.Tensor], chunk: int,
                 event: int | None) -> bool:
    """outputs[i] receives member i's inputs[chunk]."""
    if not _small(inputs) or not _small(outputs):
        return False
    payload = _payload(inputs)
    if payload is None:
        _store(outputs, None)
        return True
    members = _exchange(gid, "gather", payload, event)
    if len(members) != len(outputs) or any(m is None or len(m) <= chunk for m in members):
        _store(outputs, None)
        return True
    _store(outputs, [m[chunk] for m in members])
    return True


def _gather_into(gid: int, output: torch.Tensor, input: torch.Tensor, event: int | None, extra: list = ()):
    """Every member's payload (its input's value, then `extra`) for a single-tensor collective; None, with the
    output's value forgotten, when a member's value is unknown; None, leaving it, for tensors too big to carry."""
    if not _small([input]) or not _small([output]):
        return None
    payload = _payload([input])
    if payload is None:
        _store([output], None)
        return None
    members = _exchange(gid, "gather", payload + list(extra), event)
    if any(m is None for m in members):
        _store([output], None)
        return None
    return members


def all_gather_into(gid: int, output: torch.Tensor, input: torch.Tensor, event: int | None) -> bool:
    """output = the members' inputs concatenated along dim 0. Whether the output's value was settled."""
    members = _gather_into(gid, output, input, event)
    if members is None:
        return _small([input]) and _small([output])
    import numpy as np
    _store([output], [np.concatenate([np.reshape(m[0], (-1,) + tuple(input.shape[1:])) for m in members])])
    return True


def all_to_all_into(gid: int, output: torch.Tensor, input: torch.Tensor, in_splits, me: int,
                    event: int | None) -> bool:
    """output = chunk `me` of every member's input (split along dim 0 by that member's split sizes, equal chunks
    without), concatenated in member order: the per-expert token counts frameworks exchange before dispatching
    tokens. Each member's payload carries its split sizes."""
    import numpy as np
    members = _gather_into(gid, output, input, event, [np.asarray(list(in_splits or ()), dtype=np.int64)])
    if members is None:
        return _small([input]) and _small([output])
    n = len(members)
    chunks = []
    for m in members:
        rows = np.reshape(m[0], (-1,) + tuple(input.shape[1:]))
        splits = [int(x) for x in m[1]] if len(m) > 1 and len(m[1]) else [rows.shape[0] // n] * n
        start = sum(splits[:me])
        chunks.append(rows[start:start + splits[me]])
    _store([output], [np.concatenate(chunks)])
    return True


def _travels(numel: int, dtype: torch.dtype) -> bool:
    """Whether one peer's chunk of an all-to-all of unequal sizes carries its value: a non-empty chunk within
    `values.small_buffer`'s limits. Sender and receiver decide alike: the chunk one sends is the one the other
    receives, of the same element count and dtype."""
    if numel <= 0:
        return False
    if numel <= SMALL_NUMEL:
        return True
    return numel <= SMALL_INT_NUMEL and not (dtype.is_floating_point or dtype.is_complex)


def _swap_chunks(gid: int, ranks: list[int], me: int, send: list[tuple[int, torch.dtype, Any]],
                 recv: list[tuple[int, torch.dtype]]) -> list:
    """The chunks of an all-to-all of unequal sizes (a group of sends and receives, alltoall.py), pair by pair:
    `send[p]` = (elements, dtype, value or None) of the chunk for group rank p, `recv[p]` = (elements, dtype) of
    the chunk from p. Each travelling chunk (`_travels`) is posted for its receiver, then each one due is taken
    from its sender. Returns the received chunks' values: this rank's own chunk as it sends it, an empty array
    for an empty chunk, None for one that is unknown or too large to travel.

    Taking a value does not make the host wait for the transfers (unlike the collectives' exchange): a read of
    the output does, as on a GPU (`.tolist()`, `.item()` download it after the transfers on its stream)."""
    import numpy as np
    ctx = context.get()
    out: list = []
    METER.enter()
    try:
        for p, (numel, dtype, value) in enumerate(send):
            if p != me and _travels(numel, dtype):
                ctx.runtime.put_object(_p2p_key(gid, ranks[me], ranks[p], "all_to_all"), value)
        for p, (numel, dtype) in enumerate(recv):
            if p == me:
                out.append(send[me][2])
            elif numel <= 0:
                out.append(np.zeros(0, dtype=np.float32))
            elif not _travels(numel, dtype):
                out.append(None)
            else:
                sync = Op(OpKind.SYNC_EVENT, stream=ctx.dev.stream(), arg=-1, cpu_delta=METER.claim())
                found, value = ctx.runtime.take_object(_p2p_key(gid, ranks[p], ranks[me], "all_to_all"), sync)
                out.append(value if found else None)
    finally:
        METER.exit()
    return out


def _value_of(t: torch.Tensor) -> Any:
    v = _payload([t]) if _small([t]) else None
    return None if v is None else v[0]


def all_to_all_uneven(gid: int, ranks: list[int], me: int, outputs: list[torch.Tensor],
                      inputs: list[torch.Tensor]) -> None:
    """The list form of an all-to-all of tensors of different sizes: outputs[p] receives member p's inputs[me]."""
    if len(inputs) != len(ranks) or len(outputs) != len(ranks):
        for t in outputs:
            VALUES.drop(t)
        return
    got = _swap_chunks(gid, ranks, me, [(t.numel(), t.dtype, _value_of(t)) for t in inputs],
                       [(t.numel(), t.dtype) for t in outputs])
    for t, value in zip(outputs, got):
        if value is None or not small_enough(t) or value.size != t.numel():
            VALUES.drop(t)
        else:
            _store([t], [value])


def all_to_all_uneven_into(gid: int, ranks: list[int], me: int, output: torch.Tensor, input: torch.Tensor,
                           in_splits, out_splits) -> None:
    """An all-to-all of one tensor with unequal split sizes along dim 0: output = chunk `me` of every member's
    input, in member order."""
    import numpy as np
    n = len(ranks)

    def chunks(t: torch.Tensor, splits) -> list[int]:
        rows = t.shape[0] if t.dim() else 0
        row = t.numel() // rows if rows else 0
        return [int(s) * row for s in splits] if splits else [t.numel() // n] * n

    sizes_in, sizes_out = chunks(input, in_splits), chunks(output, out_splits)
    whole = _value_of(input) if all(_travels(k, input.dtype) or k == 0 for k in sizes_in) else None
    send, start = [], 0
    for k in sizes_in:
        send.append((k, input.dtype, None if whole is None else np.reshape(whole, -1)[start:start + k]))
        start += k
    got = _swap_chunks(gid, ranks, me, send, [(k, output.dtype) for k in sizes_out])
    if any(v is None for v in got) or not small_enough(output) or sum(v.size for v in got) != output.numel():
        VALUES.drop(output)
        return
    parts = [np.reshape(v, -1) for v in got if v.size]
    _store([output], [(np.concatenate(parts) if parts else np.zeros(0)).reshape(tuple(output.shape))])


def _start_as(out: torch.Tensor, inp: torch.Tensor) -> None:
    """`out` holds `inp`'s known value (or is unknown), as a functional collective's new output starts."""
    value = VALUES.get(inp)
    if value is None:
        VALUES.drop(out)
    else:
        with unset_fake_temporarily():
            VALUES.write(out, value)


def functional(name: str, gid: int, args: tuple, kwargs: dict, out: Any, me: int, size: int) -> None:
    """Known values through a functional collective (`_c10d_functional.*`, as DTensor and `funcol` issue them): its
    output is a new tensor (the input itself for the in-place forms), which receives what the c10d collective of
    the same name gives. The host does not wait for the collective here: reading the output waits for it
    (`wait_tensor`, then the read's synchronisation)."""
    inp = args[0] if args else kwargs.get("input")
    if name in ("all_reduce_coalesced", "all_reduce_coalesced_") and isinstance(inp, (list, tuple)):
        outs = list(inp) if name.endswith("_") else [t for t in pytree.tree_leaves(out)]
        if outs is not inp and len(outs) == len(inp):     # the outputs start as the inputs
            for i, o in zip(inp, outs):
                _start_as(o, i)
        all_reduce(gid, outs, args[1] if len(args) > 1 else kwargs.get("reduce_op"), None)
        return
    if not isinstance(inp, torch.Tensor) or not isinstance(out, torch.Tensor):
        for t in pytree.tree_leaves(out):        # the other coalesced forms: their outputs unknown
            VALUES.drop(t)
        return
    if name in ("all_reduce", "all_reduce_"):
        op = args[1] if len(args) > 1 else kwargs.get("reduce_op")
        if not _small([inp]):
            _store([out], None)
            return
        kind = reduce_kind(op) if isinstance(op, str) else None
        payload = _payload([inp]) if kind else None
        _store([out], _exchange(gid, kind, payload, None) if payload is not None else None)
    elif name in ("all_gather_into_tensor", "all_gather_into_tensor_out"):
        if not all_gather_into(gid, out, inp, None):
            _store([out], None)
    elif name == "reduce_scatter_tensor":
        op = args[1] if len(args) > 1 else kwargs.get("reduce_op")
        if not reduce_scatter_into(gid, out, inp, op, me, size, None):
            _store([out], None)
    elif name in ("broadcast", "broadcast_"):
        root = args[1] if len(args) > 1 else kwargs.get("src", 0)
        if out is not inp:                       # the functional form's output starts as the input
            _start_as(out, inp)
        broadcast(gid, [out], int(root), me, None)


_P2P_COUNT: dict[tuple[int, int, int, str], int] = {}


def _p2p_key(gid: int, src: int, dst: int, tag: str = "tensor") -> tuple:
    n = _P2P_COUNT.get((gid, src, dst, tag), 0)
    _P2P_COUNT[(gid, src, dst, tag)] = n + 1
    return (gid, src, dst, (tag, n))          # apart from the object messages' counters


# a point-to-point message of at most this many bytes carries its values (4,096 int64: DeepSpeed's pipeline sends its
# metadata as 256 int32): sender and receiver judge it by its bytes, which NCCL requires equal on both sides, so that
# their counts of such messages stay in step whatever dtypes and shapes each side gives them
P2P_VALUE_BYTES = SMALL_INT_NUMEL * 8


def _p2p_carries(tensors: list[torch.Tensor]) -> bool:
    return bool(tensors) and all(isinstance(t, torch.Tensor) for t in tensors) and \
        sum(t.numel() * t.element_size() for t in tensors) <= P2P_VALUE_BYTES


def _layout(tensors: list[torch.Tensor]) -> list[tuple[str, tuple[int, ...]]]:
    return [(str(t.dtype), tuple(t.shape)) for t in tensors]


def p2p_send(gid: int, src: int, dst: int, tensors: list[torch.Tensor]) -> None:
    """A send of at most P2P_VALUE_BYTES posts its tensors' values (None when unknown, or not small by the values'
    rule) with their dtypes and shapes for the receiver (global ranks), also inside an NCCL group
    (batch_isend_irecv, a coalescing manager), whose receives take them when the group ends."""
    if not _p2p_carries(tensors):
        return
    ctx = context.get()
    METER.enter()
    try:
        values = _payload(tensors) if _small(tensors) else None
        ctx.runtime.put_object(_p2p_key(gid, src, dst), (_layout(tensors), values))
    finally:
        METER.exit()


def p2p_recv(gid: int, src: int, dst: int, tensors: list[torch.Tensor], event: int | None) -> None:
    """The matching receive: the host waits for the receive's completion (as reading the values would make it) and
    takes the sender's values. Pipeline engines send tensor shapes this way before the activations (DeepSpeed's
    PipelineEngine) and, inside an NCCL group, when the group ends: the group's receives complete only then, and
    every peer has posted its sends by then (Megatron's batched p2p sends the shapes of variable-length sequences so).
    """
    from .comm import at_group_end, in_group
    if not _p2p_carries(tensors):
        _store(tensors, None)                # what they held is overwritten with what no one here knows
        return
    key = _p2p_key(gid, src, dst)              # in program order, as the sender's
    if in_group():
        at_group_end(lambda: _take(key, tensors, event))
    else:
        _take(key, tensors, event)


def _take(key: tuple, tensors: list[torch.Tensor], event: int | None) -> None:
    ctx = context.get()
    METER.enter()
    try:
        sync = Op(OpKind.SYNC_EVENT, stream=ctx.dev.stream(), arg=-1 if event is None else int(event),
                  cpu_delta=METER.claim())
        found, payload = ctx.runtime.take_object(key, sync)
    finally:
        METER.exit()
    layout, values = payload if found and payload is not None else (None, None)
    # values arrive where the receiver takes them as the sender gave them: into other dtypes or shapes the bytes
    # would be reinterpreted, which the carried values do not say: unknown
    _store(tensors, values if layout == _layout(tensors) and _small(tensors) else None)


def objects_gather(gid: int, obj: Any, event: int | None) -> list:
    return list(_exchange(gid, "gather", obj, event))


def objects_broadcast(gid: int, objs: Any, root: int, event: int | None) -> Any:
    return _exchange(gid, f"broadcast:{root}", objs, event)
