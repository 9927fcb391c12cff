"""The engine server of a live run: rank processes connect to it, their ops feed one `Engine`, and its answers
(virtual times at host syncs, event times, combined real values) go back to the ranks that wait for them.

The server is single-threaded apart from accepting connections. `step()` reads whatever the ranks have sent, feeds the
engine, runs it as far as the input allows (the engine's conservative time management makes the result independent
of the order in which messages arrive), then answers. Every simulated op goes through the recorder into the HDF5
trace, which is flushed whenever an iteration completes, so a run that dies leaves a trace readable up to there.
"""

from __future__ import annotations

import os
import queue
import secrets
import shutil
import socket
import tempfile
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, Listener, wait
from pathlib import Path
from typing import Any

from ..cluster import ClusterSpec
from ..engine.allocator import AllocatorConfig
from ..engine.core import Engine
from ..engine.ops import OpKind
from ..engine.recorder import Recorder
from ..errors import PhantoraError, SimulationError
from ..trace.writer import TraceWriter
from . import wire
from .combine import combine

FLUSH_EVERY_S = 10.0
RUN_DIR_PREFIX = "phantora-run-"
LAUNCHER_PID_FILE = "launcher.pid"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_stale_run_dirs(base: str | None = None) -> list[str]:
    """Remove the temporary folders of runs whose launcher is gone (killed with SIGKILL, or a crashed machine):
    folders `phantora-run-*` of this user whose `launcher.pid` names a process of this host (its name is in the file
    too: a folder shared with another machine or container is left alone) that no longer exists."""
    removed = []
    host = socket.gethostname()
    for entry in Path(base or tempfile.gettempdir()).glob(RUN_DIR_PREFIX + "*"):
        try:
            if entry.stat().st_uid != os.getuid():
                continue
            pid_text, _, its_host = (entry / LAUNCHER_PID_FILE).read_text().strip().partition(" ")
            pid = int(pid_text)
        except (OSError, ValueError):
            continue                    # not ours, or being created right now
        if its_host != host or pid == os.getpid() or _alive(pid):
            continue
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(str(entry))
    return removed


def own_run_dirs(base: str | None = None) -> set[str]:
    """The run folders this process created (its pid in `launcher.pid`)."""
    out = set()
    for entry in Path(base or tempfile.gettempdir()).glob(RUN_DIR_PREFIX + "*"):
        try:
            if int((entry / LAUNCHER_PID_FILE).read_text().split()[0]) == os.getpid():
                out.add(str(entry))
        except (OSError, ValueError):
            continue
    return out


def make_run_dir() -> str:
    """A private temporary folder for one run, holding the launcher's pid so that a later run can tell it is stale."""
    clean_stale_run_dirs()
    path = tempfile.mkdtemp(prefix=RUN_DIR_PREFIX)
    Path(path, LAUNCHER_PID_FILE).write_text(f"{os.getpid()} {socket.gethostname()}\n")
    return path


class LiveRunError(PhantoraError):
    """The simulated program cannot go on (mismatched collectives, a deadlock, a protocol error)."""


@dataclass
class LiveRank:
    rank: int
    conn: Connection | None = None
    pid: int | None = None
    fed: int = 0                                   # ops fed to the engine
    awaiting: int | None = None                    # index of the blocking op the rank waits on
    event_queries: list[tuple[int, bool]] = field(default_factory=list)   # (event id, a completion query)
    exchange: tuple | None = None                  # (gid, seq) the rank waits on
    take: tuple | None = None                      # key of point-to-point objects the rank waits for
    asks_now: bool = False                         # waits for its CPU time once every op it sent is issued
    sync_time: float | None = None                 # its blocking op completed at this time; the value is pending
    value: Any = None
    has_value: bool = False
    sig_map: list[int] = field(default_factory=list)
    colls: dict[int, int] = field(default_factory=dict)   # collectives issued per group
    finished: bool = False                         # said "bye"
    disconnected: bool = False
    last_message: float = 0.0                      # wall time (time.monotonic) of the latest message


class EngineServer:
    """One engine, fed by the ranks' connections."""

    def __init__(self, spec: ClusterSpec, simulated: list[int], rank_map: list[int], *, trace: str | Path | None,
                 meta: dict, launch_overhead_s: float, cpu_time_scale: float = 1.0, vram_bytes: int | None = None,
                 algo: str | None = None, proto: str | None = None, allocator: AllocatorConfig | None = None,
                 overwrite: bool = False):
        self.spec = spec
        self.simulated = list(simulated)
        self.rank_map = list(rank_map)
        self._tmpdir = make_run_dir()
        self.address = "unix://" + os.path.join(self._tmpdir, "engine.sock")
        self.authkey = secrets.token_bytes(16)
        self._keep_trace = trace is not None
        self.trace_path = str(trace) if trace is not None else os.path.join(self._tmpdir, "trace.h5")
        self.writer = TraceWriter(self.trace_path, meta, overwrite=overwrite)
        self.recorder = Recorder(self.writer)
        self.engine = Engine(spec, simulated=self.simulated, rank_map=self.rank_map, sink=self.recorder,
                             on_sync=self._on_sync, launch_overhead_s=launch_overhead_s,
                             cpu_time_scale=cpu_time_scale, vram_bytes=vram_bytes, algo=algo, proto=proto,
                             allocator=allocator)
        self.recorder.attach(self.engine)
        self._sig_ids: dict[str, int] = {}
        self._groups_written: set[int] = set()
        self._write_groups()
        self.ranks: dict[int, LiveRank] = {r: LiveRank(r) for r in self.simulated}
        self._by_conn: dict[Connection, LiveRank] = {}
        self._listener = Listener(wire.address_of(self.address), family="AF_UNIX", authkey=self.authkey)
        self._accepted: queue.Queue = queue.Queue()
        self._accept_thread = threading.Thread(target=self._accept_loop, name="phantora-accept", daemon=True)
        self._accept_thread.start()
        self._replies: list[tuple[LiveRank, tuple]] = []
        self._exchanges: dict[tuple[int, int], dict[int, tuple[str, Any]]] = {}
        self._puts: dict[tuple, Any] = {}
        self._devices: dict[int, dict[int, int]] = {}     # group -> rank -> CUDA device of its NCCL communicator
        self._marks = 0
        self.wall_marks: list[float] = []
        self._last_flush = time.monotonic()
        self.messages = 0

    # ------------------------------------------------------------------------------------------------ connections
    def _accept_loop(self) -> None:
        while True:
            try:
                conn = self._listener.accept()
            except (OSError, EOFError):
                return
            except Exception:  # noqa: BLE001 - a bad handshake (wrong key) must not stop the server
                continue
            self._accepted.put(conn)

    def _take_accepted(self) -> None:
        while True:
            try:
                conn = self._accepted.get_nowait()
            except queue.Empty:
                return
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                conn.close()
                continue
            if not (isinstance(msg, tuple) and msg and msg[0] == "hello" and msg[1] in self.ranks):
                conn.close()
                continue
            lr = self.ranks[msg[1]]
            if lr.conn is not None:
                conn.close()
                raise LiveRunError(f"rank {msg[1]} connected twice")
            lr.conn, lr.pid, lr.last_message = conn, msg[2], time.monotonic()
            self._by_conn[conn] = lr

    @property
    def connected(self) -> int:
        return sum(1 for lr in self.ranks.values() if lr.conn is not None)

    @property
    def all_finished(self) -> bool:
        return all(lr.finished for lr in self.ranks.values())

    # ------------------------------------------------------------------------------------------------ main step
    def step(self, timeout: float = 0.05) -> None:
        """Read what has arrived (waiting up to `timeout` s), simulate, answer."""
        self._take_accepted()
        conns = [lr.conn for lr in self.ranks.values() if lr.conn is not None and not lr.disconnected]
        if not conns:
            time.sleep(timeout)
            return
        changed = False
        for conn in wait(conns, timeout):
            lr = self._by_conn[conn]
            try:
                while True:
                    self._handle(lr, conn.recv())
                    changed = True
                    if not conn.poll():
                        break
            except (EOFError, OSError):
                lr.disconnected = True
                if not lr.finished:
                    # the process died mid-run: nothing more will come from it
                    changed = True
        if changed:
            self._simulate()

    def _handle(self, lr: LiveRank, msg: tuple) -> None:
        self.messages += 1
        lr.last_message = time.monotonic()
        tag = msg[0]
        if tag == "ops" or tag == "wait":
            self._feed(lr, msg[1], msg[2])
            if tag == "wait":
                lr.awaiting = lr.fed - 1
        elif tag == "group":
            _, gid, ranks, name = msg
            try:
                self.engine.add_group(gid, ranks, name)
            except SimulationError as exc:
                raise LiveRunError(str(exc)) from None
            self._write_groups()
        elif tag == "device":
            self._check_device(lr.rank, msg[1], msg[2])
        elif tag == "now":
            lr.asks_now = True
        elif tag == "event":
            lr.event_queries.append((msg[1], bool(msg[2]) if len(msg) > 2 else False))
        elif tag == "exchange":
            _, rows, sigs, gid, seq, kind, payload = msg
            self._feed(lr, rows, sigs)
            lr.awaiting = lr.fed - 1             # the last row: the host waits for the collective's completion
            self._exchanges.setdefault((gid, seq), {})[lr.rank] = (kind, payload)
            lr.exchange = (gid, seq)
        elif tag == "put":
            _, rows, sigs, key, payload = msg
            self._feed(lr, rows, sigs)
            if key[2] in self.ranks:             # a mirrored receiver never takes (its takes are its representative's)
                self._puts[tuple(key)] = payload
        elif tag == "take":
            _, rows, sigs, key = msg
            self._feed(lr, rows, sigs)
            lr.awaiting = lr.fed - 1
            lr.take = tuple(key)
        elif tag == "bye":
            lr.finished = True
            self.engine.close(lr.rank)
        else:
            raise LiveRunError(f"rank {lr.rank} sent an unknown message {tag!r}")

    def _check_device(self, rank: int, gid: int, device: int) -> None:
        """NCCL's communicator init (ncclCommInitRank, init.cc) refuses two ranks of one host on one GPU with
        ncclInvalidUsage, "Duplicate GPU detected : rank A and rank B both on CUDA device ...", which PyTorch raises
        as DistBackendError at the group's first collective. Ranks of the run's processes only: a mirrored rank
        reports the device of the rank it mirrors."""
        seen = self._devices.setdefault(gid, {})
        seen[rank] = device
        node = self.spec.node_of(rank)
        for other, dev in seen.items():
            if other != rank and dev == device and self.spec.node_of(other) == node:
                g = self.engine.groups.get(gid)
                name = f" ({g.name})" if g is not None and g.name else ""
                raise LiveRunError(
                    f"ranks {other} and {rank} of node {node} both run their NCCL collectives on group {gid}{name} "
                    f"on CUDA device {device}: NCCL refuses the communicator (DistBackendError, ncclInvalidUsage: "
                    f"\"Duplicate GPU detected : rank {rank} and rank {other} both on CUDA device {device}\"). "
                    f"Each process of a node needs its own GPU: call torch.cuda.set_device(int(os.environ"
                    f"[\"LOCAL_RANK\"])) before the first collective, or pass device_id to init_process_group")

    def _feed(self, lr: LiveRank, rows: list, sigs: list) -> None:
        sig_map = lr.sig_map
        for local, key in sigs:
            if local != len(sig_map):
                raise LiveRunError(f"rank {lr.rank}: signature ids out of order ({local} after {len(sig_map)})")
            sig_map.append(self._global_sig(key))
        ops = []
        colls = lr.colls
        for row in rows:
            op = wire.decode(row)
            if op.sig >= 0:
                op.sig = sig_map[op.sig]
            if op.kind == OpKind.COLLECTIVE:
                colls[op.group] = colls.get(op.group, 0) + 1
            ops.append(op)
        lr.fed += len(ops)
        self.engine.feed(lr.rank, ops)

    def _global_sig(self, key: str) -> int:
        sid = self._sig_ids.get(key)
        if sid is None:
            sid = self._sig_ids[key] = self.writer.add_signature(key)
        return sid

    def _write_groups(self) -> None:
        for gid, g in self.engine.groups.items():
            if gid not in self._groups_written:
                self.writer.add_group(gid, g.ranks, g.name)
                self._groups_written.add(gid)

    # ------------------------------------------------------------------------------------------------ simulation
    def _on_sync(self, rank: int, index: int, t: float) -> None:
        lr = self.ranks.get(rank)
        if lr is not None and lr.awaiting == index:
            lr.awaiting = None
            if lr.exchange is not None or lr.take is not None or lr.has_value:
                lr.sync_time = t                 # answered with the value (_deliver_values)
            else:
                self._replies.append((lr, ("time", t)))

    def _simulate(self) -> None:
        try:
            self.engine.run()
        except SimulationError as exc:
            raise LiveRunError(str(exc)) from None
        self._answer_events()
        self._answer_now()
        self._answer_exchanges()
        self._answer_takes()
        self._deliver_values()
        replies, self._replies = self._replies, []
        for lr, msg in replies:
            self._send(lr, msg)
        self._check_progress()
        marks = sum(len(rs.iterations) for rs in self.engine.ranks.values())
        now = time.monotonic()
        done = min((len(rs.iterations) for rs in self.engine.ranks.values()), default=0)
        while len(self.wall_marks) < done:
            self.wall_marks.append(now)        # wall time at which every rank had reached this iteration mark
        if marks != self._marks or now - self._last_flush > FLUSH_EVERY_S:
            self._marks = marks
            self._last_flush = now
            self.recorder.flush()

    def _send(self, lr: LiveRank, msg: tuple) -> None:
        if lr.conn is None or lr.disconnected:
            return
        try:
            lr.conn.send(msg)
        except OSError:
            lr.disconnected = True

    def _answer_events(self) -> None:
        """An event's time (None: never recorded). A completion query (`Event.query()`) is answered at the rank's
        CPU time T in virtual time, never by how far the other ranks' processes have got: with the event's time once
        known, or with +inf (not complete by T) once the simulation is settled past T (`Engine.horizon`); until
        then it stays pending, so the same program always gets the same answers."""
        for lr in self.ranks.values():
            if not lr.event_queries:
                continue
            rs = self.engine.ranks[lr.rank]
            pending = []
            for eid, query in lr.event_queries:
                ev = rs.events.get(eid)
                if ev is None or ev.time is not None or not query:
                    self._replies.append((lr, ("time", ev.time if ev is not None else None)))
                elif self.engine.horizon() >= rs.cpu:
                    self._replies.append((lr, ("time", float("inf"))))
                else:
                    pending.append((eid, query))
            lr.event_queries = pending

    def _answer_now(self) -> None:
        """A rank's CPU time once the engine has issued every op it sent: its launches onto full streams waited
        there (Engine._run_rank), which the rank cannot know alone (stubs/phantora_stubs/remote.py)."""
        for lr in self.ranks.values():
            if lr.asks_now:
                rs = self.engine.ranks[lr.rank]
                if rs.waiting is None and not rs.queue:
                    lr.asks_now = False
                    # with how many launches of each stream are known complete by then: a later launch that only
                    # needs one of those cannot wait, and the rank need not ask again for it
                    done = {sid: st.completed_by(rs.cpu) for sid, st in rs.streams.items()}
                    self._replies.append((lr, ("now", (rs.cpu, done))))

    def _answer_exchanges(self) -> None:
        for key in list(self._exchanges):
            gid, seq = key
            got = self._exchanges[key]
            g = self.engine.groups.get(gid)
            if g is None:
                continue
            pending = [r for r in g.simulated if r not in got and not self.ranks[r].finished
                       and not self.ranks[r].disconnected and self.ranks[r].colls.get(gid, 0) <= seq]
            if pending:
                continue
            del self._exchanges[key]
            kinds = {k for k, _ in got.values()}
            if len(kinds) != 1:
                raise LiveRunError(f"collective #{seq + 1} on group {gid} ({g.name}): ranks combine values "
                                   f"differently ({', '.join(sorted(kinds))})")
            kind = kinds.pop()
            payloads = []
            for member in g.ranks:
                # a member that sent nothing had no known value; a mirrored member has its representative's
                src = member if member in self.ranks else self.rank_map[member]
                payloads.append(got[src][1] if src in got else None)
            try:
                result = combine(kind, payloads)
            except Exception as exc:  # noqa: BLE001 - values of another shape: report, do not crash the server
                raise LiveRunError(f"collective #{seq + 1} on group {gid} ({g.name}): cannot combine the ranks' "
                                   f"values ({exc})") from None
            for r in got:
                lr = self.ranks[r]
                lr.exchange, lr.value, lr.has_value = None, result, True

    def _answer_takes(self) -> None:
        for lr in self.ranks.values():
            if lr.take is None:
                continue
            gid, src, dst, n = lr.take
            key = lr.take
            if src not in self.ranks and isinstance(n, tuple) and n[:1] == ("all_to_all",):
                # a chunk of an all-to-all of unequal sizes from a mirrored member: which peer's chunk of its
                # representative it stands for is not known; unknown (exchange.all_to_all_uneven)
                lr.take, lr.value, lr.has_value = None, None, True
                continue
            if src not in self.ranks:
                # the sender is mirrored: take what its representative sent to the rank at the same offset; where
                # that rank is not simulated either, its representative's put was never kept: unknown
                rep = self.rank_map[src]
                key = (gid, rep, dst - (src - rep), n)
                if key[2] not in self.ranks:
                    lr.take, lr.value, lr.has_value = None, None, True
                    continue
            if key in self._puts:
                lr.take, lr.value, lr.has_value = None, self._puts.pop(key), True

    def _deliver_values(self) -> None:
        for lr in self.ranks.values():
            if lr.has_value and lr.sync_time is not None:
                self._replies.append((lr, ("value", (lr.sync_time, lr.value))))
                lr.has_value, lr.value, lr.sync_time = False, None, None

    def _check_progress(self) -> None:
        """Every rank still running waits on the engine and the engine can do nothing more: a deadlock."""
        live = [lr for lr in self.ranks.values() if not lr.finished and not lr.disconnected]
        if not live or self.connected < len(self.ranks):
            return
        if all(lr.awaiting is not None or lr.exchange is not None or lr.take is not None or lr.has_value
               or lr.asks_now for lr in live):
            raise LiveRunError(self.stuck_report())

    def stuck_report(self) -> str:
        report = getattr(self.engine, "_deadlock_report", None)
        text = report() if report else "the simulated program is stuck"
        for r, rs in sorted(self.engine.ranks.items()):
            for sid, st in sorted(getattr(rs, "streams", {}).items()):
                if st.blocked or st.pending:
                    head = st.pending[0][1] if st.pending else None
                    text += f"\n  rank {r} stream {sid}: {'blocked' if st.blocked else 'waiting'}" + \
                            (f", {len(st.pending)} queued (next: {head!r})" if head is not None else "")
            # stream waits on events whose record is queued: which stream waits for which
            for sid, st in sorted(rs.streams.items()):
                for item in st.pending:
                    ev = item[3]
                    if item[1].kind == OpKind.EVENT_RECORD and ev is not None:
                        for _, wst, witem in getattr(ev, "waiters", ()):
                            text += f"\n  rank {r} stream {wst.sid} waits for event {item[1].arg}, " \
                                    f"recorded on stream {sid} behind {len(st.pending)} queued op(s)"
        for lr in self.ranks.values():
            if lr.take is not None:
                n = lr.take[3]
                if isinstance(n, tuple) and n[0] == "all_to_all":
                    what = f"its chunk of all-to-all #{n[1] + 1} of unequal sizes on group {lr.take[0]}"
                elif isinstance(n, tuple):
                    what = f"the values of its receive #{n[1] + 1} of small tensors"
                else:
                    what = f"objects (recv_object_list #{n + 1})"
                text += f"\n  rank {lr.rank} waits for {what} from rank {lr.take[1]}"
            elif lr.exchange is not None:
                text += f"\n  rank {lr.rank} waits for the values of collective #{lr.exchange[1] + 1} on group " \
                        f"{lr.exchange[0]}"
            elif lr.finished:
                text += f"\n  rank {lr.rank} has left its program (at its end, or on an error)"
        return text

    def last_op(self, rank: int) -> str:
        rs = self.engine.ranks.get(rank)
        if rs is None or rs.last_op is None:
            return "no op yet"
        idx, op = rs.last_op
        return f"op #{idx}: {op.describe()}"

    # ------------------------------------------------------------------------------------------------ end
    def finish(self, error: str | None = None) -> None:
        """Run the engine to the end of what it has, flush and close the trace (with `error` when the run failed)."""
        if error is None:
            try:
                self.engine.run()
            except SimulationError as exc:
                error = str(exc)
        try:
            self.recorder.flush()
        except Exception:  # noqa: BLE001 - keep what was flushed before
            pass
        done = all(rs.closed and not rs.queue and rs.waiting is None for rs in self.engine.ranks.values())
        missing = self.recorder.missing()      # ops simulated without a row: the trace is cut short
        if missing and error is None:
            error = "the trace holds fewer ops than were simulated: " + ", ".join(
                f"rank {r}: {n} op(s) without a row" for r, n in sorted(missing.items()))
        self.writer.update_meta({"complete_simulation": bool(done and error is None and not missing)})
        try:
            self.writer.close(error=error)   # a TraceError here names where the trace was kept
        finally:
            self.trace_path = self.writer.written_path
            self.close()

    def close(self) -> None:
        for lr in self.ranks.values():
            if lr.conn is not None:
                try:
                    lr.conn.close()
                except OSError:
                    pass
        try:
            self._listener.close()
        except OSError:
            pass

    def abandon(self) -> None:
        """End a run that never started (its program could not be started): keep no trace, remove the folder."""
        discard = getattr(self.writer, "discard", None)
        try:
            if discard is not None:
                discard()                       # the destination is left as it was
            else:
                self.writer.close(error="the program could not be started")
                Path(self.trace_path).unlink(missing_ok=True)
        finally:
            self.close()
            shutil.rmtree(self._tmpdir, ignore_errors=True)

    def stack_file(self, rank: int) -> str:
        """Where rank `rank` writes its Python stacks when the launcher asks (the failure reports)."""
        return os.path.join(self._tmpdir, f"stack-{rank}.json")

    @property
    def run_dir(self) -> str:
        return self._tmpdir

    def discard_trace(self, keep: bool | None = None) -> None:
        """Remove the run's temporary folder (socket, stack files, the trace of a --no-trace run), and the trace
        unless it is kept (`keep`, default: a trace path was given)."""
        if not (self._keep_trace if keep is None else keep):
            Path(self.trace_path).unlink(missing_ok=True)
        shutil.rmtree(self._tmpdir, ignore_errors=True)
