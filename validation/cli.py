"""`phantora-validate --suite NAME`: simulate each ground-truth case of a suite and report the error.

A suite is the records of `groundtruth/<suite>/`. Each case runs live under `phantora run` (or, with `--cache`, once
live and afterwards by replaying its cached trace). The exit status is 0 when every case ran, OOM rows agree and the
maximum primary error is within `--max-error`; 1 otherwise; 2 for bad input (unknown suite or case, `--workdir` with
`--cache`). Live cases keep their trace, summary and log in `--workdir` (default: a new folder in the temporary
directory), so every path the results name exists.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
import tempfile
from pathlib import Path

import click

from phantora.clitools import plot_target, writable_folder
from phantora.errors import PhantoraError
from phantora.groundtruth.store import list_suites

from .cases import load_cases
from .compare import summarize
from .harness import run_cases
from .report import format_markdown, format_table, passes, plot
from .runner import CachedRunner, LiveRunner


def available_suites() -> list[str]:
    return list_suites()


def make_runner(cache: str | None, rerun: bool = False, timeout_s: float | None = None):
    """The runner for the command's options: live runs, or live once and replay afterwards with a cache."""
    live = LiveRunner(timeout_s=timeout_s)
    return CachedRunner(cache, live, rerun=rerun) if cache else live


def validate(suite: str, *, runner, case_ids: tuple[str, ...] = (), jobs: int = 1, report: str | None = None,
             as_json: bool = False, plot_path: str | None = None, max_error: float | None = None,
             root: str | Path | None = None, workdir: str | Path | None = None, drop_empty_workdir: bool = False,
             echo=click.echo) -> int:
    """Run a suite with `runner` and print/write the results; returns the exit status.

    `workdir` keeps each case's files (trace, summary, log) in `workdir/<case id>/`; without it they go to
    temporary folders and the results name none of them (phantora_validation.harness). `drop_empty_workdir`
    removes a work folder that no case wrote a file into (a cached run's files are in its cache), and the
    results then name no work folder."""
    cases = load_cases(suite, root=root, ids=case_ids)

    def progress(done, total, case, res, secs):
        state = "FAILED" if res.failure else ("ok" if res.ok else "mismatch")
        err = f" {100 * res.error:+.2f}%" if res.error is not None else ""
        click.echo(f"[{done}/{total}] {case.id}: {state}{err} ({secs:.1f} s)", err=True)

    click.echo(f"running {len(cases)} case(s) of suite '{suite}' with {jobs} job(s)", err=True)
    results = run_cases(cases, runner, jobs=jobs, progress=progress, workdir=workdir)
    if workdir is not None and drop_empty_workdir and remove_if_empty(workdir):
        workdir = None
    if workdir is not None:
        click.echo(f"each case's trace, summary and log are kept in {workdir}/<case id>/", err=True)
    summary = summarize(results)
    if as_json:
        echo(json.dumps({"suite": suite, "workdir": str(workdir) if workdir is not None else None,
                         "cases": [r.as_dict() for r in results], "summary": summary}, indent=1))
    else:
        echo(format_table(suite, results, summary, max_error))
    try:
        if report:
            Path(report).write_text(format_markdown(suite, results, summary, max_error))
            click.echo(f"wrote {report}", err=True)
        if plot_path:
            plot(suite, results, plot_path, max_error)
            click.echo(f"wrote {plot_path}", err=True)
    except OSError as exc:                    # the results are printed above: nothing is lost
        raise PhantoraError(f"could not write {exc.filename or report or plot_path} ({exc.strerror or exc}); "
                            f"the results are printed above") from None
    return 0 if passes(summary, max_error) else 1


def _finite(value: float | None, param, *, positive: bool = False) -> float | None:
    """A float option that must be finite and >= 0 (> 0 with `positive`); click names the option in the error."""
    if value is None:
        return None
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise click.BadParameter(f"must be a finite number {'> 0' if positive else '>= 0'}, got {value!r}")
    return value


def remove_if_empty(folder: str | Path) -> bool:
    """Remove `folder` if no file lies under it (empty sub-folders only); True when removed."""
    folder = Path(folder)
    if any(p.is_file() for p in folder.rglob("*")):
        return False
    shutil.rmtree(folder, ignore_errors=True)
    return True


@click.command(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.option("--suite", required=True, help="Suite name (a folder of records under groundtruth/).")
@click.option("--case", "case_ids", multiple=True, metavar="ID", help="Run only this case (repeatable).")
@click.option("--jobs", "-j", type=click.IntRange(min=1), default=1, show_default=True,
              help="Cases simulated at once.")
@click.option("--cache", type=click.Path(file_okay=False), default=None,
              help="Keep each case's trace here; later runs replay it instead of a new live run.")
@click.option("--rerun", is_flag=True, help="With --cache: run every case live again and refresh the cache.")
@click.option("--workdir", type=click.Path(file_okay=False), default=None,
              help="Without --cache: keep each case's trace, summary and log in DIR/<case id>/ (default: a new "
                   "folder in the temporary directory, kept and named on stderr and in --json).")
@click.option("--timeout", "timeout_s", type=float, default=None, callback=lambda c, p, v: _finite(v, p, positive=True),
              help="Seconds a live case may run (> 0).")
@click.option("--report", type=click.Path(dir_okay=False), default=None, help="Write a Markdown report here.")
@click.option("--json", "as_json", is_flag=True,
              help='Print {"cases": [...], "summary": {...}} (errors as fractions) instead of the table.')
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None,
              help="Write a bar chart of the errors (PNG).")
@click.option("--max-error", type=float, default=None, metavar="PCT", callback=lambda c, p, v: _finite(v, p),
              help="Exit non-zero when a case's error exceeds PCT percent.")
def main(suite, case_ids, jobs, cache, rerun, workdir, timeout_s, report, as_json, plot_path, max_error) -> None:
    """Compare Phantora's simulated results with measured ground truth.

    \b
    Examples:
      phantora-validate --suite torchtitan --cache ~/.cache/phantora-validate --jobs 2 --max-error 5
      phantora-validate --suite torchtitan --case a100-64-llama3-8b-b1-ac-sel-op --json
    """
    suites = available_suites()
    if suite not in suites:
        known = ", ".join(suites) if suites else "none yet"
        click.echo(f"Error: no ground-truth suite '{suite}' (suites with records: {known})", err=True)
        sys.exit(2)
    if cache and workdir:
        click.echo("Error: --workdir and --cache both say where case files are kept (--cache keeps them in "
                   "DIR/<suite>/<case id>/); give one", err=True)
        sys.exit(2)
    if rerun and not cache:
        click.echo("Error: --rerun refreshes a cache: give --cache DIR with it", err=True)
        sys.exit(2)
    problem = (_unwritable(report, "--report") or _folder_problem(workdir, "--workdir")
               or _folder_problem(cache, "--cache"))
    if problem is None:
        try:
            plot_target(plot_path)
        except PhantoraError as exc:
            problem = str(exc)
    if problem:                               # found before the suite runs, not after
        click.echo(f"Error: {problem}", err=True)
        sys.exit(2)
    made = not cache and workdir is None
    if made:                                  # live runs: keep their files where the results can name them
        workdir = tempfile.mkdtemp(prefix=f"phantora-validate-{suite}-")
    try:
        status = validate(suite, runner=make_runner(cache, rerun, timeout_s), case_ids=case_ids, jobs=jobs,
                          report=report, as_json=as_json, plot_path=plot_path, max_error=max_error,
                          workdir=workdir, drop_empty_workdir=made)
    except PhantoraError as exc:
        if made:
            remove_if_empty(workdir)
        click.echo(f"Error: {exc}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        # as `phantora run` on SIGINT: 128 + 2, not the status of a case above --max-error. A case's cache entry
        # is written last (case.json), so an interrupted case runs live again next time.
        if made:
            remove_if_empty(workdir)
        click.echo("phantora-validate: interrupted (SIGINT); the cases finished before it are kept in the cache",
                   err=True)
        sys.exit(130)
    sys.exit(status)


def _unwritable(path: str | None, option: str) -> str | None:
    """Why `path` could not be written later (its folder is missing), or None."""
    if path and not Path(path).parent.is_dir():
        return f"{option} {path}: folder {Path(path).parent} does not exist"
    if path:
        try:
            writable_folder(Path(path).parent, f"{option} {path}")
        except PhantoraError as exc:
            return str(exc)
    return None


def _folder_problem(path: str | None, option: str) -> str | None:
    """Why the folder `path` could not hold the cases' files (it cannot be made or written in), or None."""
    if not path:
        return None
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"{option} {path}: cannot make the folder ({exc.strerror or exc})"
    try:
        writable_folder(path, f"{option} {path}")
    except PhantoraError as exc:
        return str(exc)
    return None


if __name__ == "__main__":  # pragma: no cover
    main()
