"""Case runners: simulate a case and return the simulated metrics, the cost source and the trace.

A runner is any callable `runner(case, workdir) -> SimResult`. `LiveRunner` runs the case's training command under
`phantora run` (representative ranks) and parses the run's summary JSON. `CachedRunner` keeps each case's trace and
summary in a cache folder; once a case has a trace there, it re-validates by replaying the trace
(`phantora.replay.replay`) under the current cost, network and allocator models instead of a new live run. Peak
memory comes from replaying the recorded allocations through the allocator model; a case whose live run ran out of
memory is not replayed (its trace ends at the failed allocation) and keeps the live run's figures.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from phantora.engine.allocator import AllocatorConfig
from phantora.engine.ops import CostSource
from phantora.errors import PhantoraError
from phantora.throughput import tokens_per_s_per_gpu

from .cases import Case

GIB = 2**30
DOMINANT = 0.9        # a cost source with at least this share of kernel time names the case's cost source


class CaseFailed(PhantoraError):
    """The simulation of a case did not produce results."""


@dataclass
class SimResult:
    """Phantora's figures for one case. Percent and GiB as in the records."""
    oom: bool = False
    tokens_per_s_per_gpu: float | None = None
    mfu_percent: float | None = None        # as the simulator reports it (the harness recomputes it per record)
    iteration_s: float | None = None
    memory_gib: float | None = None         # peak reserved memory, largest over simulated ranks
    memory_allocated_gib: float | None = None   # peak allocated memory (max_memory_allocated), largest over ranks
    cost_source: str = "unknown"            # profile | cross-gpu | roofline | measured | recorded | a mix
    cost_sources: dict[str, float] = field(default_factory=dict)   # share of kernel time per cost source
    trace: str | None = None
    mode: str = "live"                      # live | replay
    wall_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


Runner = Callable[[Case, Path], SimResult]


# ------------------------------------------------------------------------------------------------ cost sources
def source_name(value: int) -> str:
    """'profile', 'cross-gpu', 'roofline', ... for a CostSource value."""
    try:
        return CostSource(value).name.lower().replace("_", "-")
    except ValueError:
        return f"source-{value}"


def cost_label(shares: dict[str, float]) -> str:
    """One cost source when it dominates kernel time, else the mix ('profile 70% / roofline 30%')."""
    if not shares:
        return "unknown"
    items = sorted(shares.items(), key=lambda kv: -kv[1])
    if items[0][1] >= DOMINANT:
        return items[0][0]
    return " / ".join(f"{k} {100 * v:.0f}%" for k, v in items if v >= 0.01)


def trace_cost_sources(trace: str | Path) -> dict[str, float]:
    """Share of simulated kernel time per cost source, over all ranks of a trace."""
    from phantora.trace.reader import TraceReader
    from phantora.trace.summary import kernel_time_by_source

    with TraceReader(trace) as reader:
        return source_shares([kernel_time_by_source(reader.ops(r)) for r in reader.ranks])


def source_shares(per_rank: list[dict[int, float]]) -> dict[str, float]:
    """Share of kernel time per cost source name, from each rank's kernel time per source."""
    totals: dict[int, float] = {}
    for times in per_rank:
        for src, t in times.items():
            totals[src] = totals.get(src, 0.0) + t
    whole = sum(totals.values())
    return {source_name(k): v / whole for k, v in sorted(totals.items())} if whole > 0 else {}


# ------------------------------------------------------------------------------------------------ summaries
def parse_summary(summary: dict[str, Any], case: Case) -> SimResult:
    """A `SimResult` from the summary JSON of `phantora run` (phantora/live/summary.py `RunSummary.as_dict`).

    Throughput missing from the summary is derived from the iteration time and the record's tokens per step.
    """
    rec = case.record
    res = SimResult(oom=bool(summary.get("oom", False)))
    it = summary.get("iteration_s")
    res.iteration_s = float(it) if isinstance(it, (int, float)) and it > 0 else None
    lm = rec.workload.task != "other"           # a workload that is not a language model has no tokens or MFU
    tps = summary.get("tokens_per_s_per_gpu")
    if lm and isinstance(tps, (int, float)) and tps > 0:
        res.tokens_per_s_per_gpu = float(tps)
    elif lm and res.iteration_s:
        res.tokens_per_s_per_gpu = tokens_per_s_per_gpu(rec.workload.tokens_per_step, res.iteration_s,
                                                        rec.hardware.gpus)
    mfu = summary.get("mfu")
    if lm and isinstance(mfu, (int, float)):
        res.mfu_percent = 100.0 * float(mfu)
    peak = summary.get("max_peak_memory_bytes")
    if not isinstance(peak, (int, float)) or peak <= 0:
        per_rank = summary.get("peak_memory_bytes") or {}
        values = list(per_rank.values()) if isinstance(per_rank, dict) else list(per_rank)
        peak = max((v for v in values if isinstance(v, (int, float))), default=None)
    if isinstance(peak, (int, float)) and peak > 0:
        res.memory_gib = float(peak) / GIB
    allocated = summary.get("peak_allocated_bytes") or {}
    values = list(allocated.values()) if isinstance(allocated, dict) else list(allocated)
    peak = max((v for v in values if isinstance(v, (int, float))), default=None)
    if isinstance(peak, (int, float)) and peak > 0:
        res.memory_allocated_gib = float(peak) / GIB
    if isinstance(summary.get("trace"), str):
        res.trace = summary["trace"]
    wall = summary.get("wall_s")
    if isinstance(wall, (int, float)):
        res.wall_s = float(wall)
    return res


def _attach_sources(res: SimResult, trace: Path) -> None:
    if res.cost_sources or not trace.exists():
        return
    try:
        res.cost_sources = trace_cost_sources(trace)
    except PhantoraError:
        return
    res.cost_source = cost_label(res.cost_sources)


# ------------------------------------------------------------------------------------------------ live runs
def phantora_executable() -> list[str]:
    """The `phantora` command of this installation (beside the running Python, else on PATH)."""
    beside = Path(sys.executable).with_name("phantora")
    if beside.exists():
        return [str(beside)]
    found = shutil.which("phantora")
    if found:
        return [found]
    return [sys.executable, "-c", "import sys; from phantora.cli import main; sys.exit(main())"]


class LiveRunner:
    """Runs a case under `phantora run` with representative ranks and parses its summary JSON."""

    def __init__(self, phantora: list[str] | None = None, *, ranks: str = "auto", timeout_s: float | None = None):
        self.phantora = phantora or phantora_executable()
        self.ranks = ranks
        self.timeout_s = timeout_s

    def command(self, case: Case, trace: Path, summary: Path) -> list[str]:
        wl = case.record.workload
        # a language model's tokens and FLOPs for the run's throughput and MFU lines; other workloads have none
        lm = [] if wl.task == "other" else ["--tokens-per-iteration", str(wl.tokens_per_step), "--model", wl.model,
                                            "--seq", str(wl.seq_len)]
        return [*self.phantora, "run", "--cluster", case.cluster, "--nodes", str(case.nodes), "--ranks", self.ranks,
                "--trace", str(trace), "--summary-json", str(summary), *lm, *case.run_options, "--",
                *case.command]

    def __call__(self, case: Case, workdir: Path) -> SimResult:
        if not case.runnable:
            raise CaseFailed(case.unsupported or "the case has no workload command")
        workdir.mkdir(parents=True, exist_ok=True)
        if case.record.workload.framework == "torchtitan":
            from .torchtitan import prepare_assets
            prepare_assets(case.record.workload.model)
        trace, summary, log = workdir / "trace.h5", workdir / "summary.json", workdir / "run.log"
        summary.unlink(missing_ok=True)
        trace.unlink(missing_ok=True)        # a kept folder's earlier trace must not pass for this run's
        cmd = self.command(case, trace, summary)
        t0 = time.perf_counter()
        with open(log, "w") as out:
            try:
                proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, timeout=self.timeout_s,
                                      env={**os.environ, **case.env}, cwd=workdir)
            except subprocess.TimeoutExpired:
                raise CaseFailed(f"the simulation ran past {self.timeout_s:g} s (log: {log})") from None
            except OSError as exc:
                raise CaseFailed(f"cannot start {cmd[0]}: {exc}") from None
        wall = time.perf_counter() - t0
        if not summary.exists():
            tail = log.read_text(errors="replace").strip().splitlines()[-5:]
            raise CaseFailed(f"`phantora run` exited with status {proc.returncode} and no summary; last lines of "
                             f"{log}: " + " | ".join(tail))
        try:
            data = json.loads(summary.read_text())
        except json.JSONDecodeError as exc:
            raise CaseFailed(f"{summary} is not JSON: {exc}") from None
        if data.get("error") and not data.get("oom"):
            raise CaseFailed(f"`phantora run` failed (status {proc.returncode}): {data['error']} (log: {log})")
        res = parse_summary(data, case)
        if not res.oom and res.iteration_s is None:
            raise CaseFailed(f"`phantora run` (status {proc.returncode}) measured no iteration time: fewer than two "
                             f"iteration marks (log: {log})")
        res.mode, res.wall_s, res.trace = "live", wall, str(trace) if trace.exists() else None
        _attach_sources(res, trace)
        return res


# ------------------------------------------------------------------------------------------------ cache
def case_key(case: Case) -> dict[str, Any]:
    """What a cached trace was made from: a different key means the trace no longer reproduces the case."""
    table = case.record.to_table()
    return {"cluster": case.cluster, "nodes": case.nodes, "command": case.command, "run_options": case.run_options,
            "env": case.env, "hardware": table["hardware"], "workload": table["workload"]}


class CachedRunner:
    """Live-runs a case once into `cache/<suite>/<id>/` (trace.h5, summary.json, case.json); replays it afterwards."""

    def __init__(self, cache_dir: str | Path, live: Runner | None = None, *, rerun: bool = False):
        self.cache_dir = Path(cache_dir)
        self.live = live or LiveRunner()
        self.rerun = rerun

    def folder(self, case: Case) -> Path:
        return self.cache_dir / case.suite / case.id

    def cached(self, case: Case) -> bool:
        d = self.folder(case)
        try:
            key = json.loads((d / "case.json").read_text())
        except (OSError, json.JSONDecodeError):
            return False
        if key != json.loads(json.dumps(case_key(case))) or not (d / "trace.h5").exists():
            return False
        try:                       # a live run's summary (RunSummary.as_dict), not a damaged file
            summary = json.loads((d / "summary.json").read_text())
        except (OSError, json.JSONDecodeError):
            return False
        return isinstance(summary, dict) and "oom" in summary and "iteration_s" in summary

    def __call__(self, case: Case, workdir: Path | None = None) -> SimResult:
        d = self.folder(case)
        if not self.rerun and self.cached(case):
            return self.replay(case)
        d.mkdir(parents=True, exist_ok=True)
        (d / "case.json").unlink(missing_ok=True)
        (d / "trace.h5").unlink(missing_ok=True)      # replaced by the new live run's (a trace is never overwritten)
        res = self.live(case, d)
        (d / "case.json").write_text(json.dumps(case_key(case), indent=1))
        return res

    def replay(self, case: Case) -> SimResult:
        from phantora.replay import replay

        d = self.folder(case)
        trace = d / "trace.h5"
        base = parse_summary(json.loads((d / "summary.json").read_text()), case)
        base.mode, base.trace = "replay", str(trace)
        if base.oom:              # not replayed: the live run's costs
            _attach_sources(base, trace)
            return base
        t0 = time.perf_counter()
        # today's profiles, and the allocator the case's launcher sets up
        try:
            rr = replay(trace, cluster=case.cluster, nodes=case.nodes, recost=True,
                        alloc_conf=AllocatorConfig.from_env(case.env).to_text())
        except PhantoraError as exc:
            raise CaseFailed(f"{exc} (the cached trace of {d}: --rerun runs the case live again)") from None
        base.wall_s = time.perf_counter() - t0
        # the replay re-costed every kernel: its sources, not the live run's
        base.cost_sources = source_shares(rr.kernel_time_by_source)
        base.cost_source = cost_label(base.cost_sources)
        rec = case.record
        it = rr.iteration_s
        if it == it and it > 0:      # not NaN
            base.iteration_s = it
            if rec.workload.task != "other":
                base.tokens_per_s_per_gpu = tokens_per_s_per_gpu(rec.workload.tokens_per_step, it,
                                                                 rec.hardware.gpus)
                base.mfu_percent = 100.0 * rr.mfu if rr.mfu is not None else None
        else:
            raise CaseFailed(f"replaying {trace} gave no iteration time (fewer than two iteration marks)")
        if rr.peak_reserved_bytes:
            base.memory_gib = max(rr.peak_reserved_bytes.values()) / GIB
        if rr.peak_allocated_bytes:
            base.memory_allocated_gib = max(rr.peak_allocated_bytes.values()) / GIB
        if rr.ooms:
            base.oom = True
        return base
