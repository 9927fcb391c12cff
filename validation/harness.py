"""Running a suite's cases with a runner, in parallel, with progress, into comparison results.

Each case runs in a folder of its own: `workdir/<case id>/`, kept, when a work folder is given; otherwise a
temporary folder removed once the case is done, and then its result names no file that was in it (the trace path
is dropped and a failure's log path is replaced by a note), so a report never points at a deleted file.
"""

from __future__ import annotations

import re
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


def run_case(case: Case, runner: Runner, workdir: str | Path | None = None) -> CaseResult:
    """Simulate one case and compare it; a failing simulation becomes a result with `failure` set.

    With `workdir`, the case runs in `workdir/<case id>/`, which is kept; otherwise in a temporary folder (see the
    module docstring)."""
    if workdir is not None:
        folder = Path(workdir) / case.id
        folder.mkdir(parents=True, exist_ok=True)
        return _run_in(case, runner, folder)
    with tempfile.TemporaryDirectory(prefix=f"phantora-validate-{case.id}-") as tmp:
        res = _run_in(case, runner, Path(tmp))
    return _forget_folder(res, Path(tmp))


def _run_in(case: Case, runner: Runner, folder: Path) -> CaseResult:
    try:
        sim = runner(case, folder)
    except PhantoraError as exc:
        return CaseResult(case.id, failure=str(exc))
    except Exception as exc:        # a broken runner must not hide the other cases' results
        return CaseResult(case.id, failure=f"{type(exc).__name__}: {exc}")
    return CaseResult(case.id, rows=compare(case.record, sim), sim=sim)


def _forget_folder(res: CaseResult, folder: Path) -> CaseResult:
    """`res` without paths into `folder`, which has been deleted."""
    def inside(path: str) -> bool:
        try:
            Path(path).resolve().relative_to(folder.resolve())
            return True
        except ValueError:
            return False

    if res.sim is not None and res.sim.trace and inside(res.sim.trace):
        res.sim.trace = None
    if res.failure:
        names = {str(folder), str(folder.resolve())}
        if any(n in res.failure for n in names):
            text = res.failure
            for n in sorted(names, key=len, reverse=True):
                text = re.sub(r"\s*\(log: " + re.escape(n) + r"[^)]*\)", "", text)
                text = re.sub(re.escape(n) + r"/([^\s:]*)", r"the case's \1", text)
                text = text.replace(n, "the case's folder")
            res.failure = text + " (the case ran in a temporary folder, since deleted; give a work folder to keep " \
                                 "its log)"
    return res


def run_cases(cases: list[Case], runner: Runner, *, jobs: int = 1, progress: Progress | None = None,
              workdir: str | Path | None = None) -> list[CaseResult]:
    """Results in the order of `cases`; `jobs` cases run at once; `progress(done, total, case, result, seconds)`;
    `workdir` keeps each case's files in `workdir/<case id>/` (see `run_case`)."""
    results: dict[str, CaseResult] = {}
    total = len(cases)

    def one(case: Case) -> tuple[Case, CaseResult, float]:
        t0 = time.perf_counter()
        res = run_case(case, runner, workdir)
        return case, res, time.perf_counter() - t0

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = [pool.submit(one, c) for c in cases]
        for done, fut in enumerate(as_completed(futures), 1):
            case, res, secs = fut.result()
            results[case.id] = res
            if progress:
                progress(done, total, case, res, secs)
    return [results[c.id] for c in cases]
