"""`phantora run`: start the engine server, one process per simulated rank (with the environment torchrun gives),
relay their output prefixed by rank, watch them, and end with a summary and a closed trace.

Failures stop the run: a rank that raises or exits without finishing, a rank that stays silent for `hang_timeout_s`
seconds while other ranks wait on the simulation, collectives that do not match across a group, or a deadlock.
The others are then stopped, the report names the rank, its last op and the end of its error output (for a hang, a
mismatch or a deadlock also where each stuck rank's program is: its Python stack, asked for with SIGUSR2), and the
trace is closed readable (marked incomplete, with the error in its metadata). SIGINT, SIGTERM and SIGHUP stop the run
the same way. The run's temporary folder is removed in every case; that of a launcher killed with SIGKILL is removed
by the next run (server.clean_stale_run_dirs), and its ranks die with it.
"""

from __future__ import annotations

import collections
import importlib.machinery
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Callable

from .. import hostcpu
from ..cluster import ClusterSpec, host_rates_env
from ..engine import devmem
from ..engine.allocator import AllocatorConfig
from ..errors import PhantoraError
from ..paths import project_root
from ..routing import BALANCED, ENV as ROUTING_ENV, RoutingSpec
from ..simulate import run_meta
from . import wire
from .ranks import RankPlan
from .server import EngineServer, LiveRunError, own_run_dirs
from .summary import RunSummary, summarize_run

TAIL_LINES = 40


class RunFailed(PhantoraError):
    """The live run stopped on a failure; `summary` holds what was simulated until then."""

    def __init__(self, message: str, summary: RunSummary | None = None, oom: bool = False,
                 signum: int | None = None):
        super().__init__(message)
        self.summary = summary
        self.oom = oom
        self.signum = signum                    # the run was stopped by this signal (SIGINT, SIGTERM, SIGHUP)


STOP_SIGNALS = tuple(s for s in (getattr(signal, n, None) for n in ("SIGINT", "SIGTERM", "SIGHUP")) if s is not None)


class _Signals:
    """SIGINT, SIGTERM and SIGHUP during a run: noted here and acted on by the run loop, which stops the ranks, closes
    the trace with the reason and cleans up. A second signal cuts the ranks' grace period short (SIGKILL at once)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.count = 0
        self._old: dict[int, object] = {}

    def __enter__(self) -> "_Signals":
        if threading.current_thread() is threading.main_thread():
            for s in STOP_SIGNALS:
                self._old[s] = signal.signal(s, self._note)
        return self

    def _note(self, signum: int, frame) -> None:
        self.count += 1
        if self.signum is None:
            self.signum = signum

    @property
    def hurry(self) -> bool:
        return self.count > 1

    def __exit__(self, *exc) -> None:
        for s, old in self._old.items():
            signal.signal(s, old)
        self._old.clear()


def signal_text(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


@dataclass
class RunOptions:
    program: list[str]                          # the user's command (after `--`)
    spec: ClusterSpec
    plan: RankPlan
    trace: str | None = None
    overwrite: bool = False                     # the trace may replace an existing file (--overwrite)
    tokens_per_iteration: float | None = None
    flops_per_token: float | None = None
    hang_timeout_s: float = 300.0
    env: dict[str, str] = field(default_factory=dict)
    overrides: tuple = ()                       # the cluster fields the user set (--set KEY=VALUE), for the meta
    cwd: str | None = None
    algo: str | None = None
    proto: str | None = None
    quiet_ranks: bool = False                   # do not relay the ranks' output (tests, benchmarks)
    host_cpu: str = hostcpu.DEFAULT_MODE        # model | measured (phantora/hostcpu.py)
    local_rank_arg: bool = False                # pass --local_rank=N to each rank (the deepspeed launcher's way)
    routing: RoutingSpec = BALANCED             # expert routing the ranks assume (phantora/routing.py, --routing)
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


_PYTHON_OPTS_WITH_VALUE = ("-W", "-X", "-Q")


def _script_index(argv: list[str]) -> tuple[str, int]:
    """Where a `python` command line names what it runs: ("script", i) with argv[i] the script, ("module", i) with
    argv[i] the module after -m, ("inline", i) for -c / -, ("none", len(argv)) when nothing is named."""
    i = 1
    while i < len(argv):
        a = argv[i]
        if a == "-c" or a == "-":
            return "inline", i
        if a == "-m":
            return "module", i + 1
        if a in _PYTHON_OPTS_WITH_VALUE:
            i += 2
            continue
        if not a.startswith("-"):
            return "script", i
        i += 1
    return "none", len(argv)


def with_local_rank(argv: list[str], local_rank: int) -> list[str]:
    """`argv` with `--local_rank=N` right after the script or module, where the deepspeed launcher (and
    torch.distributed.launch) put it; at the end for any other program."""
    arg = f"--local_rank={local_rank}"
    if argv[0] == sys.executable:
        kind, i = _script_index(argv)
        if kind in ("script", "module") and i < len(argv):
            return argv[:i + 1] + [arg] + argv[i + 1:]
    return argv + [arg]


def check_program(argv: list[str], cwd: str | None = None, env: dict[str, str] | None = None) -> None:
    """Refuse, before anything starts, a program that cannot run: a missing script, module or executable."""
    base = Path(cwd or ".")
    if argv[0] != sys.executable:
        exe = argv[0]
        if os.sep in exe:
            if not (base / exe).is_file():
                raise PhantoraError(f"the program {exe} does not exist (in {base.resolve()})")
            if not os.access(base / exe, os.X_OK):
                raise PhantoraError(f"the program {exe} is not executable (chmod +x, or run it with python)")
        elif shutil.which(exe, path=(env or {}).get("PATH", os.environ.get("PATH"))) is None:
            raise PhantoraError(f"the program {exe!r} is not found (not a Python script, and not on PATH)")
        return
    kind, i = _script_index(argv)
    if kind == "inline":
        return
    if kind == "module":
        if i >= len(argv):
            raise PhantoraError("-m needs a module name, e.g. phantora run -- python -m package.train")
        top = argv[i].split(".")[0]
        extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        search = [str(base.resolve()), *extra, *sys.path]
        if importlib.machinery.PathFinder.find_spec(top, search) is None and top not in sys.builtin_module_names:
            raise PhantoraError(f"no module named {top!r} (looked in {base.resolve()}, PYTHONPATH and the "
                                f"interpreter's path)")
        return
    if kind == "none":
        raise PhantoraError("python needs a script or -m module to run, e.g. phantora run -- python train.py")
    if not (base / argv[i]).is_file():
        raise PhantoraError(f"the program's script {argv[i]} does not exist (in {base.resolve()})")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ranks_plan_env(plan: RankPlan | None) -> str:
    """`PHANTORA_RANKS_PLAN`: `auto:P` (the pipeline degree `--ranks auto` assumed), else the plan's mode."""
    if plan is None:
        return "all"
    return f"auto:{plan.pp_degree}" if plan.mode == "auto" else plan.mode


def rank_environment(opts: RunOptions, server: EngineServer, rank: int, port: int, epoch: float) -> dict[str, str]:
    spec = opts.spec
    gpn = spec.gpus_per_node
    root = project_root()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PHANTORA_") or k in ("PHANTORA_FAKE_CUDA",
                                                                                          "PHANTORA_HOME")}
    env.pop("CUDA_VISIBLE_DEVICES", None)   # this machine's GPUs, not the simulated host's (a script may set it)
    path = [str(root / "stubs"), str(root)]
    if env.get("PYTHONPATH"):
        path.append(env["PYTHONPATH"])
    env.update({
        "PYTHONPATH": os.pathsep.join(path),
        "PYTHONUNBUFFERED": "1",
        "PHANTORA_RANK": str(rank), "PHANTORA_WORLD_SIZE": str(spec.world_size),
        # what `--ranks auto` assumed of the pipeline stages, checked where the program tells (pipeline_layout.py)
        "PHANTORA_RANKS_PLAN": ranks_plan_env(getattr(opts, "plan", None)),
        "PHANTORA_LOCAL_RANK": str(rank % gpn), "PHANTORA_LOCAL_DEVICES": str(gpn),
        "PHANTORA_GPU": spec.gpu, "PHANTORA_VRAM_BYTES": str(spec.vram_bytes()),
        "PHANTORA_RUNTIME": server.address, wire.AUTHKEY_ENV: server.authkey.hex(),
        "PHANTORA_LAUNCH_OVERHEAD_US": repr(spec.host.launch_overhead_us),
        "PHANTORA_CPU_TIME_SCALE": repr(spec.host.cpu_time_scale),
        "PHANTORA_COMPILED_HOST_US": f"{spec.host.generated_launch_us!r},{spec.host.compiled_call_us!r}",
        "PHANTORA_LAUNCH_QUEUE": str(spec.host.launch_queue),
        "PHANTORA_HOST_MEMORY_GBPS": host_rates_env(spec.host),
        "PHANTORA_HOST_CPU_CORES": str(spec.host.cpu_cores),
        "PHANTORA_DEVICE_MEMORY": devmem.spec_env(spec.device_memory),
        hostcpu.ENV_MODE: getattr(opts, "host_cpu", hostcpu.DEFAULT_MODE), hostcpu.ENV_COSTS: hostcpu.HostCosts.from_spec(spec.host).env(),
        hostcpu.ENV_CONVERT: hostcpu.ConvertCosts.from_spec(spec.host).env(),
        # string hashes seeded alike in every run: set and dict orders, and the host work they lead to, repeat
        "PYTHONHASHSEED": env.get("PYTHONHASHSEED", "0"),
        "PHANTORA_EPOCH": repr(epoch),
        "PHANTORA_TORCH_CUDA": spec.software.torch_cuda, "PHANTORA_SDPA": ",".join(spec.software.sdpa),
        "PHANTORA_TRANSFORMER_ENGINE": spec.software.transformer_engine,
        ROUTING_ENV: getattr(opts, "routing", BALANCED).text(),
        # what torchrun sets
        "RANK": str(rank), "WORLD_SIZE": str(spec.world_size), "LOCAL_RANK": str(rank % gpn),
        "LOCAL_WORLD_SIZE": str(min(gpn, spec.world_size)), "GROUP_RANK": str(rank // gpn),
        "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": str(spec.world_size), "ROLE_NAME": "default",
        "GROUP_WORLD_SIZE": str(spec.nodes), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
        "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_RUN_ID": "phantora",
        # what the deepspeed launcher sets besides
        "LOCAL_SIZE": str(min(gpn, spec.world_size)), "CROSS_RANK": str(rank // gpn), "CROSS_SIZE": str(spec.nodes),
    })
    if "OMP_NUM_THREADS" not in env and gpn > 1:
        env["OMP_NUM_THREADS"] = "1"        # as torchrun sets it for several processes per node
    env["PHANTORA_LAUNCHER_PID"] = str(os.getpid())          # the rank dies with the launcher (bootstrap)
    env["PHANTORA_STACK_FILE"] = server.stack_file(rank)      # where it writes its stacks when asked (reports)
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
                with self.lock:          # a line torch already prefixed for this rank is not prefixed twice
                    self.sink.write(("" if line.startswith(prefix.rstrip()) else prefix) + line + "\n")
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
    """Run the program on the virtual cluster; returns the summary or raises RunFailed.

    SIGINT, SIGTERM and SIGHUP (in the main thread) stop the run like a failure: the ranks are stopped, the trace is
    closed with the reason and RunFailed carries the signal (`signum`)."""
    argv = program_argv(opts.program)
    check_program(argv, opts.cwd, opts.env)
    prebuild_stub_library()
    with _Signals() as sig:
        return _run_ranks(opts, argv, sig, progress)


def _run_ranks(opts: RunOptions, argv: list[str], sig: _Signals, progress: Callable[[str], None] | None) -> RunSummary:
    spec, plan = opts.spec, opts.plan
    # the ranks' PYTORCH_CUDA_ALLOC_CONF: their allocator model and the engine's (replay keeps it in the meta)
    allocator = AllocatorConfig.from_env({**os.environ, **opts.env})
    meta = run_meta(spec, argv, plan.simulated, plan.rank_map, "live", ranks_mode=plan.mode,
                    tokens_per_iteration=opts.tokens_per_iteration, flops_per_token=opts.flops_per_token,
                    profile=opts.env.get("PHANTORA_PROFILE"),      # replay --recost costs from it again
                    allocator=allocator.to_text(), routing=opts.routing.as_meta(),
                    algo=opts.algo, proto=opts.proto,             # what replay forces again by default
                    overrides=[o.split("=", 1)[0].strip() for o in opts.overrides],  # not the preset's drift
                    host_cpu={"mode": opts.host_cpu, **hostcpu.HostCosts.from_spec(spec.host).as_dict(),
                              **hostcpu.ConvertCosts.from_spec(spec.host).as_dict(),
                              "cpu_time_scale": spec.host.cpu_time_scale})
    before = own_run_dirs()
    try:
        server = EngineServer(spec, plan.simulated, plan.rank_map, trace=opts.trace, meta=meta,
                              launch_overhead_s=spec.host.launch_overhead_us * 1e-6,
                              cpu_time_scale=spec.host.cpu_time_scale, algo=opts.algo, proto=opts.proto,
                              allocator=allocator, overwrite=opts.overwrite)
    except BaseException:
        for d in own_run_dirs() - before:       # the folder of this failed start (the trace was refused...)
            shutil.rmtree(d, ignore_errors=True)
        raise
    port = _free_port()
    epoch = time.time()
    lock = threading.Lock()
    procs: dict[int, _Proc] = {}
    t0 = time.monotonic()
    error: str | None = None
    failed_rank: int | None = None
    oom_messages: list[str] = []
    interrupted = False
    start_error: str | None = None
    stacks: list[int] = []                      # ranks whose Python stacks the report shows
    stack_text = ""
    unexpected: BaseException | None = None
    try:
        for r in plan.simulated:
            if sig.signum is not None:
                break
            try:
                rank_argv = with_local_rank(argv, r % opts.spec.gpus_per_node) if opts.local_rank_arg else argv
                p = subprocess.Popen(rank_argv, env=rank_environment(opts, server, r, port, epoch), cwd=opts.cwd,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     start_new_session=True)
            except OSError as exc:
                start_error = error = f"cannot start the program {argv[0]!r}: {exc.strerror or exc}"
                break
            out = _Relay(r, p.stdout, opts.out, lock, opts.quiet_ranks)
            err = _Relay(r, p.stderr, opts.err, lock, opts.quiet_ranks)
            out.start()
            err.start()
            procs[r] = _Proc(r, p, out, err)
            server.ranks[r].last_message = time.monotonic()
        last_note = time.monotonic()
        while start_error is None:
            if sig.signum is not None:
                error, interrupted = f"stopped by {signal_text(sig.signum)}", True
                break
            server.step(0.05)
            error, failed_rank = _check_processes(server, procs, opts.hang_timeout_s)
            if error and sig.signum is not None:    # the signal reached the ranks too (Slurm signals every process)
                error, failed_rank, interrupted = f"stopped by {signal_text(sig.signum)}", None, True
                break
            if error:
                if failed_rank is not None and procs[failed_rank].popen.poll() is None:    # a hang
                    stacks = [failed_rank]
                break
            if server.all_finished and all(p.popen.poll() is not None for p in procs.values()):
                break
            if progress and time.monotonic() - last_note > 30:
                last_note = time.monotonic()
                marks = [len(rs.iterations) for rs in server.engine.ranks.values()]
                progress(f"{time.monotonic() - t0:.0f} s: {min(marks, default=0)} iteration mark(s) reached by "
                         f"every simulated rank, "
                         f"{sum(lr.fed for lr in server.ranks.values()):,} ops simulated")
    except LiveRunError as exc:
        error = str(exc)
        # a rank that died makes the others stuck: name the dead rank first. One that has left its program (its
        # connection closed) is exiting: its exit code is waited for longer, as a loaded machine may take seconds to
        # end a process that prints a traceback
        leaving = [p for r, p in procs.items() if server.ranks[r].disconnected and p.popen.poll() is None]
        deadline = time.monotonic() + LEAVING_WAIT_S
        while any(p.popen.poll() is None for p in leaving) and time.monotonic() < deadline:
            time.sleep(0.05)
        dead = _wait_for_failure(server, procs, 3.0)
        if sig.signum is not None:
            error, interrupted = f"stopped by {signal_text(sig.signum)}", True
        elif dead is not None and (procs[dead].popen.returncode or not error.startswith("mismatched collectives")):
            # (a rank that ran its program to the end, code 0, had not said so yet when its collectives were found
            # mismatched: the mismatch is the error, not its exit)
            failed_rank = dead
            code = procs[dead].popen.returncode
            what = f"exited with code {code}{_signal_name(code)}" if code else _early_exit(server.ranks[dead])
            error = f"rank {dead} {what}; then: {error}"
        else:
            stacks = sorted(procs)              # mismatched collectives or a deadlock: where is every rank?
    except KeyboardInterrupt:                   # run_live outside the main thread: no handlers of ours
        error, interrupted = "stopped by SIGINT", True
    except Exception as exc:                    # a bug of ours: stop the ranks, close the trace, then re-raise
        error, unexpected = f"the launcher failed: {type(exc).__name__}: {exc}", exc
    finally:
        if stacks:
            stack_text = _stack_report(server, procs, stacks, error or "")
        if error:
            _stop(procs, sig)
        deadline = time.monotonic() + 30
        while any(p.popen.poll() is None for p in procs.values()) and time.monotonic() < deadline:
            if sig.signum is not None:
                break
            time.sleep(0.05)
        if sig.signum is not None and not error:
            error, interrupted = f"stopped by {signal_text(sig.signum)}", True
        _stop(procs, sig)                       # anything still running
        for p in procs.values():
            p.out.join(timeout=5)
            p.err.join(timeout=5)
    for p in procs.values():
        text = "\n".join(p.err.tail)
        if "OutOfMemoryError" in text or "CUDA out of memory" in text:
            oom_messages.append(f"rank {p.rank}: " + next((ln for ln in reversed(p.err.tail) if "memory" in ln),
                                                         "out of memory"))
    if error and failed_rank is not None and failed_rank in procs:
        error = _failure_report(error, failed_rank, server, procs[failed_rank])
    if stack_text:
        error += stack_text
    if start_error is not None and not procs:
        server.abandon()                        # nothing ran: leave no trace behind
        raise PhantoraError(start_error)
    try:
        server.finish(error=error)
        if unexpected is not None:
            raise unexpected
        summary = summarize_run(server.engine, server.trace_path, tokens_per_iteration=opts.tokens_per_iteration,
                                flops_per_token=opts.flops_per_token, wall_s=time.monotonic() - t0,
                                keep_trace=opts.trace is not None, oom_messages=oom_messages,
                                wall_marks_s=server.wall_marks, host_cpu=meta.get("host_cpu"),
                                routing=meta.get("routing"), stopped=bool(error))
    finally:
        server.discard_trace()                  # the run's folder goes in every case
    if error:
        signum = (sig.signum or signal.SIGINT) if interrupted else None
        raise RunFailed(error, summary, oom=bool(oom_messages), signum=signum)
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
                return f"rank {r} {_early_exit(server.ranks[r])}", r
    waiting = [lr for lr in server.ranks.values() if lr.awaiting is not None or lr.exchange is not None
               or lr.take is not None or lr.asks_now]
    if waiting:
        for r, lr in server.ranks.items():
            if lr.finished or lr.awaiting is not None or lr.exchange is not None or lr.take is not None \
                    or lr.asks_now:
                continue
            if now - lr.last_message > hang_s:
                return (f"rank {r} made no progress for {hang_s:.0f} s while rank(s) "
                        f"{[w.rank for w in waiting][:8]} wait for it (a hang in its program?)"), r
    return None, None


def _early_exit(lr) -> str:
    """Why a rank that exited with code 0 without saying goodbye failed."""
    if lr.conn is None:
        return ("exited (code 0) without loading Phantora's stubs: `phantora run` simulates Python programs, which "
                "load the stubs from PYTHONPATH as they start; the command is not Python, or runs Python with -I, "
                "-E or -S, or replaces PYTHONPATH")
    return "exited (code 0) before its program finished"


LEAVING_WAIT_S = 30.0
"""How long a failed run waits for the exit code of a rank that has left its program before it reports."""


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


STACK_WAIT_S = 3.0
STACK_FRAMES = 12
STACK_RANKS = 4


def _stack_report(server: EngineServer, procs: dict[int, _Proc], ranks: list[int], error: str) -> str:
    """Ask the stuck ranks for their Python stacks (the bootstrap's SIGUSR2 dump) and format where each one is: its
    innermost frame in the program, the end of its stack, and where it issued the collectives the error names."""
    asked = []
    for r in ranks[:STACK_RANKS]:
        p = procs.get(r)
        if p is None or p.popen.poll() is not None:
            continue
        path = server.stack_file(r)
        Path(path).unlink(missing_ok=True)
        try:
            os.kill(p.popen.pid, signal.SIGUSR2)
        except (ProcessLookupError, PermissionError):
            continue
        asked.append((r, path))
    if not asked:
        return ""
    deadline = time.monotonic() + STACK_WAIT_S
    while time.monotonic() < deadline and not all(os.path.exists(path) for _, path in asked):
        time.sleep(0.05)
    named = {(int(g), int(n)) for n, g in re.findall(r"#(\d+) on group (\d+)", error)}
    named |= {(int(g), int(n)) for g, n in re.findall(r"on group (\d+) \([^)]*\), call #(\d+)", error)}
    text = ""
    for r, path in asked:
        try:
            with open(path) as f:
                report = json.load(f)
        except (OSError, ValueError):
            text += f"\n  rank {r}: no Python stack (it did not answer within {STACK_WAIT_S:.0f} s)"
            continue
        text += _format_stack(r, report, named)
    if len(ranks) > STACK_RANKS:
        text += f"\n  ({len(ranks) - STACK_RANKS} more rank(s) not shown)"
    return text


def _where(frame) -> str:
    return f"{frame[0]}:{frame[1]} in {frame[2]}" if frame else "no frame of the program"


def _format_stack(rank: int, report: dict, named: set[tuple[int, int]]) -> str:
    threads = report.get("threads") or []
    main = next((t for t in threads if t.get("main")), threads[0] if threads else None)
    if main is None:
        return f"\n  rank {rank}: no Python stack"
    user = main.get("user") or next((t.get("user") for t in threads if t.get("user")), None)
    text = f"\n  rank {rank} is at {_where(user)}"
    for gid, calls in sorted((report.get("collectives") or {}).items(), key=lambda kv: int(kv[0])):
        for n, name, nbytes, frame in calls:
            if (int(gid), int(n)) in named:
                text += f"\n    it issued {name} #{n} on group {gid} ({nbytes} B) at {_where(frame)}"
    if not named:
        last = max(((int(g), c[-1]) for g, c in (report.get("collectives") or {}).items() if c),
                   key=lambda gc: gc[1][0], default=None)
        if last is not None:
            g, (n, name, nbytes, frame) = last
            text += f"\n    its latest collective: {name} #{n} on group {g} ({nbytes} B), issued at {_where(frame)}"
    for name, peer, nbytes, gid, frame in (report.get("transfers") or [])[-2:]:     # its latest sends / receives
        way = "to" if name == "send" else "from"
        text += f"\n    its {name} of {nbytes} B {way} rank {peer} (group {gid}) was issued at {_where(frame)}"
    for t in threads:
        stack = t.get("stack") or []
        if not stack or not (t.get("main") or t.get("user")):
            continue
        which = "its main thread" if t.get("main") else t.get("name")
        text += f"\n    Python stack of {which} (most recent call last):"
        if len(stack) > STACK_FRAMES:
            text += f"\n      ... {len(stack) - STACK_FRAMES} outer frame(s)"
        for file, line, func in stack[-STACK_FRAMES:]:
            text += f'\n      File "{file}", line {line}, in {func}'
    return text


def _stop(procs: dict[int, _Proc], sig: _Signals | None = None) -> None:
    """SIGTERM to each running rank's process group, SIGKILL 5 s later (at once after a second stop signal)."""
    for p in procs.values():
        if p.popen.poll() is None:
            try:
                os.killpg(p.popen.pid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass
    deadline = time.monotonic() + 5
    for p in procs.values():
        while p.popen.poll() is None and time.monotonic() < deadline and not (sig is not None and sig.hurry):
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
