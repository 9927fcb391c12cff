"""The modelled host CPU (phantora/hostcpu.py, stubs/phantora_stubs/clock.py, csrc/host_counter.cpp).

What must hold: the host work is counted exactly (a Python call is one call), the counts do not depend on memory
addresses or on the machine's load (a run beside CPU-burning processes gives bit-identical simulated times), a replay
prices the counted work again for another host, and the default prices reproduce the host-bound steps measured on a
GPU host (groundtruth/hostcpu/).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import h5py
import numpy as np
import pytest

from phantora.cluster import HostSpec, load_cluster
from phantora.engine.ops import OpKind
from phantora.errors import PresetError
from phantora.hostcpu import HostCosts
from phantora.live.summary import HOST_BOUND_SHARE
from phantora.probes.hostcpu import configurations, nnls
from phantora.replay import replay
from phantora.trace.reader import TraceReader

from test_live_run import phantora_run

ROOT = Path(__file__).resolve().parent.parent
WORKLOAD = str(ROOT / "presets" / "workloads" / "llama.py")
TP_STEP = ("--nodes", "1", "--gpus-per-node", "2", "--ranks", "all", "--quiet", "--", "python", WORKLOAD,
           "--model", "llama-tiny", "--tp", "2", "--seq", "256", "--steps", "4")

COUNTER_SCRIPT = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, sys.argv[1])
    from phantora_stubs.clock import METER
    from phantora.hostcpu import HostCosts

    METER.use_model(HostCosts(1e-9, 1e-9, 1e-6))

    def f(x):
        return x

    def g(x):                       # one call, like f, and three lines more
        y = x
        y += 1
        y *= 2
        return y

    class Key:
        def __init__(self, n):
            self.n = n
        def __hash__(self):          # every key collides: a lookup compares with __eq__ as often as keys collide
            return 0
        def __eq__(self, other):
            return isinstance(other, Key) and self.n == other.n

    def measure(work, *a):
        METER.reset()
        work(*a)
        METER.enter()
        METER.claim()
        METER.exit()
        return METER.last_counts

    def calls(n):
        for i in range(n):
            f(i)

    def heavy_calls(n):
        for i in range(n):
            g(i)

    def builtins(n):
        for i in range(n):
            len(())

    def lookups(table, probe, n):
        for _ in range(n):
            probe in table

    class Cycle:
        def __init__(self):
            self.me = self
            self.parts = [1, [2]]

    def garbage(n):                 # cyclic garbage: collections start at moments set by the thresholds
        keep = []
        for i in range(n):
            Cycle()
            keep.append([i, [i]])
        return keep

    import gc
    gc.disable()
    collections = [measure(garbage, 3000)]
    gc.enable()
    for threshold in (1, 2, 3, 10, 700):
        gc.set_threshold(threshold, 2, 2)
        collections.append(measure(garbage, 3000))
    gc.set_threshold(700, 10, 10)

    few = {Key(0): 0}
    many = {Key(i): i for i in range(64)}
    out = {"calls": [measure(calls, 100), measure(calls, 300)], "heavy": [measure(heavy_calls, 100)],
           "builtins": [measure(builtins, 100), measure(builtins, 300)],
           "lookups": [measure(lookups, few, Key(0), 50), measure(lookups, many, Key(63), 50)],
           "gc": collections}
    print(json.dumps(out))
""")


def run_counter() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-c", COUNTER_SCRIPT, str(ROOT / "stubs")], capture_output=True, text=True,
                          env=env, timeout=120, cwd=str(ROOT))
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_counter_counts_the_same_whenever_the_garbage_collector_runs():
    """A collection starts when the allocations of every thread (the stubs' too) reach a threshold: at any moment,
    in the framework's code, in the stubs, or as they switch counting on or off. Nothing it runs is counted, and
    the program's counts are those of a run without collections, whatever the thresholds."""
    out = run_counter()
    quiet, *collected = out["gc"]
    assert quiet[0] >= 3000 and quiet[3] > 3 * 3000            # the program's own calls and lines were counted
    for counts in collected:
        assert counts == quiet


def test_counter_counts_each_call_once_and_leaves_key_comparisons_out():
    out = run_counter()
    # what the program does between two entries, exactly: 100 calls of f; 100 calls of len; lookups that call
    # nothing counted (the entry frames into the meter charged back)
    assert out["calls"][0][:2] == [100, 0]
    assert out["builtins"][0][:2] == [0, 100]
    assert out["lookups"][0][:2] == [0, 0]
    # lines (the last count): the line that calls the work, the loop's line 101 times (once more to leave it), and
    # per iteration the line calling f and f's own line; the lines that reach the meter charged back
    assert out["calls"][0][3] == 1 + 101 + 2 * 100
    (py1, c1, _, l1), (py3, c3, _, l3) = out["calls"]
    assert py3 - py1 == 200               # 200 more calls of f, nothing else differs
    assert c3 - c1 == 0
    assert l3 - l1 == 3 * 200             # 200 more iterations of three lines
    (hpy, hc, _, hl), = out["heavy"]
    assert (hpy, hc) == (100, 0) and hl == l1 + 3 * 100      # as many calls as f, three lines more per call
    (bpy1, bc1, _, bl1), (bpy3, bc3, _, bl3) = out["builtins"]
    assert bc3 - bc1 == 200 and bpy3 == bpy1 and bl3 - bl1 == 2 * 200
    (lpy_few, lc_few, _, ll_few), (lpy_many, lc_many, _, ll_many) = out["lookups"]
    # a lookup among 64 colliding keys calls Key.__eq__ up to 64 times, among one key once: neither is counted,
    # nor the lines it runs
    assert (lpy_few, lc_few, ll_few) == (lpy_many, lc_many, ll_many)


def run_quiet_and_busy(tmp_path: Path, args: tuple[str, ...], timeout: int = 300) -> tuple[Path, Path]:
    """`phantora run ARGS` twice: alone, then beside one CPU-burning process per core; the two traces."""
    quiet = tmp_path / "quiet.h5"
    busy = tmp_path / "busy.h5"
    proc = phantora_run("--trace", str(quiet), *args, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
    try:
        proc = phantora_run("--trace", str(busy), *args, timeout=timeout)
    finally:
        for b in burners:
            b.kill()
            b.wait()
    assert proc.returncode == 0, proc.stderr[-3000:]
    return quiet, busy


def test_tp_step_is_bit_identical_beside_busy_processes(tmp_path):
    quiet, busy = run_quiet_and_busy(tmp_path, TP_STEP)
    with TraceReader(quiet) as a, TraceReader(busy) as b:
        assert a.meta["host_cpu"]["mode"] == "model"
        for r in a.ranks:
            ta, tb = a.iterations(r), b.iterations(r)
            assert len(ta) >= 3
            assert np.array_equal(ta, tb)                     # bit-identical, not merely close
            oa, ob = a.ops(r), b.ops(r)
            for col in ("host_py", "host_c", "host_disp", "host_line"):
                assert np.array_equal(oa[col], ob[col]), col
            assert oa["host_py"].sum() > 0 and oa["host_disp"].sum() > 0 and oa["host_line"].sum() > 0


def test_replay_prices_the_counted_work_for_another_host(tmp_path):
    trace = tmp_path / "tp.h5"
    proc = phantora_run("--trace", str(trace), *TP_STEP)
    assert proc.returncode == 0, proc.stderr[-3000:]
    same = replay(trace)
    assert same.iteration_s == pytest.approx(same.recorded_iteration_s, rel=1e-12)   # recorded prices: the run
    base = HostSpec()
    slower = replay(trace, overrides=(f"host.py_call_ns={base.py_call_ns + 500}",
                                      f"host.dispatch_us={base.dispatch_us * 2}",
                                      f"host.py_line_ns={base.py_line_ns + 50}"), out=str(tmp_path / "slow.h5"))
    costs = HostCosts((base.py_call_ns + 500) * 1e-9, base.c_call_ns * 1e-9, base.dispatch_us * 2e-6,
                      (base.py_line_ns + 50) * 1e-9)
    extras = []
    with TraceReader(trace) as before, TraceReader(tmp_path / "slow.h5") as after:
        for rank in before.ranks:
            ops = before.ops(rank)
            counts = ops["host_py"], ops["host_c"], ops["host_disp"], ops["host_line"]
            # the counted work priced anew; what is not counted work (a sleep) stays as recorded
            expect = ops["cpu_delta"] + costs.seconds_of(*counts) - HostCosts.from_spec(base).seconds_of(*counts)
            assert np.allclose(after.ops(rank)["cpu_delta"], expect, rtol=1e-12, atol=1e-15)
            marks = np.nonzero(ops["kind"] == 12)[0]          # OpKind.ITER_MARK
            window = slice(marks[-2] + 1, marks[-1] + 1)
            extras.append(float((expect[window] - ops["cpu_delta"][window]).sum()))
    assert min(extras) > 0
    # the last step costs more, by at most the extra host time of its ops (its GPU work is unchanged)
    grown = slower.iterations_s[-1] - same.iterations_s[-1]
    assert 0 < grown <= max(extras) * (1 + 1e-9)

    # A tiny model's TP step is host-bound on a real GPU host (its kernels finish before the host issues the next:
    # groundtruth/hostcpu/), and the reports say so; priced as a host with no framework overhead it is not.
    assert "host-bound" in proc.stdout + proc.stderr
    assert same.summary["host_bound_share"] >= HOST_BOUND_SHARE
    free = replay(trace, overrides=("host.py_call_ns=0", "host.c_call_ns=0", "host.dispatch_us=0",
                                    "host.py_line_ns=0", "host.launch_overhead_us=0"),
                  out=str(tmp_path / "free.h5"))
    assert free.summary["host_bound_share"] < same.summary["host_bound_share"]


def test_replay_of_a_trace_counted_before_lines_were(tmp_path):
    """A trace from before lines were counted (no `host_line` column, no `py_line_ns` price) knows its Python as calls:
    a replay reproduces it, also under prices that leave calls to the lines, and prices its calls when told to."""
    trace = tmp_path / "calls.h5"
    proc = phantora_run("--trace", str(trace), "--set", "host.py_call_ns=1258", "--set", "host.py_line_ns=0",
                        "--set", "host.dispatch_us=2.6", *TP_STEP)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with h5py.File(trace, "a") as f:                   # as an older writer left it
        meta = json.loads(f["meta"][()])
        del meta["host_cpu"]["py_line_ns"]
        del meta["cluster"]["host"]["py_line_ns"]
        del f["meta"]
        f["meta"] = json.dumps(meta)
        for r in f["ranks"]:
            rows = f[f"ranks/{r}/ops"][()]
            older = np.dtype([d for d in rows.dtype.descr if d[0] != "host_line"])
            table = np.zeros(len(rows), older)
            for name in older.names:
                table[name] = rows[name]
            del f[f"ranks/{r}/ops"]
            f.create_dataset(f"ranks/{r}/ops", data=table, chunks=True, maxshape=(None,))
    same = replay(trace)
    assert same.iterations_s == pytest.approx(same.recorded_iterations_s, rel=1e-12)
    lines_only = replay(trace, overrides=("host.py_call_ns=0", "host.py_line_ns=400"))
    assert lines_only.iterations_s == pytest.approx(same.iterations_s, rel=1e-12)     # its calls keep their price
    dearer = replay(trace, overrides=("host.py_call_ns=2516",))
    assert dearer.iteration_s > same.iteration_s


def test_measured_mode_is_kept_and_named(tmp_path):
    trace = tmp_path / "m.h5"
    proc = phantora_run("--trace", str(trace), "--host-cpu", "measured", *TP_STEP)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "measured on this machine" in proc.stdout
    with TraceReader(trace) as r:
        assert r.meta["host_cpu"]["mode"] == "measured"
        assert r.ops(0)["host_py"].sum() == 0 and r.ops(0)["cpu_delta"].sum() > 0


@pytest.mark.parametrize("key, value", [("py_call_ns", "-1"), ("dispatch_us", "nan"), ("c_call_ns", "inf"),
                                        ("py_line_ns", "-0.5")])
def test_host_prices_are_checked(key, value):
    with pytest.raises(PresetError, match=f"host.{key}"):
        load_cluster("h100-hgx", overrides=[f"host.{key}={value}"])


def test_the_process_group_s_own_python_is_not_the_framework_s(tmp_path):
    """An all-reduce loop on a small tensor with a known value (whose value the stubs exchange, in Python) and the
    same loop on a large tensor count the same host work: the simulated process group stands for C++."""
    trace = tmp_path / "pg.h5"
    proc = phantora_run("--gpus-per-node", "2", "--quiet", "--trace", str(trace), "--", "python",
                        str(ROOT / "tests" / "scripts" / "pg_uncounted.py"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    with TraceReader(trace) as r:
        ops = r.ops(0)
    syncs = np.nonzero(ops["kind"] == int(OpKind.SYNC_DEVICE))[0]
    assert len(syncs) >= 3
    windows = [ops[syncs[i] + 1: syncs[i + 1] + 1] for i in (len(syncs) - 3, len(syncs) - 2)]
    for w in windows:
        assert (w["kind"] == int(OpKind.COLLECTIVE)).sum() == 20
    small, large = ({c: int(w[c].sum()) for c in ("host_py", "host_c", "host_disp", "host_line")} for w in windows)
    assert small == large and small["host_line"] > 0


def test_default_prices_reproduce_the_measured_host_bound_steps():
    """groundtruth/hostcpu/fit-*.json: the counted work per step of each configuration measured on a GPU host and its
    measured (host-bound) step time. The default [host] prices must reproduce them as well as the fit does."""
    fit = json.loads((ROOT / "groundtruth" / "hostcpu" / "fit-h200x2.json").read_text())
    host = HostSpec()
    costs = HostCosts.from_spec(host)
    errors = []
    for row in fit["rows"]:
        model = (costs.seconds(row["py_calls"], row["c_calls"], row["dispatches"], row.get("py_lines", 0))
                 + row["launches"] * host.launch_overhead_us * 1e-6)
        errors.append((model - row["measured_s"]) / row["measured_s"])
    errors = np.abs(errors)
    assert errors.mean() <= 0.15 and errors.max() <= 0.40


def test_fit_tools():
    rng = np.random.default_rng(0)
    a = rng.uniform(1, 10, size=(12, 3))
    x = np.array([2.0, 0.0, 0.5])
    assert np.allclose(nnls(a, a @ x), x, atol=1e-9)         # exact non-negative solution recovered
    neg = nnls(a, a @ np.array([1.0, -1.0, 0.0]))            # the least-squares solution is negative: clipped
    assert (neg >= 0).all()
    configs = configurations(ROOT / "groundtruth" / "hostcpu" / "measure.sh")
    names = {c[0] for c in configs}
    for name, gpus, args in configs:
        assert (ROOT / "groundtruth" / "hostcpu" / "h200x2" / f"{name}.json").exists()
        assert gpus in (1, 2) and "--seq" in args
    assert "g2-tp2-none" in names


def test_host_prices_travel_to_the_ranks():
    costs = HostCosts(1.5e-6, 2e-9, 3e-6, 4e-9)
    back = HostCosts.parse_env(costs.env())
    assert back.as_dict() == pytest.approx(costs.as_dict(), rel=1e-12)
    old = HostCosts.parse_env("1258,0,2.6")            # three prices, as before lines were counted: lines free
    assert old.py_line_s == 0 and old.seconds(1, 0, 0, 10 ** 6) == pytest.approx(1258e-9)
    for bad in ("1,2", "1,2,3,4,5", "1,2,3,-4", "1,2,3,x"):
        with pytest.raises(ValueError):
            HostCosts.parse_env(bad)


def test_a_wait_for_another_process_s_file_lock_takes_no_simulated_time(tmp_path):
    """A rank polling for a file lock (Hugging Face datasets' cache) waits for another process's real time: not
    the program's, and charged it would make two runs differ (stubs/phantora_stubs/filelocks.py)."""
    waits = []
    for hold in (0.2, 0.7):
        proc = phantora_run("--gpus-per-node", "1", "--no-trace", "--", "python",
                            str(Path(__file__).parent / "scripts" / "file_lock_wait.py"), str(tmp_path / "x.lock"),
                            str(hold))
        assert proc.returncode == 0, proc.stderr[-3000:]
        (line,) = [ln for ln in proc.stdout.splitlines() if "waited_s" in ln]
        waits.append(json.loads(line.split("]: ", 1)[-1])["waited_s"])
    # the other process held the lock 0.2 and 0.7 s of real time; the wait costs the rank the lock's own few lines
    assert max(waits) < 0.002


def _elapsed(proc) -> float:
    assert proc.returncode == 0, proc.stderr[-3000:]
    (line,) = [ln for ln in proc.stdout.splitlines() if "elapsed_s" in ln]
    return json.loads(line.split("]: ", 1)[-1])["elapsed_s"]


def test_a_wait_for_another_thread_counts_the_same_whoever_gets_there_first():
    """Whether a worker thread finishes before the main thread asks for its result is a race of the simulating
    machine (stubs/phantora_stubs/thread_waits.py): both orders give the same simulated time."""
    script = str(Path(__file__).parent / "scripts" / "thread_race.py")
    times = [_elapsed(phantora_run("--gpus-per-node", "1", "--no-trace", "--", "python", script, first))
             for first in ("worker", "main")]
    assert times[0] == times[1]
    assert times[0] > 0


def test_a_dataset_reshuffled_from_an_earlier_run_s_cache_costs_the_same(tmp_path):
    """Hugging Face datasets would load a shuffle an earlier run cached instead of computing it: different Python,
    so the first run of a command and the second would differ (stubs/phantora_stubs/dataset_caches.py)."""
    pytest.importorskip("datasets")
    data = tmp_path / "data"
    data.mkdir()
    with open(data / "train.jsonl", "w") as f:
        for i in range(64):
            f.write(json.dumps({"text": f"document {i} " * 50}) + "\n")
    cache = tmp_path / "hf-cache"
    env = {"HF_DATASETS_CACHE": str(cache), "HF_DATASETS_OFFLINE": "1"}
    # the dataset itself prepared beforehand, as a trainer finds it on its second run
    prep = subprocess.run([sys.executable, "-c", f"from datasets import load_dataset; load_dataset({str(data)!r})"],
                          env={**os.environ, **env}, capture_output=True, text=True, timeout=300)
    assert prep.returncode == 0, prep.stderr[-3000:]
    script = str(Path(__file__).parent / "scripts" / "dataset_reshuffle.py")
    times = [_elapsed(phantora_run("--gpus-per-node", "1", "--no-trace", "--", "python", script, str(data),
                                   env_extra=env)) for _ in range(2)]
    assert times[0] == times[1]
    assert times[0] > 0


@pytest.mark.parametrize("mode, note", [("numpy", True), ("plain", False)])
def test_work_in_built_in_code_the_counts_do_not_price_is_named(mode, note):
    """numpy work on the main thread between GPU ops costs the host real time that the model, which prices Python
    lines and dispatches, does not see (simulated ~0 ms for ~100 ms of work): the run says so, and its numbers stay
    the counts' (they must not depend on this machine). A loop without such work gets no note."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PHANTORA_") and k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-m", "phantora.cli", "run", "--gpus-per-node", "1", "--no-trace", "--",
                           "python", str(ROOT / "tests" / "scripts" / "uncounted_work.py"), mode],
                          capture_output=True, text=True, timeout=300, cwd=str(ROOT), env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert ("CPU work on this machine between two GPU ops" in proc.stdout + proc.stderr) is note, proc.stderr[-2000:]
