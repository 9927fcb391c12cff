"""A stream's launch queue: a GPU host blocks at the launch after a stream holds `[host] launch_queue` launches, until
the stream's oldest launch completes (measured: groundtruth/streams/README.md, "The launch queue")."""

import json
import textwrap

import pytest

from phantora.cluster import load_cluster
from phantora.engine.core import Engine
from phantora.engine.ops import Memcpy, Op, OpKind as K
from phantora.errors import SimulationError
from phantora.paths import groundtruth_dir

SIDE_BY_SIDE_OFF = tuple(f"streams.{k}=1" for k in ("compute_beside_compute", "compute_beside_memory",
                                                     "memory_beside_compute", "memory_beside_memory"))


def _run(spec, ops):
    recs = []
    eng = Engine(spec, simulated=[0], sink=lambda *a: recs.append(a))
    eng.feed(0, ops)
    eng.close(0)
    assert eng.run()
    return eng, sorted(recs, key=lambda r: r[1])


def _measured():
    with open(groundtruth_dir() / "streams" / "h200" / "launch-queue.json") as f:
        return json.load(f)


@pytest.mark.parametrize("probe", [p for p in _measured() if p["first_blocked"]],
                         ids=lambda p: f"{p['streams']}-streams")
def test_the_first_launch_that_waits_is_the_measured_one(probe):
    """The probe's program (groundtruth/streams/launch_queue.py): a spin kernel on each stream, then one-element adds
    round robin over the streams, each launch timed on the host; the first launch that takes over 200 us waited.
    The spins last what the probe's slowest launch took, the launches the probe's median apart."""
    spec = load_cluster("h200-2gpu-nvlink", overrides=SIDE_BY_SIDE_OFF)
    spin = probe["max_ms"] * 1e-3
    gap = probe["median_us"] * 1e-6
    streams = probe["streams"]
    ops = [Op(K.KERNEL, stream=s, duration=spin) for s in range(streams)]
    ops += [Op(K.KERNEL, stream=i % streams, duration=2e-6, cpu_delta=gap) for i in range(probe["n"])]
    ops.append(Op(K.SYNC_DEVICE))
    eng, recs = _run(spec, ops)
    issues = [r[3] for r in recs[streams:streams + probe["n"]]]
    launch = spec.host.launch_overhead_us * 1e-6
    # the host time of each add's launch: from the end of the previous launch to the end of its own, less the
    # Python work before it
    took = [issues[0] - recs[streams - 1][3] - gap] + [b - a - gap for a, b in zip(issues, issues[1:])]
    blocked = [i for i, t in enumerate(took) if t > 200e-6]
    assert blocked and blocked[0] == probe["first_blocked"]
    # it returned when its stream's spin completed
    first_spin_end = recs[0][5]
    assert issues[blocked[0]] == pytest.approx(first_spin_end + launch)
    # and no launch of the others waited longer than the queue of its stream needs: behind the spins, the adds
    # take 2 us each, faster than the host launches them
    assert max(took) <= spin


def _kinds_measured():
    with open(groundtruth_dir() / "streams" / "h200" / "launch-queue-kinds.json") as f:
        runs = json.load(f)["runs"]
    return list({tuple(r["kinds"]): r for r in runs}.values())      # one run of each kind (both runs agree)


def _command(kind: str) -> Op:
    """What the stubs emit for one command of groundtruth/streams/launch_queue_kinds.py (event 1 was recorded on
    stream 9 before the spin)."""
    return {"kernel": lambda: Op(K.KERNEL, duration=2e-6),
            "record": lambda: Op(K.EVENT_RECORD, arg=2),
            "wait": lambda: Op(K.STREAM_WAIT, arg=1),
            "h2d": lambda: Op(K.MEMCPY, arg=Memcpy.H2D, nbytes=4, duration=2e-6),
            "d2d": lambda: Op(K.MEMCPY, arg=Memcpy.D2D, nbytes=4, duration=2e-6)}[kind]()


@pytest.mark.parametrize("probe", _kinds_measured(), ids=lambda p: "+".join(p["kinds"]))
def test_kernels_and_copies_fill_the_queue_event_records_and_waits_do_not(probe):
    """groundtruth/streams/launch_queue_kinds.py's program: behind a spin kernel, 3,000 commands of one kind (or
    alternating kinds) on one stream; the first that waits is the measured one, or none where none did."""
    spec = load_cluster("h200-2gpu-nvlink")
    gap = probe["median_us"] * 1e-6
    ops = [Op(K.EVENT_RECORD, stream=9, arg=1), Op(K.KERNEL, duration=probe["max_ms"] * 1e-3)]
    for i in range(probe["n"]):
        op = _command(probe["kinds"][i % len(probe["kinds"])])
        op.cpu_delta = gap
        ops.append(op)
    eng, recs = _run(spec, ops + [Op(K.SYNC_DEVICE)])
    issues = [r[3] for r in recs[1:2 + probe["n"]]]
    launch = spec.host.launch_overhead_us * 1e-6
    took = [b - a - gap for a, b in zip(issues, issues[1:])]
    blocked = [i for i, t in enumerate(took) if t > 200e-6 + launch]
    assert (blocked[0] if blocked else None) == probe["first_blocked"]


def test_a_loop_that_never_synchronises_is_held_to_the_gpus_pace():
    """Steps of 100 kernels of 100 us, launched 5 us apart, no host sync: the host issues at most one queue ahead, so
    after the queue fills its steps take the GPU's 10 ms (a host running free would take 0.9 ms)."""
    spec = load_cluster("h200-2gpu-nvlink")
    steps, per = 40, 100
    ops = []
    for _ in range(steps):
        ops += [Op(K.KERNEL, duration=100e-6, cpu_delta=5e-6) for _ in range(per)]
        ops.append(Op(K.CPU))                                   # the host reads its clock at the step's end
    eng, recs = _run(spec, ops + [Op(K.SYNC_DEVICE)])
    host_marks = [r[3] for r in recs if r[2].kind == K.CPU]
    late = [b - a for a, b in zip(host_marks[-10:], host_marks[-9:])]
    assert min(late) == pytest.approx(per * 100e-6, rel=1e-6)
    # and the host was never more than a queue of launches ahead of the GPU
    kernels = [r for r in recs if r[2].kind == K.KERNEL]
    q = spec.host.launch_queue
    for i in range(q, len(kernels)):
        assert kernels[i][3] >= kernels[i - q][5]


def test_no_limit_when_the_queue_is_off():
    spec = load_cluster("h200-2gpu-nvlink", overrides=("host.launch_queue=0",))
    ops = [Op(K.KERNEL, duration=100e-6, cpu_delta=5e-6) for _ in range(3000)] + [Op(K.SYNC_DEVICE)]
    eng, recs = _run(spec, ops)
    launch = spec.host.launch_overhead_us * 1e-6
    assert recs[2999][3] == pytest.approx(3000 * (5e-6 + launch))        # the host never waited
    assert recs[-1][5] == pytest.approx(recs[0][4] + 3000 * 100e-6)       # the GPU ran back to back


def test_a_queue_that_cannot_drain_is_reported():
    """A stream blocked by a collective whose peer never comes, then more launches than it holds."""
    spec = load_cluster("h200-2gpu-nvlink", overrides=("host.launch_queue=4",))
    eng = Engine(spec, sink=lambda *a: None)
    eng.feed(0, [Op(K.COLLECTIVE, name="all_reduce", group=0, nbytes=1 << 20)]
             + [Op(K.KERNEL, duration=1e-6) for _ in range(6)])
    eng.feed(1, [])
    eng.close(0)
    eng.close(1)
    with pytest.raises(SimulationError, match="launch queue is full"):
        eng.run()


def test_a_live_rank_reads_the_time_its_launches_waited(tmp_path):
    """Under `phantora run`, a loop with no host sync prints its own step times: once a stream is full they are the
    GPU's, and they equal the trace's."""
    import subprocess
    import sys
    script = tmp_path / "loop.py"
    script.write_text(textwrap.dedent("""
        import time, torch
        x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
        t = [time.perf_counter()]
        for _ in range(30):
            for _ in range(100):
                y = x @ x
            t.append(time.perf_counter())
        torch.cuda.synchronize()
        print("STEPS", " ".join(repr(b - a) for a, b in zip(t, t[1:])))
    """))
    trace = tmp_path / "loop.h5"
    out = subprocess.run([sys.executable, "-m", "phantora.cli", "run", "--nodes", "1", "--gpus-per-node", "1",
                          "--trace", str(trace), "--",
                          sys.executable, str(script)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    line = next(line for line in out.stdout.splitlines() if "STEPS" in line)
    steps = [float(v) for v in line.split("STEPS", 1)[1].split()]
    from phantora.trace.reader import TraceReader
    with TraceReader(trace) as tr:
        ops = tr.ops(0)
    gemms = ops[ops["kind"] == int(K.KERNEL)]
    gemm = float(gemms["end"][-1] - gemms["start"][-1])
    # the first steps run at the host's pace, the last ones at the GPU's: 100 GEMMs each
    assert steps[0] < 50 * gemm
    assert steps[-1] == pytest.approx(100 * gemm, rel=0.02)


def test_only_threads_that_issue_ops_ask_the_engine_for_their_time(monkeypatch):
    """A rank's connection to the engine belongs to the threads that issue ops: a thread that issues none (tqdm's
    monitor, a logger) reading the clock must not send on it, or its question and the main thread's answers cross
    (a live run hung so). The issuing thread asks after a launch that may have waited."""
    import sys
    import threading
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "stubs"))
    from phantora_stubs import remote

    class Conn:
        def __init__(self):
            self.sent = []

        def send(self, msg):
            self.sent.append(msg[0])

        def recv(self):
            return ("now", (1.0, {0: 0}))

    conn = Conn()
    monkeypatch.setattr(remote, "Client", lambda *a, **k: conn)
    rt = remote.RemoteRuntime("unix:///nowhere", b"k", rank=0, world_size=1, local_rank=0, capacity_bytes=1 << 30,
                              launch_overhead_s=0.0, launch_queue=2)
    for _ in range(3):                                  # the third launch needs the first: not known complete
        rt.submit(Op(K.KERNEL, stream=0, duration=1e-3))
    seen = []
    reader = threading.Thread(target=lambda: seen.append(rt.now()))
    reader.start()
    reader.join()
    assert "now" not in conn.sent                       # the other thread read the clock as it stands
    assert rt.now() == 1.0 and conn.sent[-1] == "now"   # the main thread asked, and took the engine's time
