"""`phantora groundtruth {new,submit,list}`: the click group, registered by phantora/cli.py."""

from __future__ import annotations

import json

import click

from ..clitools import user_errors as _user_errors
from ..errors import PhantoraError
from .schema import RECORD_FRAMEWORKS


@click.group("groundtruth")
def groundtruth() -> None:
    """Measured results with provenance: write, check and list ground-truth records."""


def _suite_name(ctx, param, value):
    from .schema import ID_RE
    if not ID_RE.match(value):
        raise click.BadParameter(f"'{value}' must be lowercase letters, digits, '.', '_' or '-', starting with a "
                                 f"letter or digit (a folder under groundtruth/)", ctx=ctx, param=param)
    return value


@groundtruth.command("new")
@click.option("--suite", default="local", show_default=True, callback=_suite_name,
              help="Suite the record will belong to.")
@click.option("--framework", default=None, type=click.Choice(RECORD_FRAMEWORKS),
              help="Framework of the workload (default: that of the suite's records, else torchtitan).")
def new_cmd(suite: str, framework: str | None) -> None:
    """Print a commented record template.

    \b
    Example:
      phantora groundtruth new --suite local > my-run.toml
    """
    from .template import template
    if framework is None:
        from collections import Counter

        from .store import load_suite
        try:
            seen = Counter(rec.workload.framework for _, rec in load_suite(suite))
        except Exception:  # noqa: BLE001 - a suite with a bad record: the plain default
            seen = Counter()
        framework = seen.most_common(1)[0][0] if seen else "torchtitan"
    click.echo(template(suite, framework), nl=False)


@groundtruth.command("submit")
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option("--simulate", is_flag=True, help="Also simulate the record and attach Phantora's estimate.")
@click.option("--dry-run", is_flag=True, help="Check and print the normalized record; write nothing.")
@click.option("--force", is_flag=True, help="File it even if it contradicts another source's record.")
@_user_errors
def submit_cmd(file: str, simulate: bool, dry_run: bool, force: bool) -> None:
    """Check a record (schema, units, plausibility, duplicates, contradictions), normalize it and file it under
    groundtruth/<suite>/<id>.toml: in $PHANTORA_HOME if set, else in the phantora checkout the current directory
    lies in, else in the installed tree (the command prints which).

    \b
    Example:
      phantora groundtruth submit my-run.toml --dry-run
      phantora groundtruth submit my-run.toml --simulate
    """
    from .store import submission_root
    from .submit import harness_simulation, submit

    root, why = submission_root()
    res = submit(file, root=root, dry_run=dry_run, force=force, simulate=harness_simulation if simulate else None)
    for w in res.warnings:
        click.echo(f"warning: {w}", err=True)
    for c in res.forced:
        click.echo(f"filed despite a contradiction (--force): {c}", err=True)
    if dry_run:
        click.echo(res.text, nl=False)
        click.echo(f"(dry run: would file {res.target}; records go to {root}: {why})", err=True)
    else:
        click.echo(f"filed {res.target}")
        click.echo(f"(records go to {root}: {why})", err=True)


@groundtruth.command("list")
@click.option("--suite", default=None, help="Only this suite.")
@click.option("--json", "as_json", is_flag=True, help="Print the records as a JSON list.")
@_user_errors
def list_cmd(suite: str | None, as_json: bool) -> None:
    """List the ground-truth records (of the same folder `submit` files into).

    \b
    Example:
      phantora groundtruth list --suite torchtitan
    """
    from .store import list_suites, load_suite, submission_root

    root, _ = submission_root()
    suites = list_suites(root)
    if suite is not None:
        if suite not in suites:
            raise PhantoraError(f"no ground-truth suite '{suite}' (suites with records: {', '.join(suites) or 'none'})")
        suites = [suite]
    records = []
    for s in suites:
        try:
            records.extend(load_suite(s, root))
        except PhantoraError as exc:
            if suite is not None:
                raise
            click.echo(f"warning: suite '{s}' skipped: {exc}", err=True)
    if as_json:
        click.echo(json.dumps([{"file": str(p), **r.to_table()} for p, r in records], indent=1))
        return
    header = ("suite", "id", "GPUs", "model", "measured")
    lines = []
    for _, r in records:
        hw = f"{r.hardware.gpus} x {r.hardware.gpu}"
        lines.append((r.suite, r.id, hw, r.workload.model, _metrics_text(r)))
    widths = [max([len(header[i])] + [len(x[i]) for x in lines]) for i in range(4)]
    click.echo("  ".join(h.ljust(w) for h, w in zip(header, widths)) + "  " + header[4])
    for x in lines:
        click.echo("  ".join(c.ljust(w) for c, w in zip(x, widths)) + "  " + x[4])
    click.echo(f"{len(records)} record(s) in {len(suites)} suite(s)")


def _metrics_text(r) -> str:
    m = r.metrics
    if m.oom:
        return "OOM"
    parts = []
    if m.tokens_per_s_per_gpu is not None:
        parts.append(f"{m.tokens_per_s_per_gpu:,.0f} tok/s/GPU")
    if m.mfu_percent is not None:
        parts.append(f"MFU {m.mfu_percent:g}%")
    if m.iteration_s is not None:
        parts.append(f"{m.iteration_s:g} s/iter")
    if m.memory_gib is not None:
        parts.append(f"{m.memory_gib:g} GiB")
    if m.memory_allocated_gib is not None:
        parts.append(f"{m.memory_allocated_gib:g} GiB allocated")
    return ", ".join(parts)
