"""Trace throughput benchmarks (pytest-benchmark; skipped timing by default, run with --benchmark-enable).

Targets: at least 1M op rows/s appended and flushed by the writer, at least 500k Op objects/s rebuilt by
`TraceReader.iter_ops`. With timing disabled each benchmark still runs once, as a smoke test.
"""

from __future__ import annotations

import numpy as np
import pytest

from phantora.engine.ops import CostSource, OpKind
from phantora.trace import schema as S
from phantora.trace.reader import TraceReader
from phantora.trace.writer import TraceWriter

N_ROWS = 1 << 18
BATCH = 1 << 14          # rows per flush, about one training iteration of one rank


def training_like_rows(n: int, seed: int = 0) -> np.ndarray:
    """Rows shaped like a training run: one iteration's op pattern repeated, with advancing times."""
    rng = np.random.default_rng(seed)
    period = 500
    kinds = rng.choice([int(k) for k in (OpKind.KERNEL,) * 6 + (OpKind.MEMCPY, OpKind.COLLECTIVE, OpKind.ALLOC,
                                                                 OpKind.FREE, OpKind.EVENT_RECORD, OpKind.CPU)],
                       period)
    idx = np.arange(n) % period
    rows = S.empty_ops(n)
    rows["kind"] = kinds[idx]
    rows["stream"] = (kinds[idx] == int(OpKind.COLLECTIVE)).astype(np.int16)
    rows["name"] = rng.integers(1, 80, period)[idx]
    rows["sig"] = np.where(kinds[idx] == int(OpKind.KERNEL), rng.integers(0, 400, period)[idx], -1)
    rows["cpu_delta"] = rng.exponential(4e-6, n)
    rows["issue"] = np.cumsum(rows["cpu_delta"] + 5e-6)
    rows["duration"] = np.where(kinds[idx] <= int(OpKind.COLLECTIVE), rng.exponential(2e-5, period)[idx], 0.0)
    rows["start"] = rows["issue"] + 1e-5
    rows["end"] = rows["start"] + rows["duration"]
    rows["flops"] = np.where(kinds[idx] == int(OpKind.KERNEL), rng.integers(0, 2 ** 34, period)[idx], 0)
    rows["nbytes"] = rng.integers(0, 2 ** 26, period)[idx]
    rows["mem_delta"] = np.where(kinds[idx] == int(OpKind.ALLOC), rows["nbytes"], 0)
    rows["source"] = np.where(kinds[idx] == int(OpKind.KERNEL), int(CostSource.ROOFLINE), int(CostSource.NONE))
    return rows


@pytest.mark.parametrize("compression", ["gzip", None], ids=["gzip", "raw"])
def test_append_throughput(benchmark, tmp_path, compression):
    """Rows appended, flushed every BATCH rows, and closed; gzip needs about two free cores for the target."""
    rows = training_like_rows(N_ROWS)
    path = tmp_path / "bench.h5"

    def write():
        with TraceWriter(path, {"ranks": [0]}, compression=compression) as w:
            for i in range(1, 80):
                w.add_string(f"kernel_{i}")
            for lo in range(0, N_ROWS, BATCH):
                w.append_ops(0, rows[lo:lo + BATCH])
                w.flush()

    benchmark.pedantic(write, rounds=3, iterations=1)
    with TraceReader(path) as r:
        assert np.array_equal(r.ops(0), rows)
    if not benchmark.disabled:
        rate = N_ROWS / benchmark.stats.stats.min
        benchmark.extra_info["rows_per_s"] = rate
        assert rate >= 1e6, f"{rate:.3g} rows/s appended"


def test_iter_ops_throughput(benchmark, tmp_path):
    rows = training_like_rows(N_ROWS)
    path = tmp_path / "bench.h5"
    with TraceWriter(path, {"ranks": [0]}) as w:
        for i in range(1, 80):
            w.add_string(f"kernel_{i}")
        w.append_ops(0, rows)
    with TraceReader(path) as r:
        ops = benchmark.pedantic(lambda: list(r.iter_ops(0)), rounds=3, iterations=1)
    assert len(ops) == N_ROWS and [int(o.kind) for o in ops[:1000]] == rows["kind"][:1000].tolist()
    if not benchmark.disabled:
        rate = N_ROWS / benchmark.stats.stats.min
        benchmark.extra_info["ops_per_s"] = rate
        assert rate >= 5e5, f"{rate:.3g} ops/s rebuilt"
