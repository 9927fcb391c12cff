"""torch's DistributedDataParallel under `phantora run`: gradients reduced in buckets while the backward pass runs
(PyTorch's DDP design: "overlapping computation with communication", bucket_cap_mb), and find_unused_parameters
and static_graph accepted (docs/stubs.md)."""

from __future__ import annotations

import json

import numpy as np

from phantora.engine.ops import OpKind
from phantora.trace.reader import TraceReader
from test_live_run import SCRIPTS, phantora_run

DIM, LAYERS = 4096, 6          # each weight's gradient (32 MiB in bf16) fills a 25 MiB bucket by itself


def run(tmp_path, *extra: str):
    trace = tmp_path / "ddp.h5"
    summary = tmp_path / "s.json"
    proc = phantora_run("--gpus-per-node", "2", "--trace", str(trace), "--summary-json", str(summary), "--",
                        "python", str(SCRIPTS / "live_ddp.py"), "--ddp", "--dim", str(DIM), "--layers", str(LAYERS),
                        *extra)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, trace, json.loads(summary.read_text())


def test_ddp_reduces_its_buckets_while_the_backward_pass_runs(tmp_path):
    _, trace, summary = run(tmp_path)
    grad = DIM * DIM * 2
    with TraceReader(trace) as rd:
        ops = rd.ops(0)
        marks = rd.iterations(0, ops)
        colls = rd.collectives
        names = rd.names
        ar = colls[[names[i] == "all_reduce" for i in colls["name"]]]
        last = ar[(ar["start"] >= marks[-2]) & (ar["start"] < marks[-1])]
        kernels = ops[(ops["kind"] == int(OpKind.KERNEL)) & (ops["start"] >= marks[-2]) & (ops["start"] < marks[-1])]
    # one bucket per weight, as bucket_cap_mb (25 MiB) makes them for 32 MiB gradients
    assert len(last) == LAYERS and np.all(last["nbytes"] == grad)
    # the first buckets are reduced while later layers' gradients are still computed: before the last GEMM ends
    mm_end = kernels["end"][[names[i].startswith("aten.mm") for i in kernels["name"]]].max()
    assert np.sum(last["start"] < mm_end) >= LAYERS - 1
    # so most of the communication is hidden behind the backward pass
    assert summary["exposed_communication_s"] < 0.5 * summary["communication_s"]


def test_find_unused_parameters_runs_and_says_how_it_is_simulated(tmp_path):
    proc, _, summary = run(tmp_path, "--find-unused", "--steps", "3")
    assert "DistributedDataParallel(find_unused_parameters=True): the parameters the forward pass did not use" \
        in proc.stderr
    assert summary["iteration_s"] > 0


def test_static_graph_runs_and_reduces_as_the_default_after_its_first_step(tmp_path):
    """static_graph=True stopped in the Reducer's first backward pass (a C++ check of two host tensors' data
    pointers). It runs, and from the second step it reduces in the same buckets, overlapped the same way, as
    without it (a GPU run's first static-graph step reduces after the backward pass instead: said once)."""
    (tmp_path / "static").mkdir()
    (tmp_path / "default").mkdir()
    proc, static, _ = run(tmp_path / "static", "--static-graph", "--steps", "3")
    assert "static_graph=True" in proc.stderr
    _, default, _ = run(tmp_path / "default", "--steps", "3")
    with TraceReader(static) as a, TraceReader(default) as b:
        assert np.array_equal(np.diff(a.iterations(0))[1:], np.diff(b.iterations(0))[1:])


def test_asking_for_a_collective_s_future_does_not_hold_up_the_stream(tmp_path):
    proc = phantora_run("--gpus-per-node", "2", "--no-trace", "--", "python", str(SCRIPTS / "work_future.py"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    (t,) = [json.loads(ln.split("RESULT ", 1)[1]) for ln in proc.stdout.splitlines() if "RESULT " in ln]
    # the all-reduce overlaps the GEMMs whether or not its future is asked for (the call itself costs the host a
    # few microseconds); made synchronous it does not
    assert t["async"] < t["sync"]
    assert abs(t["future"] - t["async"]) < 0.1 * (t["sync"] - t["async"])
