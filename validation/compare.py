"""Measured against simulated: one row per metric a record measured, and the suite's error statistics.

Errors are signed fractions, (simulated − measured) / measured. Each case has a primary metric, the first of
tokens/s per GPU, iteration time, MFU and memory that its record measured; the suite's average and maximum absolute
error are over the primary metrics of the cases that were compared (the original Phantora reports throughput error
the same way). Every metric's own statistics are in `by_metric`.

OOM: a record that ran out of memory is correct when the simulation ran out too (its row has error 0 and is not part
of the averages); a simulated OOM for a record that fitted, or the reverse, is a mismatch. A simulated MFU is
recomputed from the simulated throughput with the record's own FLOP convention (`metrics.mfu_counts_embedding`), so
that MFU and throughput errors agree when the conventions differ.

Measured spread: a record that gives `metrics.iteration_s_repeats` (the same configuration measured again, on other
runs or hosts) has its iteration-time row carry the fastest and slowest of its runs; `Row.spread_error` is how far
the simulation lies outside that range (signed fraction of the nearer end, 0 inside). It is reported beside the
error against the record, never in its place: the suite's figures stay those against the records.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from phantora.groundtruth.checks import implied_mfu_percent
from phantora.groundtruth.schema import Record

from .runner import SimResult

PRIMARY_ORDER = ("tokens_per_s_per_gpu", "iteration_s", "mfu_percent", "memory_gib", "memory_allocated_gib")
LABELS = {"tokens_per_s_per_gpu": "tok/s/GPU", "iteration_s": "iter (s)", "mfu_percent": "MFU (%)",
          "memory_gib": "mem (GiB)", "memory_allocated_gib": "alloc (GiB)", "oom": "OOM"}


@dataclass
class Row:
    metric: str                    # a metrics key of the record, or "oom"
    measured: float | bool
    simulated: float | bool | None
    error: float | None            # signed fraction; None when there is nothing to compare
    primary: bool = False
    ok: bool = True                # False: OOM mismatch, or no simulated value
    spread: tuple[float, float, int] | None = None   # (fastest, slowest, runs) measured, iteration time only

    @property
    def spread_error(self) -> float | None:
        """How far the simulated value lies outside the measured spread: a signed fraction of the nearer end,
        0.0 inside it; None without a spread or a simulated value."""
        if self.spread is None or not isinstance(self.simulated, (int, float)) or isinstance(self.simulated, bool):
            return None
        lo, hi, _ = self.spread
        if self.simulated < lo:
            return (self.simulated - lo) / lo
        if self.simulated > hi:
            return (self.simulated - hi) / hi
        return 0.0

    def as_dict(self) -> dict[str, Any]:
        out = {"metric": self.metric, "measured": self.measured, "simulated": self.simulated, "error": self.error,
               "primary": self.primary, "ok": self.ok}
        if self.spread is not None:
            out["spread"] = {"fastest": self.spread[0], "slowest": self.spread[1], "runs": self.spread[2],
                             "outside": self.spread_error}
        return out


@dataclass
class CaseResult:
    case: str
    rows: list[Row] = field(default_factory=list)
    sim: SimResult | None = None
    failure: str | None = None     # why the case produced no simulation

    @property
    def primary(self) -> Row | None:
        return next((r for r in self.rows if r.primary), None)

    @property
    def error(self) -> float | None:
        p = self.primary
        return p.error if p is not None and p.metric != "oom" else None

    @property
    def ok(self) -> bool:
        return self.failure is None and all(r.ok for r in self.rows)

    def as_dict(self) -> dict[str, Any]:
        sim = self.sim
        return {"case": self.case, "error": self.error, "ok": self.ok, "failure": self.failure,
                "metric": self.primary.metric if self.primary else None,
                "cost_source": sim.cost_source if sim else None,
                "cost_sources": sim.cost_sources if sim else {},
                "mode": sim.mode if sim else None, "trace": sim.trace if sim else None,
                "wall_s": sim.wall_s if sim else None, "rows": [r.as_dict() for r in self.rows]}


def simulated_value(record: Record, sim: SimResult, metric: str) -> float | None:
    if metric == "tokens_per_s_per_gpu":
        return sim.tokens_per_s_per_gpu
    if metric == "iteration_s":
        if sim.iteration_s is not None:
            return sim.iteration_s
        if sim.tokens_per_s_per_gpu:
            return record.workload.tokens_per_step / (sim.tokens_per_s_per_gpu * record.hardware.gpus)
        return None
    if metric == "mfu_percent":
        if sim.tokens_per_s_per_gpu is not None:
            return implied_mfu_percent(record, sim.tokens_per_s_per_gpu)
        return sim.mfu_percent
    if metric == "memory_gib":
        return sim.memory_gib
    if metric == "memory_allocated_gib":
        return sim.memory_allocated_gib
    raise KeyError(metric)


def compare(record: Record, sim: SimResult) -> list[Row]:
    """The rows comparing what `record` measured with `sim`."""
    m = record.metrics
    if m.oom:
        return [Row("oom", True, sim.oom, 0.0 if sim.oom else None, primary=True, ok=sim.oom)]
    measured = m.measured()
    first = next(k for k in PRIMARY_ORDER if k in measured)
    rows = []
    for key in PRIMARY_ORDER:
        if key not in measured:
            continue
        if sim.oom:
            rows.append(Row(key, measured[key], None, None, primary=key == first, ok=False))
            continue
        value = simulated_value(record, sim, key)
        err = (value - measured[key]) / measured[key] if value is not None else None
        spread = m.iteration_spread() if key == "iteration_s" else None
        rows.append(Row(key, measured[key], value, err, primary=key == first, ok=value is not None, spread=spread))
    if sim.oom:
        rows.append(Row("oom", False, True, None, ok=False))
    return rows


def summarize(results: list[CaseResult]) -> dict[str, Any]:
    """Suite statistics: average and maximum absolute primary error (fractions), counts, per-metric statistics."""
    errors = [abs(r.error) for r in results if r.error is not None]
    worst = max((r for r in results if r.error is not None), key=lambda r: abs(r.error), default=None)
    by_metric: dict[str, dict[str, Any]] = {}
    for r in results:
        for row in r.rows:
            if row.metric == "oom" or row.error is None:
                continue
            by_metric.setdefault(row.metric, []).append(abs(row.error))
    oom_cases = [r for r in results if r.rows and r.rows[0].metric == "oom" and r.rows[0].measured is True]
    spreads = [row.spread_error for r in results for row in r.rows if row.spread_error is not None]
    return {
        "avg_abs_error": sum(errors) / len(errors) if errors else None,
        "max_abs_error": max(errors) if errors else None,
        "max_case": worst.case if worst else None,
        "cases": len(results),
        "compared": len(errors),
        "failed": sum(1 for r in results if r.failure is not None),
        "oom_cases": len(oom_cases),
        "oom_correct": sum(1 for r in oom_cases if r.ok),
        "oom_mismatches": sum(1 for r in results for row in r.rows if row.metric == "oom" and not row.ok),
        "by_metric": {k: {"avg_abs_error": sum(v) / len(v), "max_abs_error": max(v), "n": len(v)}
                      for k, v in by_metric.items()},
        "spread_cases": len(spreads),
        "within_spread": sum(1 for e in spreads if e == 0.0),
    }
