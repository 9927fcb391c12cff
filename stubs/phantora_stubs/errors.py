"""Errors raised inside a simulated rank, and where in the user's program they happened."""

from __future__ import annotations

import collections
import functools
import json
import os
import signal
import sys
import threading

from phantora.errors import PhantoraError, SimulationError


class EngineGone(RuntimeError):
    """The engine server closed the connection (the run is being stopped)."""


class StubBuildError(PhantoraError):
    """The fake CUDA library could not be built or loaded."""


class UnsupportedOpError(SimulationError):
    """The simulated program called an op the stubs cannot simulate (no fake kernel, data-dependent result...)."""


class StubConfigError(PhantoraError):
    """An environment variable that configures a rank has a bad value."""


_NOTED: set = set()


def note_once(key: str, message: str) -> None:
    """Print `phantora: MESSAGE` on rank 0's stderr, once per run for each `key` (what the simulation does differently
    from a GPU host, for the user to know)."""
    if key in _NOTED:
        return
    _NOTED.add(key)
    if os.environ.get("PHANTORA_RANK", "0") == "0":
        print(f"phantora: {message}", file=sys.stderr, flush=True)


_STUBS_DIR = os.path.dirname(os.path.abspath(__file__))
_SKIP_PARTS = (os.sep + "torch" + os.sep, os.sep + "phantora" + os.sep, os.sep + "torchgen" + os.sep)


def _is_library_file(filename: str) -> bool:
    if filename.startswith("<"):
        return True
    path = os.path.abspath(filename)
    if path.startswith(_STUBS_DIR):
        return True
    if any(part in path for part in _SKIP_PARTS):
        return True
    for prefix in (sys.prefix, sys.base_prefix):
        lib = os.path.join(prefix, "lib")
        if path.startswith(lib) and "site-packages" not in path[len(lib):]:
            return True        # the standard library
    return False


def user_location(skip: int = 1) -> str:
    """`file:line in function` of the innermost frame outside torch, the stubs and the standard library.

    Falls back to the innermost non-stub frame when every frame belongs to a library.
    """
    frame = sys._getframe(skip)
    fallback = None
    while frame is not None:
        code = frame.f_code
        if not _is_library_file(code.co_filename):
            return f"{code.co_filename}:{frame.f_lineno} in {code.co_name}"
        if fallback is None and not os.path.abspath(code.co_filename).startswith(_STUBS_DIR):
            fallback = f"{code.co_filename}:{frame.f_lineno} in {code.co_name}"
        frame = frame.f_back
    return fallback or "<unknown location>"


# ---- where a stuck rank is (`phantora run`'s hang, mismatch and deadlock reports) ------------------------------------

STACK_SIGNAL = signal.SIGUSR2
"""The launcher sends this signal to a stuck rank; the rank writes its Python stacks to `PHANTORA_STACK_FILE`."""

ISSUED_KEEP = 16
_issued: dict[int, collections.deque] = {}     # gid -> (call index on the group, op name, bytes, user frame)
_issued_count: dict[int, int] = {}


@functools.lru_cache(maxsize=4096)
def _library_file_cached(filename: str) -> bool:
    return _is_library_file(filename)


def _user_frame(frame) -> tuple[str, int, str] | None:
    """(file, line, function) of the innermost frame outside torch, the stubs and the standard library."""
    while frame is not None:
        code = frame.f_code
        if not _library_file_cached(code.co_filename):
            return code.co_filename, frame.f_lineno, code.co_name
        frame = frame.f_back
    return None


def note_collective(gid: int, name: str, nbytes: int) -> None:
    """Remember where the program issued its latest collectives on group `gid` (counted as the engine counts them:
    call #1, #2... per group)."""
    n = _issued_count.get(gid, 0)
    _issued_count[gid] = n + 1
    q = _issued.get(gid)
    if q is None:
        q = _issued[gid] = collections.deque(maxlen=ISSUED_KEEP)
    q.append((n + 1, name, int(nbytes), _user_frame(sys._getframe(1))))


_transfers: collections.deque = collections.deque(maxlen=ISSUED_KEEP)


def note_transfer(gid: int, name: str, nbytes: int, peer: int) -> None:
    """Remember where the program issued its latest sends and receives (`peer`: the other side's global rank)."""
    _transfers.append((name, int(peer), int(nbytes), gid, _user_frame(sys._getframe(1))))


def _stack_of(frame) -> list[tuple[str, int, str]]:
    out = []
    while frame is not None:
        out.append((frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name))
        frame = frame.f_back
    out.reverse()                 # outermost first, as tracebacks print
    return out


def stack_report() -> dict:
    """The rank's Python stacks (every thread), the innermost user frame of each, and where its latest collectives
    were issued."""
    frames = sys._current_frames()
    me = threading.get_ident()
    names = {t.ident: t.name for t in threading.enumerate()}
    main = threading.main_thread().ident
    threads = []
    for ident, frame in sorted(frames.items(), key=lambda kv: kv[0] != main):
        if ident == me:
            continue
        threads.append({"name": names.get(ident, f"thread {ident}"), "main": ident == main,
                        "stack": _stack_of(frame), "user": _user_frame(frame)})
    return {"pid": os.getpid(), "threads": threads,
            "collectives": {str(gid): list(q) for gid, q in _issued.items()}, "transfers": list(_transfers)}


def install_stack_dump(path: str) -> bool:
    """On `STACK_SIGNAL`, write `stack_report()` as JSON to `path` (atomically). A thread waits for the signal, so the
    report comes even while the main thread is blocked in C code (a backward pass, a wait on the engine). The signal
    is blocked in every thread of the rank, so it is only ever taken by that thread."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "sigwait"):
        return False

    def wait_loop() -> None:
        while True:
            try:
                signal.sigwait({STACK_SIGNAL})
                report = stack_report()
                tmp = f"{path}.tmp{os.getpid()}"
                with open(tmp, "w") as f:
                    json.dump(report, f)
                os.replace(tmp, path)
            except Exception:  # noqa: BLE001 - never disturb the program; the launcher reports a missing stack
                pass

    signal.pthread_sigmask(signal.SIG_BLOCK, {STACK_SIGNAL})
    threading.Thread(target=wait_loop, name="phantora-stack-dump", daemon=True).start()
    return True


def die_with_launcher(launcher_pid: str | None) -> None:
    """Linux: the rank is killed when the launcher that started it dies (even by SIGKILL), so that no rank outlives
    its run. Only for a rank started directly by the launcher."""
    if not launcher_pid or not sys.platform.startswith("linux"):
        return
    try:
        pid = int(launcher_pid)
    except ValueError:
        return
    if os.getppid() != pid:
        return
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)          # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != pid:                                 # the launcher died before prctl took effect
        os._exit(128 + int(signal.SIGKILL))
