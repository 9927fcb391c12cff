"""`RemoteRuntime`: a rank of a live run, connected to the engine server of `phantora run` (phantora/live/server.py).

Ops are buffered and sent in batches (pickled tuples, see phantora/live/wire.py). The rank only waits for the server
at host syncs (a blocking op: its batch is sent with "wait" and the answer is the rank's new virtual CPU time), when it
asks for an event's time, and when a collective carries real values to combine.

Between syncs the rank keeps its CPU clock itself with exactly the engine's rule (phantora/engine/core.py):
each op adds `cpu_delta × cpu_time_scale`, and every launch (kernel, copy, collective, a send/recv outside a group, a
non-empty group end) adds the host's launch overhead. The server's answer at the next sync is authoritative.
One thing the rank cannot know alone: a launch onto a stream whose launch queue is full (`[host] launch_queue`
launches) waits until the stream's oldest launch completes, which only the engine knows. After a launch that needs a
launch not known complete (the server's last "now" answer says how many of each stream's launches had completed by
then), a clock read first asks the server for the rank's time ("now": the engine's clock once it has issued every op
the rank sent), so a loop that never synchronises reads the times a GPU host would.
"""

from __future__ import annotations

import os
import sys
import threading
from multiprocessing.connection import Client
from typing import Any

from phantora.engine import devmem
from phantora.engine.allocator import AllocatorConfig, CachingAllocatorModel
from phantora.engine.ops import Memcpy, Op, OpKind
from phantora.live import wire

from .clock import METER
from .errors import EngineGone, StubConfigError
from .runtime import SYNC_KINDS, Runtime

_LAUNCH = frozenset({OpKind.KERNEL, OpKind.MEMCPY, OpKind.COLLECTIVE})
FLUSH_OPS = 2048


class RemoteRuntime(Runtime):
    def __init__(self, address: str, authkey: bytes, *, rank: int, world_size: int, local_rank: int,
                 capacity_bytes: int, launch_overhead_s: float, cpu_time_scale: float = 1.0,
                 generated_launch_s: float = 0.0, compiled_call_s: float = 0.0, launch_queue: int = 0):
        self.rank = rank
        self.world_size = world_size
        self.local_rank = local_rank
        self.launch = launch_overhead_s
        self.gen_launch, self.call_cost = generated_launch_s, compiled_call_s     # as the engine's (engine/core.py)
        self.scale = cpu_time_scale
        self._allocator = CachingAllocatorModel(capacity_bytes, AllocatorConfig.from_env(os.environ))
        self._outside = devmem.OutsideMemory(self._allocator, _device_memory())   # as the engine's (engine/devmem.py)
        try:
            self._conn = Client(wire.address_of(address), family="AF_UNIX", authkey=authkey)
        except (OSError, ValueError) as exc:
            raise StubConfigError(f"rank {rank} cannot reach the phantora engine at {address}: {exc}") from None
        self._conn.send(("hello", rank, os.getpid()))
        self._rows: list[tuple] = []
        self._new_sigs: list[tuple[int, str]] = []
        self._sigs: dict[str, int] = {}
        self._cpu = 0.0
        self._threads = threading.local()   # per thread: advance_cpu seconds not yet carried by an op, and
                                            # whether the thread issues ops (see advance_cpu)
        self._in_group = False
        self._group_ops = 0
        self._coll_seq: dict[int, int] = {}
        self._closed = False
        self._queue = launch_queue          # the engine's launch-queue depth (0: no limit)
        self._launches: dict[int, int] = {}  # launches per stream
        self._done: dict[int, int] = {}      # launches per stream known complete by the engine's last "now" answer
        self._unsure = False                # a launch may have waited for a full queue since the last answer
        self._cpu_sent = 0.0                # the clock as of the last op appended (what the engine will have)

    # -- interface ------------------------------------------------------------------------------------------------
    def advance_cpu(self, seconds: float) -> None:
        """Host time a thread spent outside an op (a clock read or a sleep charges it). It moves the rank's CPU
        clock only for the main thread and threads that issue ops (the autograd engine's): a thread that issues
        none (a logger, a data loader, a watchdog) runs beside them on another core and delays nothing. The seconds
        travel with the next op of the same thread, so no thread's time lands on another's op, however the threads
        interleave."""
        if seconds > 0:
            t = self._thread()
            if not t.issues:
                return
            t.pending += seconds
            self._cpu += seconds * self.scale

    def _thread(self):
        t = self._threads
        if not hasattr(t, "pending"):
            t.pending = 0.0
            t.issues = threading.current_thread() is threading.main_thread()
        return t

    def now(self) -> float:
        """The rank's virtual CPU time. After a launch onto a stream that may have been full, the engine's time for
        the ops sent (their launches waited as the engine decided) plus the host time since the last of them. Only a
        thread that issues ops asks (the main thread, the autograd engine's): the connection is theirs, and a thread
        that issues none (a logger, tqdm's monitor) runs beside them and reads the clock as it stands."""
        if self._unsure and self._thread().issues:
            self._send_ops()
            self._send(("now",))
            since = self._cpu - self._cpu_sent
            self._cpu_sent, self._done = self._expect("now")
            self._cpu = self._cpu_sent + since
            self._unsure = False
        return self._cpu

    def intern_signature(self, key: str) -> int:
        sid = self._sigs.get(key)
        if sid is None:
            sid = self._sigs[key] = len(self._sigs)
            self._new_sigs.append((sid, key))
        return sid

    def register_group(self, gid: int, ranks: list[int], name: str) -> None:
        self._send_ops()
        self._send(("group", gid, list(ranks), name))

    def note_device(self, gid: int, device: int) -> None:
        self._send(("device", gid, int(device)))

    def submit(self, op: Op) -> None:
        k = op.kind
        if k in SYNC_KINDS or (k == OpKind.MEMCPY and op.arg == Memcpy.D2H):
            self.wait(op)
            return
        self._append(op)
        if len(self._rows) >= FLUSH_OPS:
            self._send_ops()

    def wait(self, op: Op) -> float:
        k = op.kind
        if not (k in SYNC_KINDS or (k == OpKind.MEMCPY and op.arg == Memcpy.D2H)):
            # a launch the host blocks on: launch it, then wait for its stream
            self._append(op)
            op = Op(OpKind.SYNC_STREAM, stream=op.stream)
        self._append(op)
        rows, sigs = self._take()
        self._send(("wait", rows, sigs))
        self._cpu = self._cpu_sent = self._expect("time")
        self._unsure = False
        return self._cpu

    def event_time(self, event_id: int) -> float | None:
        self._send_ops()
        self._send(("event", int(event_id), False))
        return self._expect("time")

    def event_done(self, event_id: int) -> bool:
        if self._thread().pending:
            self._append(Op(OpKind.CPU))     # the host time so far reaches the engine: the query is at this time
        self._send_ops()
        self._send(("event", int(event_id), True))
        t = self._expect("time")
        return t is None or t <= self.now()

    def exchange(self, gid: int, kind: str, payload: Any, sync: Op) -> Any:
        """Combine real values across the group of the latest collective issued on `gid`; the host blocks on
        `sync` (the collective's completion), as reading the result would make it (see docs/live-runs.md)."""
        seq = self._coll_seq.get(gid, 0) - 1
        self._append(sync)
        rows, sigs = self._take()          # the collective and the sync travel with the values
        self._send(("exchange", rows, sigs, gid, seq, kind, payload))
        self._cpu, value = self._expect("value")
        self._cpu_sent, self._unsure = self._cpu, False
        return value

    def put_object(self, key: tuple, payload: Any) -> None:
        rows, sigs = self._take()
        self._send(("put", rows, sigs, tuple(key), payload))

    def take_object(self, key: tuple, sync: Op) -> tuple[bool, Any]:
        self._append(sync)
        rows, sigs = self._take()
        self._send(("take", rows, sigs, tuple(key)))
        self._cpu, value = self._expect("value")
        self._cpu_sent, self._unsure = self._cpu, False
        return True, value

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self._thread().pending:
                self._append(Op(OpKind.CPU))
            self._send_ops()
            self._send(("bye",))
            self._conn.close()
        except (OSError, EngineGone):
            pass

    # -- internals -------------------------------------------------------------------------------------------------
    def _append(self, op: Op) -> None:
        if METER.costs is not None:
            op.host_py, op.host_c, op.host_disp, op.host_line = METER.take()     # the host work its cpu_delta prices
        t = self._thread()
        t.issues = True
        if t.pending:
            op.cpu_delta += t.pending
            self._cpu += (op.cpu_delta - t.pending) * self.scale
            t.pending = 0.0
        else:
            self._cpu += op.cpu_delta * self.scale
        k = op.kind
        if k in _LAUNCH:
            n = self._launches.get(op.stream, 0)
            self._launches[op.stream] = n + 1
            if self._queue and n - self._queue >= self._done.get(op.stream, 0):
                self._unsure = True          # this launch may wait for the launch a queue before it (engine/core.py)
            self._cpu += self.launch
            if k == OpKind.KERNEL and op.arg > 0:          # generated by Inductor (engine/ops.py)
                self._cpu += self.gen_launch + (op.arg - 1) * self.call_cost
            if k == OpKind.COLLECTIVE:
                self._coll_seq[op.group] = self._coll_seq.get(op.group, 0) + 1
                self._outside.op(op)
        elif k == OpKind.SEND or k == OpKind.RECV:
            self._outside.op(op)
            if self._in_group:
                self._group_ops += 1
            else:
                self._cpu += self.launch
        elif k == OpKind.GROUP_START:
            self._in_group, self._group_ops = True, 0
        elif k == OpKind.GROUP_END:
            if self._group_ops:
                self._cpu += self.launch
            self._in_group, self._group_ops = False, 0
        self._cpu_sent = self._cpu
        self._rows.append(wire.encode(op))

    def _take(self) -> tuple[list, list]:
        rows, sigs = self._rows, self._new_sigs
        self._rows, self._new_sigs = [], []
        return rows, sigs

    def _send_ops(self) -> None:
        if self._rows or self._new_sigs:
            rows, sigs = self._take()
            self._send(("ops", rows, sigs))

    def _send(self, msg: tuple) -> None:
        try:
            self._conn.send(msg)
        except (OSError, ValueError) as exc:
            raise EngineGone(f"rank {self.rank}: the phantora engine is gone ({exc})") from None

    def _expect(self, tag: str) -> Any:
        try:
            msg = self._conn.recv()
        except (EOFError, OSError) as exc:
            raise EngineGone(f"rank {self.rank}: the phantora engine is gone ({exc or 'connection closed'})") from None
        if msg[0] == "error":
            print(f"phantora: {msg[1]}", file=sys.stderr, flush=True)
            os._exit(3)
        if msg[0] != tag:
            raise EngineGone(f"rank {self.rank}: unexpected answer {msg[0]!r} from the engine (wanted {tag!r})")
        return msg[1]


def _device_memory():
    """The cluster's [device_memory] sizes, from the launcher (PHANTORA_DEVICE_MEMORY), else the defaults."""
    from phantora.cluster import DeviceMemorySpec

    raw = os.environ.get("PHANTORA_DEVICE_MEMORY")
    if not raw:
        return DeviceMemorySpec()
    try:
        values = [float(v) for v in raw.split(",")]
        return DeviceMemorySpec(**dict(zip(devmem.FIELDS, values, strict=True)))
    except (ValueError, TypeError):
        raise StubConfigError(f"PHANTORA_DEVICE_MEMORY={raw!r}: expected {len(devmem.FIELDS)} numbers "
                              f"({', '.join(devmem.FIELDS)})") from None


def remote_factory(config, gpu: Any, capacity: int) -> RemoteRuntime:
    key = os.environ.get(wire.AUTHKEY_ENV, "")
    if not key:
        raise StubConfigError(f"PHANTORA_RUNTIME={config.runtime} needs {wire.AUTHKEY_ENV} (set by phantora run)")
    scale = float(os.environ.get("PHANTORA_CPU_TIME_SCALE") or 1.0)
    gen_us, call_us = compiled_host_us()
    return RemoteRuntime(config.runtime, bytes.fromhex(key), rank=config.rank, world_size=config.world_size,
                         local_rank=config.local_rank, capacity_bytes=capacity,
                         launch_overhead_s=config.launch_overhead_s, cpu_time_scale=scale,
                         generated_launch_s=gen_us * 1e-6, compiled_call_s=call_us * 1e-6,
                         launch_queue=launch_queue())


LAUNCH_QUEUE_ENV = "PHANTORA_LAUNCH_QUEUE"
"""`[host] launch_queue` of the cluster (phantora run sets it; the HostSpec default without it)."""


def launch_queue() -> int:
    from phantora.cluster import HostSpec
    text = os.environ.get(LAUNCH_QUEUE_ENV)
    if not text:
        return HostSpec.launch_queue
    try:
        depth = int(text)
    except ValueError:
        depth = -1
    if depth < 0:
        raise StubConfigError(f"{LAUNCH_QUEUE_ENV}={text!r}: expected a non-negative whole number of launches")
    return depth


COMPILED_HOST_ENV = "PHANTORA_COMPILED_HOST_US"
"""`generated_launch_us,compiled_call_us` of the host preset (phantora run sets it; the defaults without it)."""


def compiled_host_us() -> tuple[float, float]:
    from phantora.cluster import HostSpec
    text = os.environ.get(COMPILED_HOST_ENV)
    if not text:
        return HostSpec.generated_launch_us, HostSpec.compiled_call_us
    try:
        gen, call = (float(x) for x in text.split(","))
    except ValueError:
        gen = call = float("nan")
    if not (gen >= 0 and call >= 0):     # NaN fails too
        raise StubConfigError(f"{COMPILED_HOST_ENV}={text!r}: expected two non-negative numbers, "
                              f"'GENERATED_US,CALL_US'")
    return gen, call
