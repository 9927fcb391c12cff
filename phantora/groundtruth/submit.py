"""Submitting a record: check it, refuse duplicates and contradictions, normalize it and file it.

`submit(path)` reads a record file, validates its schema and units, checks it against the presets
(`checks.check_record`), refuses a duplicate (same configuration and source as a filed record) and, unless `force`,
a contradiction (same configuration, another source, a metric more than 10% apart; both values are named), optionally
attaches Phantora's estimate, and writes the canonical text to `groundtruth/<suite>/<id>.toml`. Any refusal raises
before anything is written.
"""

from __future__ import annotations

import datetime as _dt
import os
import tempfile
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..errors import PhantoraError
from ..tomlconf import read_toml
from .checks import GroundTruthError, check_record
from .schema import Record, Simulation, record_from_table
from .store import find_contradictions, find_duplicate, list_suites, load_suite, record_path, root_dir
from .tomlwrite import dumps

HEADER = "Ground-truth record (docs/groundtruth.md), filed by `phantora groundtruth submit`."


@dataclass
class SubmitResult:
    record: Record
    target: Path                   # where the record is (or, with dry_run, would be) filed
    text: str                      # the canonical TOML written
    written: bool
    warnings: list[str] = field(default_factory=list)
    forced: list[str] = field(default_factory=list)    # contradictions accepted with force


def canonical_text(record: Record) -> str:
    """The record as canonical TOML (schema key order, canonical units), checked to read back to the same record."""
    text = dumps(record.to_table(), header=HEADER)
    again = record_from_table(tomllib.loads(text), file="<canonical text>")
    if again != record:
        raise PhantoraError("the canonical text of the record does not read back to the same record")
    return text


def existing_records(root: str | Path | None = None) -> tuple[list[tuple[Path, Record]], list[str]]:
    """Every filed record that loads, and a warning for each suite that does not."""
    records, warnings = [], []
    for suite in list_suites(root):
        try:
            records.extend(load_suite(suite, root))
        except PhantoraError as exc:
            warnings.append(f"suite '{suite}' was not searched for duplicates: {exc}")
    return records, warnings


def simulation_of(record: Record, estimate) -> Simulation:
    """A `Simulation` table from a harness result (phantora_validation.runner.SimResult)."""
    from .. import __version__
    return Simulation(phantora_version=__version__, date=_dt.date.today().isoformat(), cost_source=estimate.cost_source,
                      oom=estimate.oom, tokens_per_s_per_gpu=estimate.tokens_per_s_per_gpu,
                      mfu_percent=None if estimate.oom else estimate.mfu_percent,
                      iteration_s=estimate.iteration_s, memory_gib=estimate.memory_gib,
                      memory_allocated_gib=estimate.memory_allocated_gib)


def submit(path: str | Path, *, root: str | Path | None = None, dry_run: bool = False, force: bool = False,
           simulate: Callable[[Record], Simulation] | None = None) -> SubmitResult:
    """Check, normalize and file the record at `path` (see the module docstring)."""
    file = str(path)
    record = record_from_table(read_toml(Path(path)), file=file)
    report = check_record(record, file=file)
    if not report.ok:
        raise GroundTruthError("the record is implausible:\n  " + "\n  ".join(report.problems))
    records, warnings = existing_records(root)
    warnings = report.warnings + warnings
    target = record_path(record, root)

    dup = find_duplicate(record, records)
    if dup is not None:
        raise GroundTruthError(f"{file}: duplicate of {dup} (same hardware, workload and source)")
    if target.exists():
        raise GroundTruthError(f"{file}: id '{record.id}' is taken by {target} (a different measurement); choose "
                               f"another id")
    contradictions = find_contradictions(record, records)
    forced = []
    if contradictions:
        lines = [c.describe() for c in contradictions]
        if not force:
            raise GroundTruthError(f"{file}: contradicts a record of the same hardware and workload from another "
                                   f"source:\n  " + "\n  ".join(lines) +
                                   "\n(check both; submit with --force if both are right, and say why in notes)")
        forced = lines

    if simulate is not None:
        try:
            record.simulation = simulate(record)
        except PhantoraError as exc:
            raise GroundTruthError(f"{file}: --simulate failed: {exc}") from None

    text = canonical_text(record)
    if not dry_run:
        _write_atomically(target, text)
    return SubmitResult(record, target, text, written=not dry_run, warnings=warnings, forced=forced)


def _write_atomically(target: Path, text: str) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.stem}-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def harness_simulation(record: Record) -> Simulation:
    """Simulate `record` with the validation harness's live case runner (for `submit --simulate`)."""
    try:
        from phantora_validation.cases import case_from_record
        from phantora_validation.runner import LiveRunner
    except ImportError:
        raise PhantoraError("--simulate needs the validation harness (phantora_validation), which this installation "
                            "lacks") from None
    case = case_from_record(record)
    with tempfile.TemporaryDirectory(prefix="phantora-submit-") as tmp:
        estimate = LiveRunner()(case, Path(tmp))
    return simulation_of(record, estimate)


__all__ = ["SubmitResult", "canonical_text", "existing_records", "harness_simulation", "root_dir", "simulation_of",
           "submit"]
