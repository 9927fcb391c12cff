"""The discrete-event simulation engine: one code path for live runs and for replay.

Per rank: a CPU clock, GPU streams executing in FIFO order, events (record / wait across streams), host syncs and a
caching-allocator model. Across ranks: collectives rendezvous over the members of their group and put their flows on
one shared network, so concurrent collectives contend; point-to-point sends and receives are matched per pair.

Time management is conservative. A rank's CPU runs ahead freely (issuing kernels only queues work) and stops at host
syncs, and at a launch onto a stream that holds `[host] launch_queue` launches: that launch waits until the stream's
oldest launch completes, as a CUDA host does. When every rank is stopped, or starved of input in a live run, the
earliest pending network event is safe to process: any later submission happens at or after the time of the event
that unblocks it, and a starved rank can submit nothing earlier than its CPU clock. Results therefore never depend
on the order in which ranks report, and ties are broken by sequence numbers: the engine is deterministic.

Representative ranks: only some ranks may be simulated; `rank_map[r]` names the simulated rank that rank r mirrors.
Groups holding a simulated rank rendezvous over their simulated members and carry every member's flows. Groups with no
simulated member mirror the group that is their image under `rank_map`: each of their collectives starts with the
matching collective of that group, so mirrored ranks still load the network.

Speed (replay runs at a few microseconds per op): the common kinds are handled on inlined paths of `_run_rank` and
`_drain`; ops are reported through a per-rank `emit` callable (a sink's `emitter(rank)`, e.g. a list's append);
collectives that run alone on the network complete at cached offsets (`Engine.idle_shortcut`, net/network.py).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterable

from ..cluster import ClusterSpec, DeviceMemorySpec
from ..errors import SimulationError
from ..net.network import Network
from .allocator import AllocatorConfig, CachingAllocatorModel, DeviceOutOfMemory
from .devmem import OutsideMemory
from .ops import Memcpy, Op, OpKind

INF = math.inf
K = OpKind
_KERNEL = int(OpKind.KERNEL)
_MEMCPY = int(OpKind.MEMCPY)
_COLLECTIVE = int(OpKind.COLLECTIVE)
_RECORD = int(OpKind.EVENT_RECORD)
_WAIT = int(OpKind.STREAM_WAIT)


@dataclass
class Group:
    gid: int
    ranks: tuple[int, ...]
    name: str = ""
    simulated: tuple[int, ...] = ()
    mirror_of: int | None = None          # for shadow groups: the live group they mirror
    shadows: list[int] = field(default_factory=list)

    def __post_init__(self):
        self.members = frozenset(self.ranks)


_COMPUTE_INTENSITY = 32.0
"""FLOPs per DRAM byte above which a kernel counts as compute-bound when it shares the GPU with a collective (GEMMs
and attention are in the hundreds or more, element-wise kernels and copies below one)."""


class _Event:
    """One recording of a CUDA event; resolved when the stream reaches the record."""
    __slots__ = ("time", "waiters")

    def __init__(self):
        self.time: float | None = None
        self.waiters: list = []


class _Mark:
    """An iteration mark waiting for the streams that had work when it was issued."""
    __slots__ = ("issue", "time", "remaining")

    def __init__(self, issue: float):
        self.issue = issue
        self.time = issue
        self.remaining = 0


class _Stream:
    __slots__ = ("sid", "tail", "blocked", "pending", "launched", "ends", "freed")

    def __init__(self, sid: int, t: float, depth: int = 1):
        self.sid = sid
        self.tail = t
        self.blocked = False
        self.pending: deque = deque()
        self.launched = 0                       # launches issued (kernels, copies, collectives)
        self.ends: deque = deque(maxlen=depth)  # completion times of launches no later launch has waited for yet
        self.freed = 0                          # launches a later launch has waited for (taken from `ends`)

    def completed_by(self, t: float) -> int:
        """How many of the stream's launches are known to have completed by time `t` (in launch order)."""
        n = self.freed
        for end in self.ends:
            if end > t:
                break
            n += 1
        return n


class _Rank:
    def __init__(self, rank: int, capacity: int, allocator: AllocatorConfig | None = None, device_memory=None,
                 queue_len: int = 1):
        self.rank = rank
        self.queue_len = queue_len          # the streams' `ends` hold at most this many (the launch queue's depth)
        self.cpu = 0.0
        self.queue: deque = deque()
        self.closed = False
        self.index = 0
        self.streams: dict[int, _Stream] = {}
        self.events: dict[int, _Event] = {}
        self.waiting: tuple | None = None
        self.wait_index = -1
        self.wait_op: Op | None = None
        self.group_seq: dict[int, int] = {}
        self.p2p_seq: dict[tuple[int, int, int], int] = {}
        self.batch: list | None = None
        self.allocator = CachingAllocatorModel(capacity, allocator)
        self.outside = OutsideMemory(self.allocator, device_memory or DeviceMemorySpec())
        self.emit: Callable[[tuple], None] = _discard
        self.iterations: list[float] = []
        self.last_op: tuple[int, Op] | None = None
        self.share: list | None = None     # kernels placed, (start, end, extra, stream), while GPU sharing is modelled
        self.side: dict | None = None      # kernels placed per stream, for streams side by side (Engine._side_by_side)
        self.inflight: dict[int, float] = {}   # collectives of this rank in progress: id -> start

    def stream(self, sid: int) -> _Stream:
        st = self.streams.get(sid)
        if st is None:
            st = self.streams[sid] = _Stream(sid, self.cpu, self.queue_len)
        return st


@dataclass
class _Coll:
    cid: int
    key: tuple
    group: Group
    name: str
    nbytes: int
    root: int
    arrived: dict = field(default_factory=dict)      # rank -> (ready time, stream, item)
    start: float = INF
    plan: object = None
    shadow: bool = False


Sink = Callable[[int, int, Op, float, float, float, int], None]


def _discard(record: tuple) -> None:
    pass


def _emitter(sink: Sink, rank: int) -> Callable[[tuple], None]:
    def emit(record: tuple) -> None:
        sink(rank, *record)
    return emit


class Engine:
    """Simulates op streams of the ranks of one cluster.

    sink(rank, index, op, issue, start, end, coll_id) receives every op once its times are known (any order). A sink
    may also offer `emitter(rank)`: a callable taking one (index, op, issue, start, end, coll_id) tuple, which the
    engine then calls instead (a bound `list.append`, say, which costs no Python frame per op).
    on_sync(rank, index, cpu_time) is called when a blocking op of a rank completes (live runs answer the rank then).
    """

    idle_shortcut = True
    """Collectives that start on an idle network complete at cached offsets instead of going through the flow
    simulator (see net/network.py); the full flow simulation stays the reference it is tested against."""

    def __init__(self, spec: ClusterSpec, *, simulated: Iterable[int] | None = None,
                 rank_map: list[int] | None = None, sink: Sink | None = None,
                 on_sync: Callable[[int, int, float], None] | None = None,
                 launch_overhead_s: float | None = None, cpu_time_scale: float | None = None,
                 vram_bytes: int | None = None, algo: str | None = None, proto: str | None = None,
                 allocator: AllocatorConfig | None = None):
        self.spec = spec
        self.world_size = spec.world_size
        self.net = Network(spec, idle_shortcut=self.idle_shortcut)
        sim = sorted(set(simulated)) if simulated is not None else list(range(self.world_size))
        self.rank_map = list(rank_map) if rank_map is not None else list(range(self.world_size))
        if len(self.rank_map) != self.world_size:
            raise SimulationError(f"rank map has {len(self.rank_map)} entries for a world of {self.world_size}")
        for r in sim:
            if self.rank_map[r] != r:
                raise SimulationError(f"simulated rank {r} must map to itself in the rank map")
        capacity = vram_bytes if vram_bytes is not None else spec.vram_bytes()
        self.allocator_config = allocator or AllocatorConfig()
        # a stream holds this many launches; the next launch blocks the host until the oldest completes (0: no limit)
        depth = spec.host.launch_queue
        self.queue_limit = depth if depth > 0 else INF
        self.ranks: dict[int, _Rank] = {r: _Rank(r, capacity, self.allocator_config, spec.device_memory,
                                                 depth if depth > 0 else 1)
                                        for r in sim}
        self.sink = sink or (lambda *a: None)
        emitter = getattr(self.sink, "emitter", None)
        for r, rs in self.ranks.items():
            rs.emit = emitter(r) if emitter is not None else _emitter(self.sink, r)
        self.on_sync = on_sync or (lambda *a: None)
        self.launch = spec.host.launch_overhead_us * 1e-6 if launch_overhead_s is None else launch_overhead_s
        self.cpu_scale = spec.host.cpu_time_scale if cpu_time_scale is None else cpu_time_scale
        # a generated kernel's launch and the compiled-region calls it opens (a KERNEL's arg: ops.generated_kernel_arg)
        self.gen_launch = spec.host.generated_launch_us * 1e-6
        self.call_cost = spec.host.compiled_call_us * 1e-6
        self.algo, self.proto = algo, proto
        nccl = spec.nccl
        self.share_compute = nccl.sharing_compute - 1.0
        self.share_memory = nccl.sharing_memory - 1.0
        self.share_collective = nccl.sharing_collective - 1.0
        if self.world_size > 1 and (self.share_compute > 0 or self.share_memory > 0 or self.share_collective > 0):
            for rs in self.ranks.values():
                rs.share = []
        sides = spec.streams
        # [kind of the kernel][kind of the one beside it] -> its factor less one (True: compute-bound)
        self.side_extra = {True: {True: sides.compute_beside_compute - 1.0, False: sides.compute_beside_memory - 1.0},
                           False: {True: sides.memory_beside_compute - 1.0, False: sides.memory_beside_memory - 1.0}}
        self.side_min = sides.min_us * 1e-6
        if sides.active:
            for rs in self.ranks.values():
                rs.side = {}
        self.groups: dict[int, Group] = {}
        self._colls: dict[tuple, _Coll] = {}
        self._by_cid: dict[int, _Coll] = {}
        self._starts: list = []                    # heap of (t, seq, cid)
        self._seq = itertools.count()
        self._cid = itertools.count()
        self._p2p: dict[tuple, dict] = {}          # (gid, src, dst, seq) -> {"send": ..., "recv": ...}
        self._runnable: set[int] = set(sim)
        self._open = len(sim)                      # ranks not closed yet
        self._mirrors: dict[int, list[int]] = {}   # simulated rank -> the ranks that mirror it
        for m, rep in enumerate(self.rank_map):
            if m not in self.ranks:
                self._mirrors.setdefault(rep, []).append(m)
        self.collectives: list[dict] = []          # finished collectives (for traces and reports)
        self.ooms: list[tuple[int, int, DeviceOutOfMemory]] = []
        self.add_group(0, tuple(range(self.world_size)), "world")

    # ------------------------------------------------------------------------------------------------ setup
    def add_group(self, gid: int, ranks: Iterable[int], name: str = "") -> None:
        ranks = tuple(ranks)
        for r in ranks:
            if not 0 <= r < self.world_size:
                raise SimulationError(f"group {gid} ({name}) names rank {r} outside the world of {self.world_size}")
        if gid in self.groups:
            if self.groups[gid].ranks != ranks:
                raise SimulationError(f"group {gid} redefined with other ranks: {self.groups[gid].ranks} vs {ranks}")
            return
        g = Group(gid, ranks, name, tuple(r for r in ranks if r in self.ranks))
        if not g.simulated:
            image = tuple(self.rank_map[r] for r in ranks)
            live = [h for h in self.groups.values() if h.simulated and h.ranks == image]
            # the i-th shadow group with this image mirrors the i-th live group with it
            used = sum(1 for h in self.groups.values() if h.mirror_of is not None and
                       tuple(self.rank_map[r] for r in h.ranks) == image)
            if used < len(live):
                g.mirror_of = live[used].gid
                live[used].shadows.append(gid)
        self.groups[gid] = g

    # ------------------------------------------------------------------------------------------------ input
    def feed(self, rank: int, ops: Iterable[Op]) -> None:
        rs = self.ranks[rank]
        rs.queue.extend(ops)
        if rs.waiting is None:
            self._runnable.add(rank)

    def close(self, rank: int) -> None:
        rs = self.ranks[rank]
        if not rs.closed:
            rs.closed = True
            self._open -= 1

    # ------------------------------------------------------------------------------------------------ main loop
    def run(self) -> bool:
        """Simulate as far as the input allows. Returns True when every rank has finished all its ops."""
        while True:
            while self._runnable:
                for r in sorted(self._runnable):
                    self._runnable.discard(r)
                    self._run_rank(self.ranks[r])
            horizon = self.horizon()
            t_start = self._starts[0][0] if self._starts else INF
            t_net = self.net.next_event_time()
            t = min(t_start, t_net)
            if t == INF or t > horizon:
                break
            self._advance(t)
            if t_start <= t:
                while self._starts and self._starts[0][0] <= t:
                    _, _, cid = heapq.heappop(self._starts)
                    coll = self._by_cid[cid]
                    if coll.key[0] == "p2p":
                        self._advance(coll.start)
                        self._start_p2p_flows(coll)
                    else:
                        self._start_collective(coll)
        done = all(rs.closed and not rs.queue and rs.waiting is None and self._streams_idle(rs)
                   for rs in self.ranks.values())
        if not done and all(rs.closed and (not rs.queue or rs.waiting is not None) for rs in self.ranks.values()) \
                and not self._starts and self.net.idle:
            raise SimulationError(self._deadlock_report())
        return done

    def horizon(self) -> float:
        """The virtual time up to which the simulation is settled once `run` returns: the CPU time of the earliest
        rank that is still computing (not blocked at a host sync, its input consumed, not finished), before which it
        may still issue work; INF when no rank may issue more."""
        return INF if not self._open else min(
            (rs.cpu for rs in self.ranks.values() if rs.waiting is None and not rs.queue and not rs.closed),
            default=INF)

    def _advance(self, t: float) -> None:
        for tag, t_end in self.net.advance_to(t):
            coll = self._by_cid.pop(tag, None)
            if coll is None or coll.shadow:
                continue
            if coll.key[0] == "p2p":
                self._finish_p2p(coll, t_end)
            else:
                self._finish_collective(coll, t_end)

    # ------------------------------------------------------------------------------------------------ CPU side
    def _run_rank(self, rs: _Rank) -> None:
        """Issue the rank's queued ops until it blocks at a host sync or runs out of input.

        Kernels, event records, stream waits and collectives are the bulk of every stream, so their CPU side is
        inlined here (with the CPU clock and op index in locals); every other kind goes through `_issue`.
        """
        q = rs.queue
        if rs.waiting is not None or not q:
            return
        popleft = q.popleft
        emit = rs.emit
        launch = self.launch
        gen_launch, call_cost = self.gen_launch, self.call_cost
        scale = self.cpu_scale
        streams = rs.streams
        events = rs.events
        group_seq = rs.group_seq
        limit = self.queue_limit
        qlen = rs.queue_len
        idx = rs.index
        cpu = rs.cpu
        op = None
        while q:
            op = popleft()
            before = cpu
            cpu += op.cpu_delta * scale
            k = op.kind
            if k <= _COLLECTIVE:     # a launch: kernel, copy or collective
                st = streams.get(op.stream)
                if st is None:
                    st = streams[op.stream] = _Stream(op.stream, cpu, qlen)
                if st.launched >= limit:
                    # the stream's launch queue is full: the host waits until its oldest launch completes
                    ends = st.ends
                    if not ends:
                        q.appendleft(op)         # issued again once a launch of the stream completes
                        rs.cpu = before
                        rs.index = idx
                        rs.last_op = (idx, op)
                        rs.waiting = ("queue", st)
                        return
                    e = ends.popleft()
                    st.freed += 1
                    if e > cpu:
                        cpu = e
                st.launched += 1
                if k == _KERNEL:
                    cpu += launch
                    if op.arg > 0:       # generated by Inductor, after arg - 1 calls of compiled regions began
                        cpu += gen_launch + (op.arg - 1) * call_cost
                    if st.blocked or st.pending:
                        st.pending.append((idx, op, cpu, None))
                    else:
                        tail = st.tail
                        start = cpu if cpu > tail else tail
                        st.tail = end = start + op.duration
                        if rs.side is not None and op.duration >= self.side_min:
                            end = self._side_by_side(rs, op, st, start, end, cpu)
                        emit((idx, op, cpu, start, end, -1))
                        st.ends.append(end)
                        if rs.share is not None:
                            self._shared(rs, op, start, end)
                    idx += 1
                    continue
            if k == _RECORD or k == _WAIT:
                if k == _RECORD:
                    ev = events[op.arg] = _Event()
                else:
                    ev = events.get(op.arg)
                st = streams.get(op.stream)
                if st is None:
                    st = streams[op.stream] = _Stream(op.stream, cpu, qlen)
                if st.blocked or st.pending:
                    st.pending.append((idx, op, cpu, ev))
                elif k == _RECORD:               # a new recording: nobody waits for it yet
                    tail = st.tail
                    ev.time = t = cpu if cpu > tail else tail
                    emit((idx, op, cpu, t, t, -1))
                elif ev is None or ev.time is not None:
                    t = ev.time if ev is not None else st.tail
                    if t > st.tail:
                        st.tail = t
                    emit((idx, op, cpu, st.tail, st.tail, -1))
                else:
                    st.blocked = True
                    ev.waiters.append((rs, st, (idx, op, cpu, ev)))
                idx += 1
                continue
            if k == _COLLECTIVE:
                cpu += launch
                if op.group not in rs.outside.comms:
                    rs.outside.op(op)            # the group's NCCL communicator is made now (engine/devmem.py)
                seq = group_seq.get(op.group, 0)
                group_seq[op.group] = seq + 1
                if st.blocked or st.pending:
                    st.pending.append((idx, op, cpu, seq))
                else:
                    st.blocked = True
                    tail = st.tail
                    self._arrive(rs, st, (idx, op, cpu, seq), cpu if cpu > tail else tail)
                idx += 1
                continue
            rs.cpu = cpu
            rs.index = idx + 1
            rs.last_op = (idx, op)
            self._issue(rs, idx, op, k)
            cpu = rs.cpu
            idx = rs.index
            if rs.waiting is not None:
                break
        rs.cpu = cpu
        rs.index = idx
        if op is not None:
            rs.last_op = (idx - 1, op)

    def _issue(self, rs: _Rank, idx: int, op: Op, k: int) -> None:
        """CPU side of the kinds `_run_rank` does not inline (rs.cpu already includes the op's cpu_delta)."""
        if k == K.MEMCPY:
            rs.cpu += self.launch
            self._push(rs, op.stream, (idx, op, rs.cpu, None))
            if op.arg == Memcpy.D2H:
                self._block(rs, ("stream", op.stream), idx, op)
        elif k == K.SEND or k == K.RECV:
            rs.outside.op(op)
            item = self._p2p_item(rs, idx, op)
            if rs.batch is not None:
                rs.batch.append(item)
            else:
                rs.cpu += self.launch
                self._push(rs, op.stream, (idx, op, rs.cpu, [item]))
        elif k == K.GROUP_START:
            rs.batch = []
            rs.emit((idx, op, rs.cpu, rs.cpu, rs.cpu, -1))
        elif k == K.GROUP_END:
            batch, rs.batch = rs.batch or [], None
            if batch:
                rs.cpu += self.launch
                first = batch[0][1]
                self._push(rs, first.stream, (idx, op, rs.cpu, batch))
            else:
                rs.emit((idx, op, rs.cpu, rs.cpu, rs.cpu, -1))
        elif k == K.SYNC_DEVICE:
            self._block(rs, ("device",), idx, op)
        elif k == K.SYNC_STREAM:
            self._block(rs, ("stream", op.stream), idx, op)
        elif k == K.SYNC_EVENT:
            self._block(rs, ("event", rs.events.get(op.arg)), idx, op)
        elif k == K.ALLOC:
            try:
                rs.allocator.alloc(op.nbytes, op.arg, op.stream)
            except DeviceOutOfMemory as exc:
                self.ooms.append((rs.rank, idx, exc))
            rs.emit((idx, op, rs.cpu, rs.cpu, rs.cpu, -1))
        elif k == K.FREE:
            rs.allocator.free(op.arg)
            rs.emit((idx, op, rs.cpu, rs.cpu, rs.cpu, -1))
        elif k == K.ITER_MARK:
            self._mark_iteration(rs, idx, op)
        else:  # CPU
            rs.emit((idx, op, rs.cpu, rs.cpu, rs.cpu, -1))

    def _mark_iteration(self, rs: _Rank, idx: int, op: Op) -> None:
        """An iteration ends when the host has issued it and the GPU has finished all the work issued before: a
        marker joins the queue of every stream that still has work, and the last one to run closes the iteration."""
        mark = _Mark(rs.cpu)
        busy = []
        for st in rs.streams.values():
            if st.blocked or st.pending:
                busy.append(st)
            elif st.tail > mark.time:
                mark.time = st.tail
        if not busy:
            self._close_mark(rs, idx, op, mark)
            return
        mark.remaining = len(busy)
        for st in busy:
            st.pending.append((idx, op, rs.cpu, mark))

    @staticmethod
    def _close_mark(rs: _Rank, idx: int, op: Op, mark: "_Mark") -> None:
        rs.iterations.append(mark.time)
        rs.emit((idx, op, mark.issue, mark.issue, mark.time, -1))

    def _block(self, rs: _Rank, what: tuple, idx: int, op: Op) -> None:
        rs.waiting = what
        rs.wait_index = idx
        rs.wait_op = op
        self._check_wait(rs)

    def _check_wait(self, rs: _Rank) -> None:
        w = rs.waiting
        if w is None:
            return
        if w[0] == "queue":
            if not w[1].ends:
                return
            # a launch of the full stream completed: the launch that waited is issued again (engine._run_rank)
            rs.waiting = None
            self._runnable.add(rs.rank)
            return
        if w[0] == "device":
            if not self._streams_idle(rs):
                return
            t = max([rs.cpu] + [st.tail for st in rs.streams.values()])
        elif w[0] == "stream":
            st = rs.streams.get(w[1])
            if st is not None and (st.blocked or st.pending):
                return
            t = max(rs.cpu, st.tail if st is not None else 0.0)
        else:
            ev = w[1]
            if ev is not None and ev.time is None:
                return
            t = max(rs.cpu, ev.time if ev is not None else 0.0)
        issue = rs.cpu
        rs.cpu = t
        rs.waiting = None
        op = rs.wait_op
        if op.kind != K.MEMCPY:  # a D2H copy was reported with its stream; the sync itself is CPU-side
            rs.emit((rs.wait_index, op, issue, issue, t, -1))
        self.on_sync(rs.rank, rs.wait_index, t)
        self._runnable.add(rs.rank)

    @staticmethod
    def _streams_idle(rs: _Rank) -> bool:
        return all(not st.blocked and not st.pending for st in rs.streams.values())

    # ------------------------------------------------------------------------------------------------ GPU side
    def _push(self, rs: _Rank, sid: int, item: tuple) -> None:
        st = rs.stream(sid)
        if st.blocked or st.pending:
            st.pending.append(item)
        else:
            self._exec(rs, st, item)

    def _drain(self, rs: _Rank, st: _Stream) -> None:
        """Run the stream's queued work until it blocks or runs dry (kernels and resolved waits inline)."""
        pending = st.pending
        emit = rs.emit
        popleft = pending.popleft
        while pending and not st.blocked:
            item = popleft()
            op = item[1]
            k = op.kind
            if k == _KERNEL or k == _MEMCPY:
                issue = item[2]
                tail = st.tail
                start = issue if issue > tail else tail
                st.tail = end = start + op.duration
                if k == _KERNEL and rs.side is not None and op.duration >= self.side_min:
                    end = self._side_by_side(rs, op, st, start, end, issue)
                emit((item[0], op, issue, start, end, -1))
                st.ends.append(end)
                if rs.share is not None and k == _KERNEL:
                    self._shared(rs, op, start, end)
            elif k == _WAIT and (item[3] is None or item[3].time is not None):
                ev = item[3]
                t = ev.time if ev is not None else st.tail
                if t > st.tail:
                    st.tail = t
                emit((item[0], op, item[2], st.tail, st.tail, -1))
            elif k == _COLLECTIVE:
                st.blocked = True
                issue = item[2]
                tail = st.tail
                self._arrive(rs, st, item, issue if issue > tail else tail)
            elif k == _RECORD and not item[3].waiters and rs.waiting is None:
                issue = item[2]
                tail = st.tail
                item[3].time = t = issue if issue > tail else tail
                emit((item[0], op, issue, t, t, -1))
            else:
                self._exec(rs, st, item)
        if not st.blocked or (rs.waiting is not None and rs.waiting[0] == "queue"):
            self._check_wait(rs)

    def _exec(self, rs: _Rank, st: _Stream, item: tuple) -> None:
        idx, op, issue, extra = item
        k = op.kind
        if k == K.KERNEL or k == K.MEMCPY:
            start = issue if issue > st.tail else st.tail
            st.tail = start + op.duration
            if k == K.KERNEL and rs.side is not None and op.duration >= self.side_min:
                self._side_by_side(rs, op, st, start, st.tail, issue)
            rs.emit((idx, op, issue, start, st.tail, -1))
            st.ends.append(st.tail)
            if rs.share is not None and k == K.KERNEL:
                self._shared(rs, op, start, st.tail)
        elif k == K.EVENT_RECORD:
            t = issue if issue > st.tail else st.tail
            extra.time = t
            rs.emit((idx, op, issue, t, t, -1))
            waiters, extra.waiters = extra.waiters, []
            for wrs, wst, witem in waiters:
                self._resolve_wait(wrs, wst, witem, t)
            if rs.waiting is not None and rs.waiting[0] == "event":
                self._check_wait(rs)
        elif k == K.STREAM_WAIT:
            if extra is None or extra.time is not None:
                t = extra.time if extra is not None else st.tail
                if t > st.tail:
                    st.tail = t
                rs.emit((idx, op, issue, st.tail, st.tail, -1))
            else:
                st.blocked = True
                extra.waiters.append((rs, st, item))
        elif k == K.COLLECTIVE:
            st.blocked = True
            ready = issue if issue > st.tail else st.tail
            self._arrive(rs, st, item, ready)
        elif k == K.ITER_MARK:
            if st.tail > extra.time:
                extra.time = st.tail
            extra.remaining -= 1
            if extra.remaining == 0:
                self._close_mark(rs, idx, op, extra)
        else:  # a batch of sends/receives (SEND, RECV or GROUP_END)
            st.blocked = True
            ready = issue if issue > st.tail else st.tail
            self._p2p_arrive(rs, st, item, ready)

    def _resolve_wait(self, rs: _Rank, st: _Stream, item: tuple, t: float) -> None:
        idx, op, issue, _ = item
        if t > st.tail:
            st.tail = t
        rs.emit((idx, op, issue, st.tail, st.tail, -1))
        st.blocked = False
        self._drain(rs, st)

    # ------------------------------------------------------------------------------------------------ collectives
    def _arrive(self, rs: _Rank, st: _Stream, item: tuple, ready: float) -> None:
        idx, op, issue, seq = item
        g = self.groups.get(op.group)
        if g is None:
            raise SimulationError(f"rank {rs.rank} issued {op.name} on unknown process group {op.group}")
        if rs.rank not in g.members:
            raise SimulationError(f"rank {rs.rank} issued {op.name} on group {op.group} ({g.name}) it is not part of")
        key = (op.group, seq)
        coll = self._colls.get(key)
        if coll is None:
            coll = _Coll(next(self._cid), key, g, op.name, op.nbytes, op.arg)
            self._colls[key] = coll
        elif coll.name != op.name or coll.nbytes != op.nbytes:
            first = next(iter(coll.arrived))
            raise SimulationError(
                f"mismatched collectives on group {op.group} ({g.name or 'unnamed'}), call #{seq + 1}: rank {first} "
                f"issued {coll.name} of {coll.nbytes} B but rank {rs.rank} issued {op.name} of {op.nbytes} B")
        coll.arrived[rs.rank] = (ready, st, item)
        if len(coll.arrived) == len(g.simulated):
            del self._colls[key]
            coll.start = max(a[0] for a in coll.arrived.values())
            self._by_cid[coll.cid] = coll
            heapq.heappush(self._starts, (coll.start, next(self._seq), coll.cid))

    def _start_collective(self, coll: _Coll) -> None:
        self._advance(coll.start)
        for r in coll.arrived:
            rs = self.ranks.get(r)
            if rs is not None and rs.share is not None:
                rs.inflight[coll.cid] = coll.start
        name = coll.name
        op_name = "all_reduce" if name == "barrier" else name
        plan = self.net.plan(op_name if name != "barrier" else "barrier", coll.group.ranks, coll.nbytes, coll.root,
                             self.algo, self.proto)
        coll.plan = plan
        self.net.start(coll.cid, plan)
        for sgid in coll.group.shadows:
            sg = self.groups[sgid]
            shadow = _Coll(next(self._cid), (sgid, coll.key[1]), sg, coll.name, coll.nbytes, coll.root,
                           start=coll.start, shadow=True)
            shadow.plan = self.net.plan(op_name if name != "barrier" else "barrier", sg.ranks, coll.nbytes, coll.root,
                                        self.algo, self.proto)
            self._by_cid[shadow.cid] = shadow
            self.net.start(shadow.cid, shadow.plan)

    # ------------------------------------------------------------------------------------------------ GPU sharing
    def _side_by_side(self, rs: _Rank, op: Op, st: _Stream, start: float, end: float, issue: float) -> float:
        """A kernel placed on `st` over [start, end) (as if alone) and the kernels of the rank's other streams it
        overlaps share the GPU (the cluster's `[streams]` factors, by the two kernels' kinds: compute- or
        memory-bound). The new kernel runs longer by the time it overlaps each other kernel times its factor less
        one. Each other kernel runs longer by the part of its own time-as-if-alone that the new one overlaps (a part
        already slowed by an earlier kernel is not slowed again by this one's overlap) times its factor less one:
        its end and its stream's later kernels here move, and so does its stream's tail (its rows were emitted
        already and keep their times; the stream's later work starts later). Returns the new kernel's end, also the
        stream's tail. Only kernels of at least `streams.min_us` take part.

        `rs.side`: per stream, its kernels in order, each [start, end, end as if alone, slowed up to, compute]."""
        compute = op.flops >= _COMPUTE_INTENSITY * op.nbytes
        side = rs.side
        table = self.side_extra
        mine = table[compute]
        sid = st.sid
        alone_end = end
        floor = None
        for k_sid, entries in side.items():
            if len(entries) > 32:       # every stream's list, this one's too (a one-stream program's would only grow)
                if floor is None:
                    # a later kernel starts at or after its stream's tail and its own issue (a queued one's is known;
                    # one issued later, at or after this one's): what ended before that meets nothing more
                    floor = min(max(s.tail, s.pending[0][2] if s.pending else issue) for s in rs.streams.values())
                while entries and entries[0][1] <= floor:
                    entries.popleft()
            if k_sid == sid or not entries:
                continue
            for i, k in enumerate(entries):
                k_start, k_end, k_alone, k_slowed, k_compute = k
                if k_start >= alone_end:
                    break
                if k_end <= start:
                    continue
                o = (k_end if k_end < alone_end else alone_end) - (k_start if k_start > start else start)
                end += o * mine[k_compute]
                lo = max(start, k_start, k_slowed)
                hi = k_alone if k_alone < alone_end else alone_end
                if hi <= lo:
                    continue
                k[3] = hi
                d = (hi - lo) * table[k_compute][compute]
                if d > 0:
                    k[1] = k_end + d
                    for n in range(i + 1, len(entries)):
                        later = entries[n]
                        later[0] += d
                        later[1] += d
                        later[2] += d
                        later[3] += d
                    other = rs.streams.get(k_sid)
                    if other is not None:
                        other.tail += d
        st.tail = end
        mine_list = side.get(sid)
        if mine_list is None:
            mine_list = side[sid] = deque()
        mine_list.append([start, end, alone_end, start, compute])
        return end

    def _shared(self, rs: _Rank, op: Op, start: float, end: float) -> None:
        """Keep a placed kernel for the collectives that may overlap it (their kernels share the GPU)."""
        if end > start:
            compute = op.flops >= _COMPUTE_INTENSITY * op.nbytes
            rs.share.append((start, end, self.share_compute if compute else self.share_memory, op.stream))

    def _sharing(self, coll: _Coll, t_end: float) -> float:
        """A finishing collective and the kernels that ran beside it on its ranks' GPUs slow each other: each
        compute stream is delayed by its overlapped kernel time times its factor less one, and the collective ends
        later by the time compute ran beside it times the collective's factor less one (the largest over its ranks,
        which finish a collective together). Returns the collective's new end."""
        start = coll.start
        extend = 0.0
        for r, (_ready, st, _item) in coll.arrived.items():
            rs = self.ranks.get(r)
            if rs is None or rs.share is None:
                continue
            rs.inflight.pop(coll.cid, None)
            delays: dict[int, float] = {}
            busy: list[tuple[float, float]] = []
            for k_start, k_end, extra, sid in rs.share:
                if sid == st.sid or k_end <= start or k_start >= t_end:
                    continue
                lo = k_start if k_start > start else start
                hi = k_end if k_end < t_end else t_end
                delays[sid] = delays.get(sid, 0.0) + (hi - lo) * extra
                busy.append((lo, hi))
            for sid, d in delays.items():
                other = rs.streams.get(sid)
                if other is not None and d > 0:
                    other.tail += d
            if busy and self.share_collective > 0:
                busy.sort()
                covered, cur_lo, cur_hi = 0.0, busy[0][0], busy[0][1]
                for lo, hi in busy[1:]:
                    if lo > cur_hi:
                        covered += cur_hi - cur_lo
                        cur_lo, cur_hi = lo, hi
                    elif hi > cur_hi:
                        cur_hi = hi
                covered += cur_hi - cur_lo
                e = covered * self.share_collective
                if e > extend:
                    extend = e
            keep = min(rs.inflight.values(), default=t_end)       # what a collective still in progress may overlap
            rs.share = [k for k in rs.share if k[1] > keep]
        return t_end + extend

    def _finish_collective(self, coll: _Coll, t_end: float) -> None:
        if not coll.shadow and self.world_size > 1:
            t_end = self._sharing(coll, t_end)
        plan = coll.plan
        self.collectives.append({"id": coll.cid, "name": coll.name, "group": coll.group.gid, "nbytes": coll.nbytes,
                                 "root": coll.root, "algo": plan.algo if plan else "", "proto": plan.proto if plan else "",
                                 "start": coll.start, "end": t_end})
        for r in sorted(coll.arrived):
            ready, st, item = coll.arrived[r]
            idx, op, issue, _ = item
            st.tail = t_end
            st.blocked = False
            st.ends.append(t_end)
            self.ranks[r].emit((idx, op, issue, ready, t_end, coll.cid))
        for r in sorted(coll.arrived):
            rs = self.ranks[r]
            self._drain(rs, coll.arrived[r][1])

    # ------------------------------------------------------------------------------------------------ point-to-point
    def _p2p_item(self, rs: _Rank, idx: int, op: Op) -> tuple:
        g = self.groups.get(op.group)
        if g is None:
            raise SimulationError(f"rank {rs.rank} issued {OpKind(op.kind).name.lower()} on unknown group {op.group}")
        if not 0 <= op.arg < len(g.ranks):
            raise SimulationError(f"rank {rs.rank}: peer {op.arg} is outside group {op.group} of size {len(g.ranks)}")
        peer = g.ranks[op.arg]
        src, dst = (rs.rank, peer) if op.kind == K.SEND else (peer, rs.rank)
        # a rank's sends to itself and its receives from itself (in one group batch, as NCCL requires) are numbered
        # apart, so that the k-th send meets the k-th receive as between two ranks
        pk = (op.group, src, dst) if src != dst else (op.group, src, dst, op.kind)
        seq = rs.p2p_seq.get(pk, 0)
        rs.p2p_seq[pk] = seq + 1
        return (idx, op, (op.group, src, dst, seq))

    def _p2p_arrive(self, rs: _Rank, st: _Stream, item: tuple, ready: float) -> None:
        idx, op, issue, batch = item
        state = {"rank": rs, "stream": st, "item": item, "ready": ready, "open": len(batch), "end": ready}
        for sub_idx, sub_op, key in batch:
            side = "send" if sub_op.kind == K.SEND else "recv"
            entry = self._p2p.setdefault(key, {})
            if side in entry:
                raise SimulationError(f"rank {rs.rank}: duplicate {side} for transfer {key}")
            entry[side] = (state, sub_idx, sub_op, ready)
            peer = key[2] if side == "send" else key[1]
            if peer not in self.ranks:
                # the peer is mirrored: it posts its half at the same moment
                entry["recv" if side == "send" else "send"] = (None, -1, sub_op, ready)
            if "send" in entry and "recv" in entry:
                self._start_p2p(key, entry)

    def _start_p2p(self, key: tuple, entry: dict) -> None:
        send, recv = entry["send"], entry["recv"]
        s_op, r_op = send[2], recv[2]
        if s_op.nbytes != r_op.nbytes and send[0] is not None and recv[0] is not None:
            raise SimulationError(f"send/recv size mismatch from rank {key[1]} to rank {key[2]}: "
                                  f"{s_op.nbytes} B sent, {r_op.nbytes} B expected")
        coll = _Coll(next(self._cid), ("p2p",) + key, self.groups[key[0]], "send_recv", s_op.nbytes, -1)
        coll.start = max(send[3], recv[3])
        coll.arrived = entry
        self._by_cid[coll.cid] = coll
        heapq.heappush(self._starts, (coll.start, next(self._seq), coll.cid))
        del self._p2p[key]

    def _start_p2p_flows(self, coll: _Coll) -> None:
        _, gid, src, dst, _ = coll.key
        coll.plan = self.net.plan("send_recv", (src, dst), coll.nbytes)
        self.net.start(coll.cid, coll.plan)
        # mirrored pairs at the same offset carry the same transfer
        rep = self.rank_map
        for m in self._mirrors.get(src, ()):
            peer = dst + (m - src)
            if 0 <= peer < self.world_size and peer not in self.ranks and rep[peer] == dst:
                shadow = _Coll(next(self._cid), ("p2p-shadow", m, peer), coll.group, "send_recv", coll.nbytes, -1,
                               start=coll.start, shadow=True)
                shadow.plan = self.net.plan("send_recv", (m, peer), coll.nbytes)
                self._by_cid[shadow.cid] = shadow
                self.net.start(shadow.cid, shadow.plan)

    def _finish_p2p(self, coll: _Coll, t_end: float) -> None:
        self.collectives.append({"id": coll.cid, "name": "send_recv", "group": coll.key[1], "nbytes": coll.nbytes,
                                 "root": -1, "algo": "p2p", "proto": "Simple", "start": coll.start, "end": t_end})
        for side in ("send", "recv"):
            state, sub_idx, sub_op, ready = coll.arrived[side]
            if state is None:
                continue
            state["open"] -= 1
            state["end"] = max(state["end"], t_end)
            if sub_idx != state["item"][0]:
                state["rank"].emit((sub_idx, sub_op, state["item"][2], ready, t_end, coll.cid))
            if state["open"] == 0:
                rs, st = state["rank"], state["stream"]
                idx, op, issue, _ = state["item"]
                st.tail = state["end"]
                st.blocked = False
                rs.emit((idx, op, issue, state["ready"], st.tail, coll.cid))
                self._drain(rs, st)

    # ------------------------------------------------------------------------------------------------ reports
    def _deadlock_report(self) -> str:
        lines = ["the simulated program is stuck: no rank can make progress"]
        for key, coll in sorted(self._colls.items()):
            missing = [r for r in coll.group.simulated if r not in coll.arrived]
            lines.append(f"  {coll.name} #{key[1] + 1} on group {key[0]} ({coll.group.name or 'unnamed'}) waits for "
                         f"rank(s) {missing}")
        for key, entry in sorted(self._p2p.items()):
            have = next(iter(entry))
            lines.append(f"  transfer rank {key[1]} -> rank {key[2]} (group {key[0]}, #{key[3] + 1}): only the {have} "
                         f"was posted")
        for rs in self.ranks.values():
            if rs.waiting is not None and rs.waiting[0] == "queue":
                st = rs.waiting[1]
                last = f"op #{rs.last_op[0]} {rs.last_op[1]!r}" if rs.last_op else "no op"
                lines.append(f"  rank {rs.rank} waits to launch on stream {st.sid}, whose launch queue is full "
                             f"({self.queue_limit} launches) and none of them completes (next: {last})")
            elif rs.waiting is not None:
                last = f"op #{rs.last_op[0]} {rs.last_op[1]!r}" if rs.last_op else "no op"
                lines.append(f"  rank {rs.rank} waits at {rs.waiting[0]} sync (last: {last})")
        return "\n".join(lines)

    def rank_state(self, rank: int) -> _Rank:
        return self.ranks[rank]
