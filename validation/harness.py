"""Running a suite's cases with a runner, in parallel, with progress, into comparison results."""

from __future__ import annotations

import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Callable

from phantora.errors import PhantoraError

from .cases import Case
from .compare import CaseResult, compare
from .runner import Runner

Progress = Callable[[int, int, Case, CaseResult, float], None]


def run_case(case: Case, runner: Runner) -> CaseResult:
    """Simulate one case and compare it; a failing simulation becomes a result with `failure` set."""
    try:
        with tempfile.TemporaryDirectory(prefix=f"phantora-validate-{case.id}-") as tmp:
            sim = runner(case, Path(tmp))
    except PhantoraError as exc:
        return CaseResult(case.id, failure=str(exc))
    except Exception as exc:        # a broken runner must not hide the other cases' results
        return CaseResult(case.id, failure=f"{type(exc).__name__}: {exc}")
    return CaseResult(case.id, rows=compare(case.record, sim), sim=sim)


def run_cases(cases: list[Case], runner: Runner, *, jobs: int = 1, progress: Progress | None = None
              ) -> list[CaseResult]:
    """Results in the order of `cases`; `jobs` cases run at once; `progress(done, total, case, result, seconds)`."""
    results: dict[str, CaseResult] = {}
    total = len(cases)

    def one(case: Case) -> tuple[Case, CaseResult, float]:
        t0 = time.perf_counter()
        res = run_case(case, runner)
        return case, res, time.perf_counter() - t0

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = [pool.submit(one, c) for c in cases]
        for done, fut in enumerate(as_completed(futures), 1):
            case, res, secs = fut.result()
            results[case.id] = res
            if progress:
                progress(done, total, case, res, secs)
    return [results[c.id] for c in cases]
