"""Live-run benchmarks (issue targets: Llama-3-8B-shaped FSDP, wall seconds per simulated iteration and peak RSS).

Run with `python -m pytest tests/benchmarks/test_bench_live.py --benchmark-enable -s`; skipped otherwise (each takes
minutes). The figures (`simulation` line of the summary: wall s per iteration, peak RSS of a rank process and of the
engine) are printed and stored in the benchmark's extra_info. Goal for 128 GPUs (`--ranks auto`): ≤ 30 s per
iteration and ≤ 2 GB RSS on a 2-core machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WORKLOAD = ROOT / "presets" / "workloads" / "llama.py"


@pytest.fixture(autouse=True)
def _only_when_benchmarking(request):
    if not request.config.getoption("benchmark_enable", default=False):
        pytest.skip("live benchmarks run only with --benchmark-enable")


def _live(tmp_path: Path, nodes: int, ranks: str) -> dict:
    js = tmp_path / "summary.json"
    seq, steps = 8192, 4
    cmd = [sys.executable, "-m", "phantora.cli", "run", "--cluster", "h100-hgx", "--nodes", str(nodes),
           "--ranks", ranks, "--no-trace", "--quiet", "--summary-json", str(js),
           "--tokens-per-iteration", str(nodes * 8 * seq), "--model", "llama3-8b", "--seq", str(seq),
           "--", "python", str(WORKLOAD), "--model", "llama3-8b", "--dp-mode", "fsdp", "--batch", "1",
           "--seq", str(seq), "--ac", "selective", "--steps", str(steps)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, cwd=str(ROOT), env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr[-3000:]
    print(proc.stdout)
    return json.loads(js.read_text())


@pytest.mark.parametrize("nodes,ranks", [(1, "all"), (16, "auto")], ids=["8gpu-all", "128gpu-auto"])
def test_llama3_8b_fsdp_live(benchmark, tmp_path, nodes, ranks):
    s = benchmark.pedantic(_live, args=(tmp_path, nodes, ranks), rounds=1, iterations=1)
    benchmark.extra_info.update({k: s[k] for k in ("wall_per_iteration_s", "rank_peak_rss_bytes",
                                                   "engine_peak_rss_bytes", "iteration_s", "tokens_per_s_per_gpu",
                                                   "mfu")})
    assert s["iteration_s"] > 0 and s["wall_per_iteration_s"] > 0
