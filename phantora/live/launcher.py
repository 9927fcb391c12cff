"""`phantora run`: start the engine server, one process per simulated rank (with the environment torchrun gives),
relay their output prefixed by rank, watch them, and end with a summary and a closed trace.

Failures stop the run: a rank that raises or exits without finishing, a rank that stays silent for `hang_timeout_s`
seconds while other ranks wait on the simulation, collectives that do not match across a group, or a deadlock.
The others are then stopped, the report names the rank, its last op and the end of its error output, and the trace is
closed readable (marked incomplete, with the error in its metadata).
"""

from __future__ import annotations

import collections
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Callable

from ..cluster import ClusterSpec
from ..engine.allocator import AllocatorConfig
from ..errors import PhantoraError
from ..paths import project_root
from ..simulate import run_meta
from . import wire
from .ranks import RankPlan
from .server import EngineServer, LiveRunError
from .summary import RunSummary, summarize_run

TAIL_LINES = 40


class RunFailed(PhantoraError):
    """The live run stopped on a failure; `summary` holds what was simulated until then."""

    def __init__(self, message: str, summary: RunSummary | None = None, oom: bool = False):
        super().__init__(message)
        self.summary = summary
        self.oom = oom


@dataclass
class RunOptions:
    program: list[str]                          # the user's command (after `--`)
    spec: ClusterSpec
    plan: RankPlan
    trace: str | None = None
    tokens_per_iteration: float | None = None
    flops_per_token: float | None = None
    hang_timeout_s: float = 300.0
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    algo: str | None = None
    proto: str | None = None
    quiet_ranks: bool = False                   # do not relay the ranks' output (tests, benchmarks)
    out: IO[str] = field(default_factory=lambda: sys.stdout)
    err: IO[str] = field(default_factory=lambda: sys.stderr)


def program_argv(program: list[str]) -> list[str]:
    """The command a rank runs: `python ...`, `-m module ...` and `script.py ...` use this interpreter."""
    if not program:
        raise PhantoraError("no program to run: give it after `--`, e.g. phantora run -- python train.py")
    first = program[0]
    if first in ("python", "python3", f"python{sys.version_info.major}.{sys.version_info.minor}"):
        return [sys.executable, *program[1:]]
    if first == "-m" or first.endswith(".py"):
        return [sys.executable, *program]
    return list(program)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_environment(opts: RunOptions, server: EngineServer, rank: int, port: int, epoch: float) -> dict[str, str]:
    spec = opts.spec
    gpn = spec.gpus_per_node
    root = project_root()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PHANTORA_") or k in ("PHANTORA_FAKE_CUDA",
                                                                                          "PHANTORA_HOME")}
    path = [str(root / "stubs"), str(root)]
    if env.get("PYTHONPATH"):
        path.append(env["PYTHONPATH"])
    env.update({
        "PYTHONPATH": os.pathsep.join(path),
        "PYTHONUNBUFFERED": "1",
        "PHANTORA_RANK": str(rank), "PHANTORA_WORLD_SIZE": str(spec.world_size),
        "PHANTORA_LOCAL_RANK": str(rank % gpn), "PHANTORA_LOCAL_DEVICES": str(gpn),
        "PHANTORA_GPU": spec.gpu, "PHANTORA_VRAM_BYTES": str(spec.vram_bytes()),
        "PHANTORA_RUNTIME": server.address, wire.AUTHKEY_ENV: server.authkey.hex(),
        "PHANTORA_LAUNCH_OVERHEAD_US": repr(spec.host.launch_overhead_us),
        "PHANTORA_CPU_TIME_SCALE": repr(spec.host.cpu_time_scale),
        "PHANTORA_EPOCH": repr(epoch),
        "PHANTORA_TORCH_CUDA": spec.software.torch_cuda, "PHANTORA_SDPA": ",".join(spec.software.sdpa),
        # what torchrun sets
        "RANK": str(rank), "WORLD_SIZE": str(spec.world_size), "LOCAL_RANK": str(rank % gpn),
        "LOCAL_WORLD_SIZE": str(min(gpn, spec.world_size)), "GROUP_RANK": str(rank // gpn),
        "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": str(spec.world_size), "ROLE_NAME": "default",
        "GROUP_WORLD_SIZE": str(spec.nodes), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
        "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_RUN_ID": "phantora",
        "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "1"),
    })
    env.update(opts.env)
    return env


class _Relay(threading.Thread):
    """Copies one pipe of a rank to our stream, each line prefixed, keeping the last lines."""

    def __init__(self, rank: int, pipe: IO[bytes], sink: IO[str], lock: threading.Lock, quiet: bool):
        super().__init__(name=f"phantora-relay-{rank}", daemon=True)
        self.rank, self.pipe, self.sink, self.lock, self.quiet = rank, pipe, sink, lock, quiet
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)

    def run(self) -> None:
        prefix = f"[rank{self.rank}]: "
        for raw in iter(self.pipe.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\n")
            self.tail.append(line)
            if not self.quiet:
                with self.lock:
                    self.sink.write(prefix + line + "\n")
                    self.sink.flush()
        self.pipe.close()


@dataclass
class _Proc:
    rank: int
    popen: subprocess.Popen
    out: _Relay
    err: _Relay


def prebuild_stub_library() -> None:
    """Build the ranks' fake CUDA library once here, rather than in every rank at the same time."""
    stubs = str(project_root() / "stubs")
    added = stubs not in sys.path
    if added:
        sys.path.insert(0, stubs)
    try:
        from phantora_stubs import build      # imports no torch: safe in this process

        torch_install = build.find_torch()
        if build.wanted(torch_install):
            target = build.library_path(torch_install)
            if not target.exists():
                build.build(torch_install, target)
    except PhantoraError:
        raise
    except Exception as exc:  # noqa: BLE001 - StubBuildError (no compiler...): a clear message, no traceback
        raise PhantoraError(str(exc)) from None
    finally:
        if added:
            sys.path.remove(stubs)


def run_live(opts: RunOptions, progress: Callable[[str], None] | None = None) -> RunSummary:
    """Run the program on the virtual cluster; returns the summary or raises RunFailed."""
    spec, plan = opts.spec, opts.plan
    argv = program_argv(opts.program)
    prebuild_stub_library()
    # the ranks' PYTORCH_CUDA_ALLOC_CONF: their allocator model and the engine's (replay keeps it in the meta)
    allocator = AllocatorConfig.from_env({**os.environ, **opts.env})
    meta = run_meta(spec, argv, plan.simulated, plan.rank_map, "live", ranks_mode=plan.mode,
                    tokens_per_iteration=opts.tokens_per_iteration, flops_per_token=opts.flops_per_token,
                    profile=opts.env.get("PHANTORA_PROFILE"),      # replay --recost costs from it again
                    allocator=allocator.to_text())
    server = EngineServer(spec, plan.simulated, plan.rank_map, trace=opts.trace, meta=meta,
                          launch_overhead_s=spec.host.launch_overhead_us * 1e-6,
                          cpu_time_scale=spec.host.cpu_time_scale, algo=opts.algo, proto=opts.proto,
                          allocator=allocator)
    port = _free_port()
    epoch = time.time()
    lock = threading.Lock()
    procs: dict[int, _Proc] = {}
    t0 = time.monotonic()
    error: str | None = None
    failed_rank: int | None = None
    oom_messages: list[str] = []
    interrupted = False
    try:
        for r in plan.simulated:
            p = subprocess.Popen(argv, env=rank_environment(opts, server, r, port, epoch), cwd=opts.cwd,
                                 stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 start_new_session=True)
            out = _Relay(r, p.stdout, opts.out, lock, opts.quiet_ranks)
            err = _Relay(r, p.stderr, opts.err, lock, opts.quiet_ranks)
            out.start()
            err.start()
            procs[r] = _Proc(r, p, out, err)
            server.ranks[r].last_message = time.monotonic()
        last_note = time.monotonic()
        while True:
            server.step(0.05)
            error, failed_rank = _check_processes(server, procs, opts.hang_timeout_s)
            if error:
                break
            if server.all_finished and all(p.popen.poll() is not None for p in procs.values()):
                break
            if progress and time.monotonic() - last_note > 30:
                last_note = time.monotonic()
                marks = sum(len(rs.iterations) for rs in server.engine.ranks.values())
                progress(f"{time.monotonic() - t0:.0f} s: {marks} iteration marks, "
                         f"{sum(lr.fed for lr in server.ranks.values()):,} ops simulated")
    except LiveRunError as exc:
        error = str(exc)
        # a rank that died makes the others stuck: name the dead rank first
        dead = _wait_for_failure(server, procs, 3.0)
        if dead is not None:
            failed_rank = dead
            code = procs[dead].popen.returncode
            what = f"exited with code {code}{_signal_name(code)}" if code else \
                "exited (code 0) before its program finished"
            error = f"rank {dead} {what}; then: {error}"
    except KeyboardInterrupt:
        error, interrupted = "interrupted", True
    finally:
        if error:
            _stop(procs)
        for p in procs.values():
            try:
                p.popen.wait(timeout=30)
            except subprocess.TimeoutExpired:
                _stop({p.rank: p})
            p.out.join(timeout=5)
            p.err.join(timeout=5)
    for p in procs.values():
        text = "\n".join(p.err.tail)
        if "OutOfMemoryError" in text or "CUDA out of memory" in text:
            oom_messages.append(f"rank {p.rank}: " + next((ln for ln in reversed(p.err.tail) if "memory" in ln),
                                                         "out of memory"))
    if error and failed_rank is not None and failed_rank in procs:
        error = _failure_report(error, failed_rank, server, procs[failed_rank])
    server.finish(error=error)
    summary = summarize_run(server.engine, server.trace_path, tokens_per_iteration=opts.tokens_per_iteration,
                            flops_per_token=opts.flops_per_token, wall_s=time.monotonic() - t0,
                            keep_trace=opts.trace is not None, oom_messages=oom_messages,
                            wall_marks_s=server.wall_marks)
    server.discard_trace()
    if error:
        if interrupted:
            raise KeyboardInterrupt
        raise RunFailed(error, summary, oom=bool(oom_messages))
    return summary


def _check_processes(server: EngineServer, procs: dict[int, _Proc], hang_s: float) -> tuple[str | None, int | None]:
    now = time.monotonic()
    for r, p in procs.items():
        code = p.popen.poll()
        lr = server.ranks[r]
        if code is None:
            continue
        if code != 0:
            # let the last messages and output arrive before judging
            server.step(0.01)
            return f"rank {r} exited with code {code}" + _signal_name(code), r
        if not lr.finished:
            server.step(0.05)
            if not server.ranks[r].finished:
                return f"rank {r} exited (code 0) before its program finished", r
    waiting = [lr for lr in server.ranks.values() if lr.awaiting is not None or lr.exchange is not None
               or lr.take is not None]
    if waiting:
        for r, lr in server.ranks.items():
            if lr.finished or lr.awaiting is not None or lr.exchange is not None or lr.take is not None:
                continue
            if now - lr.last_message > hang_s:
                return (f"rank {r} made no progress for {hang_s:.0f} s while rank(s) "
                        f"{[w.rank for w in waiting][:8]} wait for it (a hang in its program?)"), r
    return None, None


def _wait_for_failure(server: EngineServer, procs: dict[int, _Proc], seconds: float) -> int | None:
    """A rank whose process died (non-zero exit, or exit without finishing its program), waiting a little for it."""
    deadline = time.monotonic() + seconds
    while True:
        for r, p in procs.items():
            code = p.popen.poll()
            if code is not None and (code != 0 or not server.ranks[r].finished):
                return r
        if time.monotonic() > deadline or all(p.popen.poll() is not None for p in procs.values()):
            return None
        time.sleep(0.05)


def _signal_name(code: int) -> str:
    if code < 0:
        try:
            return f" ({signal.Signals(-code).name})"
        except ValueError:
            return ""
    return ""


def _failure_report(error: str, rank: int, server: EngineServer, proc: _Proc) -> str:
    tail = "\n".join(f"    {ln}" for ln in list(proc.err.tail)[-20:])
    text = f"{error}\n  last op of rank {rank}: {server.last_op(rank)}"
    if tail.strip():
        text += f"\n  its last error output:\n{tail}"
    return text


def _stop(procs: dict[int, _Proc]) -> None:
    for p in procs.values():
        if p.popen.poll() is None:
            try:
                os.killpg(p.popen.pid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass
    deadline = time.monotonic() + 5
    for p in procs.values():
        while p.popen.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if p.popen.poll() is None:
            try:
                os.killpg(p.popen.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            p.popen.wait()


def default_trace_name(program: list[str]) -> Path:
    stem = Path(next((a for a in program if a.endswith(".py")), "run")).stem
    return Path(f"phantora-{stem}.h5")
