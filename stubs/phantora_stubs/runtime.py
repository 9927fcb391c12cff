"""Where the stubs hand their ops: the `Runtime` interface and `LocalRuntime`, a single-rank in-process runtime.

The stubs never compute time themselves. Every kernel, copy, collective, event and sync they see becomes an
`phantora.engine.ops.Op` given to the rank's runtime:

- `submit(op)` for ops that do not block the host (launches, event records, stream waits, allocations); it advances
  the rank's virtual CPU clock by `op.cpu_delta` (the framework's own CPU time since the previous op) plus, for
  launches, the launch overhead;
- `wait(op)` for ops the host blocks on (SYNC_DEVICE / SYNC_STREAM / SYNC_EVENT, a device-to-host copy, a blocking
  collective such as barrier); it returns the new virtual CPU time.

A `RemoteRuntime` (talking to the engine process, which rendezvouses collectives across ranks) plugs in through
`phantora_stubs.bootstrap.RUNTIME_FACTORIES`.

`LocalRuntime` keeps one timeline per stream: a launch starts at max(CPU time, stream tail) and ends `duration`
later; an event completes when its stream's work so far is done; a stream wait moves the stream tail to the event;
a host sync moves the CPU clock to the tails it waits for. Collectives and point-to-point ops cost 0 s there
(a placeholder: there is no network and no other rank) but still order their streams.
"""

from __future__ import annotations

import abc
import json
import os
from typing import Any

from phantora.engine.ops import Memcpy, Op, OpKind

from phantora.engine.allocator import AllocatorConfig, CachingAllocatorModel
from phantora.live.combine import combine_mirrored

LAUNCH_KINDS = frozenset({OpKind.KERNEL, OpKind.MEMCPY, OpKind.COLLECTIVE, OpKind.SEND, OpKind.RECV})
SYNC_KINDS = frozenset({OpKind.SYNC_DEVICE, OpKind.SYNC_STREAM, OpKind.SYNC_EVENT})


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

    def put_object(self, key: tuple, payload: Any) -> None:
        """Post the objects of a point-to-point object send; key = (gid, src, dst, n), n counting per pair."""

    def take_object(self, key: tuple, sync: Op) -> tuple[bool, Any]:
        """Block on `sync` (the receive's completion), then return the objects posted under `key` as
        (True, objects), or (False, None) where no peer process can post them (a rank simulated alone)."""
        self.wait(sync)
        return False, None

    def close(self) -> None:
        """Flush whatever must outlive the process (called at interpreter exit)."""


class LocalRuntime(Runtime):
    """A single rank, simulated in process: per-stream timelines, 0-cost collectives, the allocator model."""

    def __init__(self, *, capacity_bytes: int, rank: int = 0, world_size: int = 1, local_rank: int = 0,
                 launch_overhead_s: float = 4e-6, record: bool = False, oplog: str | None = None):
        self.rank = rank
        self.world_size = world_size
        self.local_rank = local_rank
        self.launch_overhead_s = launch_overhead_s
        self._allocator = CachingAllocatorModel(capacity_bytes, AllocatorConfig.from_env(os.environ))
        self._cpu = 0.0
        self._tails: dict[int, float] = {}
        self._events: dict[int, float] = {}
        self._sigs: dict[str, int] = {}
        self.groups: dict[int, tuple[list[int], str]] = {}
        self.record = record                                 # keep every op in memory (tests, small runs)
        self.ops: list[Op] = []
        self.op_times: list[tuple[float, float]] = []     # (start, end) of each recorded op on its timeline
        self._oplog = open(oplog, "w") if oplog else None   # noqa: SIM115 - streamed until close()

    # -- interface --------------------------------------------------------------------------------------------
    def advance_cpu(self, seconds: float) -> None:
        if seconds > 0:
            self._cpu += seconds

    def intern_signature(self, key: str) -> int:
        sid = self._sigs.get(key)
        if sid is None:
            sid = self._sigs[key] = len(self._sigs)
        return sid

    def register_group(self, gid: int, ranks: list[int], name: str) -> None:
        known = self.groups.get(gid)
        if known is not None and known[0] != list(ranks):
            raise ValueError(f"process group id {gid} registered twice with different ranks: {known[0]} and {ranks}")
        self.groups[gid] = (list(ranks), name)

    def event_time(self, event_id: int) -> float | None:
        return self._events.get(event_id)

    def group_size(self, gid: int) -> int:
        known = self.groups.get(gid)
        return len(known[0]) if known is not None else self.world_size

    def submit(self, op: Op) -> None:
        if op.kind in SYNC_KINDS:
            self.wait(op)
            return
        self._cpu += max(op.cpu_delta, 0.0)
        start = end = self._cpu
        kind = op.kind
        if kind in LAUNCH_KINDS:
            self._cpu += self.launch_overhead_s
            start, end = self._launch(op)
        elif kind == OpKind.EVENT_RECORD:
            start = end = max(self._cpu, self._tails.get(op.stream, 0.0))
            self._events[op.arg] = end
        elif kind == OpKind.STREAM_WAIT:
            ev = self._events.get(op.arg)
            if ev is not None and ev > self._tails.get(op.stream, 0.0):
                self._tails[op.stream] = ev
            start = end = self._tails.get(op.stream, 0.0)
        self._record(op, start, end)

    def wait(self, op: Op) -> float:
        self._cpu += max(op.cpu_delta, 0.0)
        kind = op.kind
        start = self._cpu
        if kind == OpKind.SYNC_DEVICE:
            self._cpu = max([self._cpu, *self._tails.values()])
        elif kind == OpKind.SYNC_STREAM:
            self._cpu = max(self._cpu, self._tails.get(op.stream, 0.0))
        elif kind == OpKind.SYNC_EVENT:
            self._cpu = max(self._cpu, self._events.get(op.arg, 0.0))
        elif kind in LAUNCH_KINDS:
            self._cpu += self.launch_overhead_s
            start, end = self._launch(op)
            self._cpu = max(self._cpu, end)
        self._record(op, start, self._cpu)
        return self._cpu

    def close(self) -> None:
        if self._oplog is not None:
            self._oplog.close()
            self._oplog = None

    # -- internals -------------------------------------------------------------------------------------------------
    def _launch(self, op: Op) -> tuple[float, float]:
        duration = 0.0 if op.kind in (OpKind.COLLECTIVE, OpKind.SEND, OpKind.RECV) else max(op.duration, 0.0)
        start = max(self._cpu, self._tails.get(op.stream, 0.0))
        end = start + duration
        self._tails[op.stream] = end
        return start, end

    def _record(self, op: Op, start: float, end: float) -> None:
        if self.record:
            self.ops.append(op)
            self.op_times.append((start, end))
        if self._oplog is not None:
            self._oplog.write(json.dumps(op_to_dict(op, start, end)) + "\n")

    def stream_tail(self, stream: int) -> float:
        return self._tails.get(stream, 0.0)


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
