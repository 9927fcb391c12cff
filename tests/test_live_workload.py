"""The reference workload (presets/workloads/llama.py) under `phantora run`: every parallelism mode runs, and the
numbers behave physically.

- twice the batch is twice the matmul work: exactly twice the FLOPs, and about twice the simulated time;
- tensor parallelism adds all-reduces of exactly batch x sequence x dim bf16 activations, as many per iteration as the
  column/row-wise plan implies (one forward all-reduce per row-wise module, one backward all-reduce per column-wise
  module's replicated input, Megatron's f/g operators applied module by module);
- a slower inter-node network slows a run whose data parallelism crosses nodes, and leaves a single-node run exactly
  as it was (replays of the live traces).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from phantora.replay import replay
from phantora.trace.reader import TraceReader

ROOT = Path(__file__).resolve().parent.parent
WORKLOAD = ROOT / "presets" / "workloads" / "llama.py"
DETERMINISTIC = ("--set", "host.cpu_time_scale=0")


def live(tmp_path: Path, name: str, gpus: int, *args: str, nodes: int = 1, ranks: str = "all",
         model: str = "llama-tiny", extra: tuple[str, ...] = ()) -> tuple[dict, dict, Path]:
    trace = tmp_path / f"{name}.h5"
    js = tmp_path / f"{name}.json"
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    cmd = [sys.executable, "-m", "phantora.cli", "run", "--nodes", str(nodes), "--gpus-per-node", str(gpus),
           "--ranks", ranks, *DETERMINISTIC, *extra, "--trace", str(trace), "--summary-json", str(js), "--",
           "python", str(WORKLOAD), "--model", model, *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=str(ROOT), env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(ln for ln in proc.stdout.splitlines() if "SUMMARY " in ln)
    return json.loads(line.split("SUMMARY ", 1)[1]), json.loads(js.read_text()), trace


TINY = ("--layers", "2", "--batch", "2", "--seq", "256", "--steps", "3")


@pytest.mark.parametrize("name,gpus,ranks,args", [
    ("ddp", 2, "all", ("--dp-mode", "ddp")),
    ("fsdp-ac", 2, "all", ("--dp-mode", "fsdp", "--ac", "full")),
    ("pp", 2, "all", ("--pp", "2")),
    pytest.param("tp2-fsdp2", 4, "all", ("--tp", "2", "--dp-mode", "fsdp"), marks=pytest.mark.slow),
    pytest.param("pp2-fsdp2-auto", 4, "auto", ("--pp", "2", "--dp-mode", "fsdp"), marks=pytest.mark.slow),
])
def test_every_mode_runs_and_reports_its_iterations(tmp_path, name, gpus, ranks, args):
    script, summary, trace = live(tmp_path, name, gpus, *TINY, *args, ranks=ranks)
    assert summary["error"] is None
    assert len(summary["iterations_s"]) == 2                  # 3 optimizer steps: 2 iterations between marks
    assert summary["iteration_s"] > 0 and summary["max_peak_memory_bytes"] > 0
    assert script["config"]["world_size"] == gpus
    # the script's own clock is the virtual one: its steps last about as long as the engine's iterations
    # (its window runs from a synchronize to the next, the engine's from one optimizer step to the next)
    assert script["median_step_s"] == pytest.approx(summary["iteration_s"], rel=0.25)
    with TraceReader(trace) as rd:
        assert rd.complete and sorted(rd.ranks) == sorted(summary["simulated_ranks"])
        assert rd.meta["complete_simulation"] is True      # every simulated op has its row (pp: batched p2p)


def _matmuls_per_iteration(trace: Path) -> tuple[float, float]:
    """(FLOPs, seconds) of the matmul kernels of rank 0 between its first and last iteration mark, per iteration."""
    import numpy as np

    from phantora.engine.ops import OpKind

    with TraceReader(trace) as rd:
        ops = rd.ops(0)
        names = rd.names
        marks = rd.iterations(0, ops)
        window = ops[(ops["issue"] >= marks[0]) & (ops["issue"] < marks[-1]) & (ops["kind"] == int(OpKind.KERNEL))]
        mm = np.array(["mm" in names[i].split(".")[1] if "." in names[i] else False for i in window["name"]], bool)
        n = len(marks) - 1
        return float(window["flops"][mm].sum()) / n, float(window["duration"][mm].sum()) / n


def test_twice_the_batch_is_twice_the_compute(tmp_path):
    model = tmp_path / "medium.toml"
    model.write_text('name = "medium"\nfamily = "llama3"\ndim = 2048\nn_layers = 2\nn_heads = 16\nn_kv_heads = 8\n'
                     'vocab_size = 4096\nffn_dim = 5632\nrope_theta = 500000.0\nnorm_eps = 1e-5\n')
    flops, seconds = {}, {}
    for batch in (4, 8):
        _, summary, trace = live(tmp_path, f"b{batch}", 2, "--dp-mode", "ddp", "--batch", str(batch), "--seq", "1024",
                                 "--steps", "3", model=str(model))
        flops[batch], seconds[batch] = _matmuls_per_iteration(trace)
    # every matmul of the forward and backward passes has the tokens as a dimension: exactly twice the FLOPs
    assert flops[8] / flops[4] == pytest.approx(2.0, rel=1e-9)
    # and, compute-bound at these sizes, about twice the time (larger matmuls run at equal or higher efficiency)
    assert 1.8 <= seconds[8] / seconds[4] <= 2.0 + 1e-9


def test_tensor_parallel_all_reduces_have_the_expected_size_and_count(tmp_path):
    layers, batch, seq, dim, steps = 2, 2, 256, 256, 3         # llama-tiny: dim 256
    _, summary, trace = live(tmp_path, "tp", 2, "--tp", "2", "--layers", str(layers), "--batch", str(batch),
                             "--seq", str(seq), "--steps", str(steps))
    activation = batch * seq * dim * 2                         # bf16
    with TraceReader(trace) as rd:
        names = rd.names
        count = Counter((names[c["name"]], int(c["nbytes"])) for c in rd.collectives)
    # per layer: forward all-reduces after the row-wise wo and w2; backward ones for the replicated inputs of the
    # column-wise wq, wk, wv, w1, w3; plus the row-wise embedding (forward) and column-wise output (backward)
    per_step = layers * (2 + 5) + 2
    assert count[("all_reduce", activation)] == per_step * steps
    assert not any(name in ("all_gather", "reduce_scatter") for name, _ in count)   # no data parallelism


def test_slower_inter_node_network_slows_only_runs_that_cross_nodes(tmp_path):
    args = ("--dp-mode", "fsdp", "--layers", "2", "--batch", "2", "--seq", "256", "--steps", "3")
    _, cross, cross_trace = live(tmp_path, "cross", 1, *args, nodes=2)
    _, local, local_trace = live(tmp_path, "local", 2, *args, nodes=1)
    slow = ("net.inter_node_gbps=5",)
    cross_slow = replay(cross_trace, overrides=slow)
    local_slow = replay(local_trace, overrides=slow)
    assert cross_slow.iteration_s > cross["iteration_s"] * 1.05
    assert local_slow.iterations_s == pytest.approx(local["iterations_s"], rel=1e-12)
