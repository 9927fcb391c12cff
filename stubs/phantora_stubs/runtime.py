"""Where the stubs hand their ops: the `Runtime` interface and `LocalRuntime`, a rank simulated in process.

The stubs never compute time themselves. Every kernel, copy, collective, event and sync they see becomes an
`phantora.engine.ops.Op` given to the rank's runtime:

- `submit(op)` for ops that do not block the host (launches, event records, stream waits, allocations); it advances
  the rank's virtual CPU clock by `op.cpu_delta` (the framework's own CPU time since the previous op) plus, for
  launches, the launch overhead;
- `wait(op)` for ops the host blocks on (SYNC_DEVICE / SYNC_STREAM / SYNC_EVENT, a device-to-host copy, a blocking
  collective such as barrier); it returns the new virtual CPU time.

A `RemoteRuntime` (talking to the engine process, which rendezvouses collectives across ranks) plugs in through
`phantora_stubs.bootstrap.RUNTIME_FACTORIES`.

`LocalRuntime` runs the one simulation engine (phantora/engine/core.py, the engine `phantora run` feeds) in the
rank's own process, with this rank as its only simulated rank: every other rank of the world mirrors it, as under
`phantora run --ranks auto` with one pipeline stage. Streams, events, host syncs and the CPU clock follow the engine's
rules; a collective starts when this rank reaches it (its peers, mirrors, reach it at the same moment) and takes the
network model's time on the cluster (`local_cluster`: a world of one GPU unless the configuration says otherwise,
where a lone rank's collectives take no time).
"""

from __future__ import annotations

import abc
import json
import os
import threading
from typing import TYPE_CHECKING, Any

from phantora.engine.allocator import AllocatorConfig, CachingAllocatorModel
from phantora.engine.ops import Memcpy, Op, OpKind
from phantora.errors import SimulationError
from phantora.live.combine import combine_mirrored

from .config import DEFAULT_CLUSTER
from .errors import StubConfigError

if TYPE_CHECKING:
    from phantora.cluster import ClusterSpec

SYNC_KINDS = frozenset({OpKind.SYNC_DEVICE, OpKind.SYNC_STREAM, OpKind.SYNC_EVENT})
FLUSH_OPS = 2048
"""`LocalRuntime` hands the engine its ops in batches of at most this many (and whenever a time is asked for)."""


class Runtime(abc.ABC):
    """What a rank's stubs talk to. One instance per rank process."""

    rank: int
    world_size: int
    local_rank: int

    _allocator: CachingAllocatorModel
    _cpu: float

    @property
    def allocator(self) -> CachingAllocatorModel:
        """The rank's device-memory model: alloc(nbytes, block_id) / free(block_id) / stats."""
        return self._allocator

    def now(self) -> float:
        """The rank's virtual CPU time, seconds."""
        return self._cpu

    @abc.abstractmethod
    def advance_cpu(self, seconds: float) -> None:
        """Advance the virtual CPU clock (framework CPU time between ops, time.sleep)."""

    @abc.abstractmethod
    def submit(self, op: Op) -> None:
        """Hand over a non-blocking op (see the module docstring)."""

    @abc.abstractmethod
    def wait(self, op: Op) -> float:
        """Hand over a blocking op and return the virtual CPU time once the host may continue."""

    @abc.abstractmethod
    def intern_signature(self, key: str) -> int:
        """A run-wide integer id for a kernel signature key (`Signature.key()`)."""

    @abc.abstractmethod
    def register_group(self, gid: int, ranks: list[int], name: str) -> None:
        """Announce a process group: its id (identical on every rank), global ranks in group order, and name."""

    @abc.abstractmethod
    def event_time(self, event_id: int) -> float | None:
        """Virtual GPU time at which a recorded event completes (None if it was never recorded).

        Only meaningful once the host has synchronised past the event, as with cudaEventElapsedTime.
        """

    def event_done(self, event_id: int) -> bool:
        """`Event.query()`: whether a recorded event has completed by the rank's current virtual time (True for an
        event never recorded), answered in virtual time alone."""
        t = self.event_time(event_id)
        return t is None or t <= self.now()

    def exchange(self, gid: int, kind: str, payload: Any, sync: Op) -> Any:
        """Combine the real values of the latest collective issued on group `gid` across its members, the host
        blocking on `sync` (a SYNC_EVENT on the collective's completion) as reading the result would make it.

        `kind` and the payloads are those of `phantora.live.combine`. This base version serves a single process
        standing for every member of the group (each mirrors it).
        """
        self.wait(sync)
        return combine_mirrored(kind, payload, self.group_size(gid))

    def group_size(self, gid: int) -> int:
        return self.world_size

    def note_device(self, gid: int, device: int) -> None:
        """This rank's first NCCL collective on group `gid` runs on CUDA device `device`. A live run's server
        refuses two ranks of one node on the same device (NCCL's "Duplicate GPU detected"); a rank simulated alone
        has no peers to compare with."""

    def put_object(self, key: tuple, payload: Any) -> None:
        """Post the objects of a point-to-point object send; key = (gid, src, dst, n), n counting per pair."""

    def take_object(self, key: tuple, sync: Op) -> tuple[bool, Any]:
        """Block on `sync` (the receive's completion), then return the objects posted under `key` as
        (True, objects), or (False, None) where no peer process can post them (a rank simulated alone)."""
        self.wait(sync)
        return False, None

    def close(self) -> None:
        """Flush whatever must outlive the process (called at interpreter exit)."""


def local_cluster(world_size: int = 1, local_devices: int = 8, gpu: str | None = None,
                  name: str = DEFAULT_CLUSTER) -> ClusterSpec:
    """The cluster a rank run by hand lives in: preset `name` (or a TOML path) with `world_size` GPUs on hosts of
    `local_devices` GPUs (one host when the world is smaller), of the GPU preset `gpu` (default: the preset's)."""
    if world_size < 1 or local_devices < 1:
        raise StubConfigError(f"a world of {world_size} GPU(s) on hosts of {local_devices} is not a cluster")
    per_host = min(local_devices, world_size)
    if world_size % per_host:
        raise StubConfigError(f"PHANTORA_WORLD_SIZE={world_size} is not a whole number of hosts of "
                              f"PHANTORA_LOCAL_DEVICES={local_devices} GPUs")
    from phantora.cluster import load_cluster     # here: a rank of `phantora run` never needs it

    return load_cluster(name, nodes=world_size // per_host, gpus_per_node=per_host, gpu=gpu)


class _ProgramOrderLog:
    """The engine's sink for the one simulated rank. The engine reports an op once its times are known, not in program
    order (work queued behind a collective waits for it); the reports are held until every earlier op is reported,
    then written in program order: one JSON line per op to `path`, and with `record` kept in `ops` / `op_times`."""

    def __init__(self, record: bool, path: str | None):
        self.record = record
        self.ops: list[Op] = []
        self.op_times: list[tuple[float, float]] = []
        self._out = open(path, "w") if path else None   # noqa: SIM115 - streamed until close()
        self._held: dict[int, tuple] = {}
        self._next = 0

    def emitter(self, rank: int):
        if not self.record and self._out is None:
            return _discard                              # nobody reads the times: keep nothing
        return self._hold

    def _hold(self, record: tuple) -> None:
        self._held[record[0]] = record

    def flush(self) -> None:
        held, i = self._held, self._next
        while i in held:
            _, op, _issue, start, end, _coll = held.pop(i)
            if self.record:
                self.ops.append(op)
                self.op_times.append((start, end))
            if self._out is not None:
                self._out.write(json.dumps(op_to_dict(op, start, end)) + "\n")
            i += 1
        self._next = i

    def close(self) -> None:
        if self._out is not None:
            self._out.close()
            self._out = None


def _discard(record: tuple) -> None:
    pass


class LocalRuntime(Runtime):
    """One rank simulated in process by the engine; the other ranks of its world mirror it (see the module
    docstring). Ops are handed to the engine in batches, and the engine runs as far as it can whenever the rank asks
    for a time (`now`, `wait`, `event_time`), exactly as the engine server runs it for `phantora run`."""

    def __init__(self, *, capacity_bytes: int, rank: int = 0, world_size: int = 1, local_rank: int = 0,
                 launch_overhead_s: float = 4e-6, cpu_time_scale: float = 1.0, cluster: ClusterSpec | None = None,
                 record: bool = False, oplog: str | None = None):
        from phantora.engine.core import Engine     # here: the network model's imports are for local runs only

        self.rank = rank
        self.world_size = world_size
        self.local_rank = local_rank
        self.launch_overhead_s = launch_overhead_s
        self.cpu_time_scale = cpu_time_scale
        allocator = AllocatorConfig.from_env(os.environ)
        self._allocator = CachingAllocatorModel(capacity_bytes, allocator)
        self.cluster = cluster if cluster is not None else local_cluster(world_size)
        if self.cluster.world_size != world_size:
            raise StubConfigError(f"cluster {self.cluster.name} has {self.cluster.world_size} GPUs for a world of "
                                  f"{world_size}")
        self._log = _ProgramOrderLog(record, oplog)
        # the engine server's construction (phantora/live/server.py), with this rank simulated and the others
        # mirroring it
        self.engine = Engine(self.cluster, simulated=[rank], rank_map=[rank] * world_size, sink=self._log,
                             launch_overhead_s=launch_overhead_s, cpu_time_scale=cpu_time_scale,
                             vram_bytes=capacity_bytes, allocator=allocator)
        self._state = self.engine.ranks[rank]
        self._queue: list[Op] = []          # ops not handed to the engine yet
        self._pending = 0.0                 # advance_cpu seconds no op carries yet
        self._sigs: dict[str, int] = {}
        self._lock = threading.RLock()      # ops may come from other threads (autograd, garbage collection)
        self._running = False               # the engine is running: an op arriving now (a FREE from a garbage
                                            # collection the engine triggered) only joins the queue
        self._closed = False

    # -- interface --------------------------------------------------------------------------------------------
    def now(self) -> float:
        self._settle()
        return self._state.cpu + self._pending * self.cpu_time_scale

    def advance_cpu(self, seconds: float) -> None:
        """Host time outside any op (a clock read or a sleep charges it): it travels with the next op as part of its
        `cpu_delta`, as RemoteRuntime sends it."""
        if seconds > 0:
            with self._lock:
                self._pending += seconds

    def intern_signature(self, key: str) -> int:
        sid = self._sigs.get(key)
        if sid is None:
            sid = self._sigs[key] = len(self._sigs)
        return sid

    def register_group(self, gid: int, ranks: list[int], name: str) -> None:
        """The engine's `add_group` (a SimulationError for a group id reused with other ranks, or a rank outside the
        world), after the ops issued before the group was made."""
        with self._lock:
            self._settle()
            self.engine.add_group(gid, list(ranks), name)

    def event_time(self, event_id: int) -> float | None:
        self._settle()
        ev = self._state.events.get(event_id)
        return ev.time if ev is not None else None

    def group_size(self, gid: int) -> int:
        g = self.engine.groups.get(gid)
        return len(g.ranks) if g is not None else self.world_size

    def submit(self, op: Op) -> None:
        k = op.kind
        if k in SYNC_KINDS or (k == OpKind.MEMCPY and op.arg == Memcpy.D2H):
            self.wait(op)
            return
        with self._lock:
            self._append(op)
            if len(self._queue) >= FLUSH_OPS:
                self._settle()

    def wait(self, op: Op) -> float:
        with self._lock:
            k = op.kind
            if not (k in SYNC_KINDS or (k == OpKind.MEMCPY and op.arg == Memcpy.D2H)):
                # a launch the host blocks on: launch it, then wait for its stream (as RemoteRuntime does)
                self._append(op)
                op = Op(OpKind.SYNC_STREAM, stream=op.stream)
            self._append(op)
            return self.now()

    def close(self) -> None:
        """End the rank: the engine finishes what was issued, and the op log is complete."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                if self._pending:
                    self._append(Op(OpKind.CPU))
                self._settle(final=True)
            finally:
                self._log.close()

    # -- what the rank has simulated ---------------------------------------------------------------------------
    @property
    def ops(self) -> list[Op]:
        """With `record`: every op whose times are known and all of whose predecessors' are, in program order."""
        self._settle()
        return self._log.ops

    @property
    def op_times(self) -> list[tuple[float, float]]:
        """(start, end) of each op of `ops`, as the engine reported it."""
        self._settle()
        return self._log.op_times

    def stream_tail(self, stream: int) -> float:
        """When the stream's work issued so far ends (0 for a stream never used)."""
        self._settle()
        st = self._state.streams.get(stream)
        return st.tail if st is not None else 0.0

    # -- internals -------------------------------------------------------------------------------------------------
    def _append(self, op: Op) -> None:
        if self._pending:
            op.cpu_delta += self._pending
            self._pending = 0.0
        self._queue.append(op)

    def _settle(self, final: bool = False) -> None:
        """Hand the queued ops to the engine and run it as far as they allow. The rank is the only one simulated, so
        a host sync the engine cannot complete then never completes: a deadlock."""
        with self._lock:
            if self._running:
                return
            self._running = True
            try:
                while self._queue:
                    batch, self._queue = self._queue, []
                    self.engine.feed(self.rank, batch)
                    self.engine.run()
                if final:
                    self.engine.close(self.rank)
                    self.engine.run()
                if self._state.waiting is not None:
                    raise SimulationError(self.engine._deadlock_report())
            finally:
                self._running = False
            self._log.flush()


def op_to_dict(op: Op, start: float | None = None, end: float | None = None) -> dict[str, Any]:
    """A JSON-friendly view of an op (kind as its name)."""
    d: dict[str, Any] = {k: getattr(op, k) for k in Op.__slots__}
    d["kind"] = OpKind(op.kind).name
    if op.kind == OpKind.MEMCPY and op.arg >= 0:
        d["direction"] = Memcpy(op.arg).name
    if start is not None:
        d["start"] = start
        d["end"] = end
    return d
