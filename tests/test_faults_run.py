"""`phantora run` when things go wrong around the program: a stop signal (SIGTERM, SIGINT) or SIGKILL of the
launcher, torchrun's own options, a program that does not exist, more rank processes than the machine holds, a bad
--hang-timeout, and where the program was in hang, mismatch and deadlock reports. Each test checks the exit code, the
message, the trace (closed, with the reason), the summary JSON, and that no run folder or rank process is left.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from phantora.errors import PhantoraError
from phantora.live.ranks import RankPlan, check_process_count, process_capacity
from phantora.trace.reader import TraceReader
from test_live_run import ROOT, SCRIPTS, phantora_run

STUCK = str(SCRIPTS / "live_stuck.py")
FAIL = str(SCRIPTS / "live_fail.py")


def _env(tmpdir: Path) -> dict:
    env = dict(os.environ)
    for k in ("PYTHONPATH", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        env.pop(k, None)
    env["TMPDIR"] = str(tmpdir)          # the run's temporary folder goes here, where the test can look
    return env


def _run_dirs(tmpdir: Path) -> list[str]:
    return sorted(p.name for p in tmpdir.glob("phantora-run-*"))


def _gone(pid: int) -> bool:
    """The process no longer runs (absent, or a zombie waiting for its new parent to reap it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")


def _wait_gone(pids: list[int], seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if all(_gone(p) for p in pids):
            return True
        time.sleep(0.1)
    return False


@pytest.fixture(autouse=True)
def _no_launcher_left():
    """A failing test must not leave its `phantora run` (nor, through it, its ranks) running."""
    yield
    for proc in _STARTED:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    _STARTED.clear()


_STARTED: list[subprocess.Popen] = []


def _start_waiting_run(tmp_path: Path, *args: str) -> tuple[subprocess.Popen, list[int], Path]:
    """`phantora run` of two ranks that print READY <pid> and then wait (silently, for real); returns once both are
    ready."""
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir(exist_ok=True)
    err = tmp_path / "stderr.txt"
    proc = subprocess.Popen([sys.executable, "-m", "phantora.cli", "run", "--gpus-per-node", "2", *args, "--",
                             "python", STUCK, "--mode", "wait"], cwd=str(ROOT), env=_env(tmpdir),
                            stdout=subprocess.PIPE, stderr=err.open("w"), text=True)
    _STARTED.append(proc)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(ln) for ln in proc.stdout] + [lines.put("")], daemon=True).start()
    pids: list[int] = []
    deadline = time.monotonic() + 240
    while len(pids) < 2:
        try:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError(f"the ranks did not get ready:\n{err.read_text()[-3000:]}") from None
        assert line, f"phantora run ended early:\n{err.read_text()[-3000:]}"
        if "READY" in line:
            pids.append(int(line.split("READY", 1)[1]))
    return proc, pids, err


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_stop_signal_stops_ranks_closes_trace_writes_summary_and_cleans_up(tmp_path, signum):
    trace, summary = tmp_path / "t.h5", tmp_path / "s.json"
    proc, pids, err = _start_waiting_run(tmp_path, "--trace", str(trace), "--summary-json", str(summary))
    assert _run_dirs(tmp_path / "tmp")                    # the run's folder exists while it runs
    proc.send_signal(signum)
    rc = proc.wait(timeout=60)
    name = signal.Signals(signum).name
    text = err.read_text()
    assert rc == 128 + signum, text[-3000:]
    assert f"phantora: stopped by {name}" in text
    assert "Traceback" not in text and "Aborted!" not in text
    with TraceReader(trace) as rd:                        # closed, with the reason; the simulation incomplete
        assert rd.complete
        assert f"stopped by {name}" in rd.error
        assert rd.meta["complete_simulation"] is False
    assert f"stopped by {name}" in json.loads(summary.read_text())["error"]
    assert _run_dirs(tmp_path / "tmp") == []
    assert _wait_gone(pids), "a rank process outlived the run"


def test_sigterm_to_the_launcher_and_its_ranks_at_once_is_a_stop_not_a_rank_failure(tmp_path):
    """As Slurm's scancel does: every process of the job gets SIGTERM."""
    summary = tmp_path / "s.json"
    proc, pids, err = _start_waiting_run(tmp_path, "--no-trace", "--summary-json", str(summary))
    proc.send_signal(signal.SIGTERM)
    for pid in pids:
        os.kill(pid, signal.SIGTERM)
    rc = proc.wait(timeout=60)
    assert rc == 128 + signal.SIGTERM, err.read_text()[-3000:]
    assert "phantora: stopped by SIGTERM" in err.read_text()
    assert json.loads(summary.read_text())["error"] == "stopped by SIGTERM"
    assert _run_dirs(tmp_path / "tmp") == []


def test_sigkill_of_the_launcher_kills_the_ranks_and_the_next_run_removes_its_folder(tmp_path):
    proc, pids, _ = _start_waiting_run(tmp_path, "--no-trace")
    left = _run_dirs(tmp_path / "tmp")
    assert len(left) == 1
    proc.kill()
    proc.wait(timeout=30)
    assert _wait_gone(pids), "a rank process outlived its killed launcher"
    assert _run_dirs(tmp_path / "tmp") == left            # SIGKILL leaves the folder ...
    done = subprocess.run([sys.executable, "-m", "phantora.cli", "run", "--gpus-per-node", "1", "--no-trace",
                           "--quiet", "--", "python", str(SCRIPTS / "live_values.py")], cwd=str(ROOT),
                          env=_env(tmp_path / "tmp"), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert _run_dirs(tmp_path / "tmp") == []              # ... which the next run removes


def test_torchrun_options_take_their_meaning(tmp_path):
    proc = phantora_run("--nproc-per-node", "2", "--nnodes", "1", "--standalone", "--master-port", "29400",
                        "--rdzv-backend", "c10d", "--no-trace", str(SCRIPTS / "live_values.py"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = [json.loads(ln.split("RESULT ", 1)[1]) for ln in proc.stdout.splitlines() if "RESULT " in ln]
    assert sorted(r["rank"] for r in res) == [0, 1] and {r["world"] for r in res} == {2}
    assert "ignoring torchrun's --standalone, --master-port, --rdzv-backend" in proc.stderr
    # the header says once that tensor values are placeholders, and which reads are real
    assert proc.stderr.count("tensors hold no data") == 1
    assert "up to 64 elements" in proc.stderr and "all_reduce" in proc.stderr


@pytest.mark.parametrize("args, expect", [
    (("--nproc_per_node=2", "--nnodes=4096"), "8192 rank processes"),     # taken as 4096 nodes x 2 GPUs
    (("--nproc-per-node", "gpu"), "--nproc-per-node 'gpu'"),
    (("--nnodes", "1:4"), "--nnodes 1:4: elastic node ranges"),
    (("--node-rank", "1"), "--node-rank 1: phantora simulates every node"),
    (("--nproc-per-node", "2", "--gpus-per-node", "4"), "disagree"),
    (("--max-restarts", "3"), "torchrun's option --max-restarts has no equivalent"),
    (("--tee", "3"), "--quiet hides it"),
    (("--frobnicate",), "unknown option --frobnicate before the program"),
])
def test_torchrun_options_refused_before_anything_starts(tmp_path, args, expect):
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    trace = tmp_path / "t.h5"
    proc = subprocess.run([sys.executable, "-m", "phantora.cli", "run", *args, "--trace", str(trace),
                           str(SCRIPTS / "live_values.py")], cwd=str(ROOT), env=_env(tmpdir), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr and "[rank0]:" not in proc.stdout + proc.stderr
    assert expect in proc.stderr, proc.stderr
    assert not trace.exists() and not list(tmp_path.glob("t.h5*"))
    assert _run_dirs(tmpdir) == []


@pytest.mark.parametrize("program, expect", [
    (["python", "no_such_script.py"], "no_such_script.py does not exist"),
    (["no-such-program-xyz"], "'no-such-program-xyz' is not found"),
    (["-m", "no_such_module_xyz"], "no module named 'no_such_module_xyz'"),
    (["deepspeed", "--num_gpus", "2", "train.py"], "phantora run is itself the launcher"),
    (["/usr/local/bin/torchrun", "--nproc-per-node", "2", "train.py"], "-- python train.py ARGS"),
    (["python", "-m", "torch.distributed.run", "train.py"], "phantora run is itself the launcher"),
])
def test_missing_program_is_one_line_with_no_trace_and_no_folder(tmp_path, program, expect):
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    trace = tmp_path / "t.h5"
    proc = subprocess.run([sys.executable, "-m", "phantora.cli", "run", "--gpus-per-node", "2", "--trace",
                           str(trace), "--", *program], cwd=str(ROOT), env=_env(tmpdir), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 1
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("Error:")]
    assert len(errors) == 1 and expect in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert not list(tmp_path.glob("t.h5*"))
    assert _run_dirs(tmpdir) == []


@pytest.mark.parametrize("program", [[sys.executable, "-I", "-c", "print('ran')"], ["/bin/echo", "ran"]])
def test_a_program_that_never_loads_the_stubs_is_named_so(tmp_path, program):
    """A command that is not Python, or Python that ignores PYTHONPATH (-I), runs without the stubs: it never
    connects, and the report says so instead of "before its program finished"."""
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    proc = subprocess.run([sys.executable, "-m", "phantora.cli", "run", "--gpus-per-node", "1", "--no-trace", "--",
                           *program], cwd=str(ROOT), env=_env(tmpdir), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert "[rank0]: ran" in proc.stdout
    assert "rank 0 exited (code 0) without loading Phantora's stubs" in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert _run_dirs(tmpdir) == []


@pytest.mark.parametrize("value", ["0", "-5", "nan"])
def test_hang_timeout_must_be_positive(value):
    proc = phantora_run("--hang-timeout", value, "--", "python", STUCK, "--mode", "wait", timeout=60)
    assert proc.returncode == 2
    assert "Invalid value for '--hang-timeout'" in proc.stderr and "positive" in proc.stderr
    assert "[rank0]:" not in proc.stdout + proc.stderr                  # nothing started


@pytest.mark.parametrize("var", ["PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"])
def test_an_allocator_key_pytorch_does_not_know_is_refused_before_anything_starts(tmp_path, var):
    trace = tmp_path / "t.h5"
    proc = phantora_run("--gpus-per-node", "1", "--trace", str(trace), "--", "python", "-c", "print('ran')",
                        timeout=60, env_extra={var: "expandable_segments:True,foo:1"})
    assert proc.returncode == 1, proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("Error:")]
    assert len(errors) == 1 and "'foo'" in errors[0] and var in errors[0], proc.stderr
    assert "ran" not in proc.stdout and "Traceback" not in proc.stderr and not trace.exists()


def test_too_many_rank_processes_refused_unless_forced():
    # 1024 nodes x 8 GPUs, one process each: far above any machine these tests run on
    proc = phantora_run("--nodes", "1024", "--no-trace", "--", "python", STUCK, "--mode", "wait", timeout=120)
    assert proc.returncode == 1
    assert "8192 rank processes is far more than this machine holds" in proc.stderr
    assert "--ranks auto" in proc.stderr and "--force-ranks" in proc.stderr


def test_process_capacity_rule():
    all8, all40, auto = (RankPlan(list(range(n)), list(range(n)), "all") for n in (8, 40, 1))
    # 4 per core, 0.5 GiB of available memory each: the smaller of the two
    assert process_capacity(cpus=2, memory=64 << 30)[0] == 8
    assert process_capacity(cpus=16, memory=2 << 30)[0] == 4
    assert check_process_count(all8, cpus=2, memory=64 << 30) is None
    warning = check_process_count(all8, cpus=1, memory=64 << 30)            # capacity 4: warned
    assert "8 rank processes is more than this machine holds (about 4" in warning and "--ranks auto" in warning
    with pytest.raises(PhantoraError, match="--force-ranks"):
        check_process_count(all40, cpus=2, memory=64 << 30)                # capacity 8, 40 > 4 x 8
    assert "more than this machine holds" in check_process_count(all40, force=True, cpus=2, memory=64 << 30)
    assert check_process_count(auto, cpus=1, memory=1 << 30) is None


def _line_of(path: str, text: str) -> int:
    return next(i for i, ln in enumerate(Path(path).read_text().splitlines(), 1) if text in ln)


def test_hang_report_shows_where_the_silent_rank_is(tmp_path):
    trace = tmp_path / "hang.h5"
    # 30 s: a rank still importing torch on a loaded machine must not be taken for the hang (10 s was, once)
    proc = phantora_run("--gpus-per-node", "2", "--hang-timeout", "30", "--trace", str(trace), "--", "python", FAIL,
                        "--mode", "hang")
    assert proc.returncode == 1
    loop = {_line_of(FAIL, "while True:"), _line_of(FAIL, "sum(range(10000))")}
    assert any(f"rank 1 is at {FAIL}:{n} in <module>" in proc.stderr for n in loop), proc.stderr[-3000:]
    assert "Python stack of its main thread" in proc.stderr
    with TraceReader(trace) as rd:
        assert "rank 1 is at" in rd.error                  # the trace's error holds the report too


def test_mismatch_report_names_where_each_rank_issued_the_collective():
    proc = phantora_run("--gpus-per-node", "2", "--no-trace", "--", "python", FAIL, "--mode", "mismatch")
    assert proc.returncode == 1
    issued = _line_of(FAIL, "dist.all_reduce(x)")
    assert "mismatched collectives" in proc.stderr
    for rank, nbytes in ((0, 4096), (1, 8192)):
        assert f"rank {rank} is at {FAIL}:" in proc.stderr, proc.stderr[-3000:]
        assert f"it issued all_reduce #1 on group 0 ({nbytes} B) at {FAIL}:{issued} in <module>" in proc.stderr



def test_mismatch_of_ranks_that_then_finish_is_the_error(tmp_path):
    """Ranks that issue mismatched collectives asynchronously and run on to the end of their program (exit code 0)
    before the engine compares them: the report is the mismatch, not "rank 0 exited (code 0) before its program
    finished" (it had finished)."""
    script = tmp_path / "mismatch_exit.py"
    script.write_text("import torch, torch.distributed as dist\n"
                      "dist.init_process_group('nccl'); r = dist.get_rank(); torch.cuda.set_device(r)\n"
                      "x = torch.empty(1000 if r == 0 else 2000, device='cuda')\n"
                      "dist.all_reduce(x)\n"
                      "print('done', r, flush=True)\n")
    proc = phantora_run("--gpus-per-node", "2", "--no-trace", "--", "python", str(script))
    assert proc.returncode == 1
    failed = [ln for ln in proc.stderr.splitlines() if "the run failed" in ln]
    assert len(failed) == 1 and "mismatched collectives" in failed[0], proc.stderr[-3000:]
    assert "before its program finished" not in proc.stderr


DUPLICATE = """\
import os
if os.environ.get("VISIBLE"):
    os.environ["CUDA_VISIBLE_DEVICES"] = os.environ["LOCAL_RANK"]
import torch
import torch.distributed as dist
dist.init_process_group("nccl")
if os.environ.get("SET_DEVICE"):
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
if os.environ.get("MESH"):
    from torch.distributed.device_mesh import init_device_mesh
    init_device_mesh("cuda", (2,))
x = torch.ones(8, device="cuda")
dist.all_reduce(x)
print("RESULT", dist.get_rank(), torch.cuda.current_device(), x.tolist())
"""


def test_two_ranks_of_a_node_on_one_gpu_fail_as_nccl_refuses_them(tmp_path):
    # ncclCommInitRank (NCCL src/init.cc) compares the ranks' host hashes and PCI bus ids: two ranks of one host on
    # one GPU are ncclInvalidUsage, "Duplicate GPU detected : rank A and rank B both on CUDA device ...", raised by
    # ProcessGroupNCCL as DistBackendError at the group's first collective (its communicator is made lazily)
    script = tmp_path / "duplicate.py"
    script.write_text(DUPLICATE)
    proc = phantora_run("--gpus-per-node", "2", "--no-trace", "--", "python", str(script))
    assert proc.returncode == 1, proc.stdout[-2000:]
    assert "Duplicate GPU detected" in proc.stderr and "both on CUDA device 0" in proc.stderr, proc.stderr[-3000:]
    assert "ranks 0 and 1 of node 0" in proc.stderr or "ranks 1 and 0 of node 0" in proc.stderr
    assert "RESULT" not in proc.stdout
    # one process per GPU: the same program runs with set_device, with a DeviceMesh made before CUDA is used (its
    # world setup sets the device from LOCAL_RANK when CUDA is not initialised: torch/distributed/device_mesh.py),
    # and with each process shown only its own GPU (CUDA_VISIBLE_DEVICES); two ranks on device 0 of two nodes too
    two = ("--gpus-per-node", "2")
    for args, env, own in ((two, {"SET_DEVICE": "1"}, True), (two, {"MESH": "1"}, True), (two, {"VISIBLE": "1"}, False),
                           (("--nodes", "2", "--gpus-per-node", "1"), {}, False)):
        proc = phantora_run(*args, "--no-trace", "--", "python", str(script), env_extra=env)
        assert proc.returncode == 0, (env, proc.stderr[-3000:])
        lines = sorted(line.split("RESULT ", 1)[1] for line in proc.stdout.splitlines() if "RESULT " in line)
        assert lines == [f"{r} {r if own else 0} {[2.0] * 8}" for r in (0, 1)], (env, proc.stdout[-2000:])


def test_deadlock_report_shows_each_rank_and_its_transfer():
    proc = phantora_run("--gpus-per-node", "2", "--no-trace", "--", "python", STUCK, "--mode", "deadlock")
    assert proc.returncode == 1
    assert "the simulated program is stuck" in proc.stderr
    recv = _line_of(STUCK, "dist.recv(")
    for rank in (0, 1):
        assert f"its recv of 4096 B from rank {1 - rank} (group 0) was issued at {STUCK}:{recv}" in proc.stderr, \
            proc.stderr[-3000:]
        # a receive of at most 32 KiB carries values: the host waits for it there (docs/live-runs.md)
        assert f"rank {rank} is at {STUCK}:{recv} in <module>" in proc.stderr


def test_stale_run_folders_are_those_of_dead_launchers_of_this_host(tmp_path):
    import socket

    from phantora.live.server import clean_stale_run_dirs

    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = int(done.stdout)
    host = socket.gethostname()
    for name, content in (("dead", f"{dead} {host}"), ("alive", f"{os.getpid()} {host}"),
                          ("elsewhere", f"{dead} another-host"), ("no-pid", None)):
        d = tmp_path / f"phantora-run-{name}"
        d.mkdir()
        (d / "engine.sock").write_text("")
        if content is not None:
            (d / "launcher.pid").write_text(content + "\n")
    removed = clean_stale_run_dirs(str(tmp_path))
    assert removed == [str(tmp_path / "phantora-run-dead")]
    assert _run_dirs(tmp_path) == ["phantora-run-alive", "phantora-run-elsewhere", "phantora-run-no-pid"]
