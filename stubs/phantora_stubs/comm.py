"""Process groups as the simulator knows them, and how a collective becomes ops on a rank's streams.

Group ids are assigned in creation order. Every rank creates the same groups in the same order (SPMD: new_group
must be called by all ranks, split_group by all ranks of the parent), so the ids agree across ranks without any
communication. The world group is id 0.

Each group has its own communication stream, as ProcessGroupNCCL does. A collective launched on a group:
  EVENT_RECORD(current stream, e1); STREAM_WAIT(comm stream, e1)      -- the collective sees the inputs
  COLLECTIVE / SEND / RECV on the comm stream
  EVENT_RECORD(comm stream, e2)                                        -- its completion
and waiting on it (Work.wait(), wait_tensor) makes the current stream wait for e2.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from phantora.engine.ops import Op, OpKind

from .clock import METER
from .errors import note_collective, note_transfer


@dataclass
class GroupInfo:
    gid: int
    ranks: list[int]          # global ranks in group-rank order
    name: str
    comm_stream: int

    @property
    def size(self) -> int:
        return len(self.ranks)


class GroupRegistry:
    def __init__(self, runtime, dev):
        self.runtime = runtime
        self.dev = dev
        self._next = 0
        self.by_gid: dict[int, GroupInfo] = {}
        self._by_name: dict[str, GroupInfo] = {}

    def next_gid(self) -> int:
        """Reserve the next group id (call once per group creation, on every rank, member or not)."""
        gid = self._next
        self._next += 1
        return gid

    def add(self, gid: int, ranks: list[int], name: str) -> GroupInfo:
        info = GroupInfo(gid=gid, ranks=list(ranks), name=name, comm_stream=self.dev.new_stream_id())
        self.by_gid[gid] = info
        self._by_name[name] = info
        self.runtime.register_group(gid, list(ranks), name)
        return info

    def rename(self, info: GroupInfo, name: str) -> None:
        self._by_name.pop(info.name, None)
        info.name = name
        self._by_name[name] = info

    def by_name(self, name: str) -> GroupInfo | None:
        return self._by_name.get(str(name))


def launch(ctx, kind: OpKind, name: str, group: GroupInfo, nbytes: int, arg: int = -1,
           device: int | None = None) -> int:
    """Emit a collective / p2p op on the group's stream, ordered after the current stream; returns its event.
    `device`: the CUDA device of an NCCL collective's tensors; the first on each group is told to the runtime, which
    refuses two ranks of a node on one device as NCCL's communicator does (`Runtime.note_device`)."""
    rt, dev = ctx.runtime, ctx.dev
    if device is not None and kind == OpKind.COLLECTIVE:
        noted = ctx.extras.setdefault("nccl_devices", set())
        if group.gid not in noted:
            noted.add(group.gid)
            physical = _physical_gpu(int(device))
            if physical is not None:
                rt.note_device(group.gid, physical)
    cur = dev.stream()
    e1 = dev.new_event_id()
    rt.submit(Op(OpKind.EVENT_RECORD, stream=cur, arg=e1, cpu_delta=METER.claim()))
    rt.submit(Op(OpKind.STREAM_WAIT, stream=group.comm_stream, arg=e1))
    rt.submit(Op(kind, stream=group.comm_stream, name=name, group=group.gid, nbytes=int(nbytes), arg=arg))
    if kind == OpKind.COLLECTIVE:
        note_collective(group.gid, name, nbytes)       # where the program issued it, for the launcher's reports
    elif kind in (OpKind.SEND, OpKind.RECV):
        note_transfer(group.gid, name, nbytes, group.ranks[arg] if 0 <= arg < len(group.ranks) else arg)
    batch = getattr(_GROUP, "pending", None)
    if batch is not None and kind in (OpKind.SEND, OpKind.RECV):
        # inside ncclGroupStart/End the transfers run at the group's end: so does the completion event
        for stream, e2 in batch:
            if stream == group.comm_stream:
                return e2
        e2 = dev.new_event_id()
        batch.append((group.comm_stream, e2))
        return e2
    e2 = dev.new_event_id()
    rt.submit(Op(OpKind.EVENT_RECORD, stream=group.comm_stream, arg=e2))
    return e2


def _physical_gpu(index: int) -> int | None:
    """The GPU of the host that CUDA device `index` of this process is (through CUDA_VISIBLE_DEVICES: a process given
    "3" sees that GPU as device 0); None for an index the process does not have."""
    from .cuda_device import visible
    gpus = visible()
    return gpus[index] if 0 <= index < len(gpus) else None


def join(ctx, event_id: int) -> None:
    """Make the current stream wait for a collective's completion event."""
    ctx.runtime.submit(Op(OpKind.STREAM_WAIT, stream=ctx.dev.stream(), arg=event_id, cpu_delta=METER.claim()))


_GROUP = threading.local()      # depth: open ncclGroupStart calls; pending: completion events of the batch;
                                # deferred: what runs once the batch has ended (its receives' values)


def in_group() -> bool:
    """Whether this thread is inside an NCCL group (batch_isend_irecv, a coalescing manager)."""
    return getattr(_GROUP, "depth", 0) > 0


def group_marker(ctx, kind: OpKind) -> None:
    """GROUP_START / GROUP_END around a batch of point-to-point ops. Groups nest as NCCL's do (only the outermost
    pair is emitted); the completion event of every communication stream the batch used is recorded after the
    GROUP_END, so that waiting on any of the batch's works waits for the whole batch, as with ProcessGroupNCCL's
    coalesced work."""
    depth = getattr(_GROUP, "depth", 0)
    if kind == OpKind.GROUP_START:
        _GROUP.depth = depth + 1
        if depth == 0:
            _GROUP.pending, _GROUP.deferred = [], []
            ctx.runtime.submit(Op(kind, stream=ctx.dev.stream(), cpu_delta=METER.claim()))
        return
    if depth <= 0:
        return
    _GROUP.depth = depth - 1
    if depth > 1:
        return
    pending, _GROUP.pending = _GROUP.pending, None
    ctx.runtime.submit(Op(kind, stream=ctx.dev.stream(), cpu_delta=METER.claim()))
    for stream, e2 in pending:
        ctx.runtime.submit(Op(OpKind.EVENT_RECORD, stream=stream, arg=e2))
    deferred, _GROUP.deferred = _GROUP.deferred, []
    for run in deferred:
        run()


def drop_group_end_work() -> None:
    """Forget what the open group's end would run: the batch raised, and its peers may never post their sends."""
    if getattr(_GROUP, "deferred", None):
        _GROUP.deferred = []


def at_group_end(run) -> None:
    """Call `run()` when the outermost NCCL group ends, after its completion events are recorded: a receive of the
    group completes only then (exchange.p2p_recv takes its values there)."""
    _GROUP.deferred.append(run)
