"""The folder of suites: `groundtruth/<suite>/<id>.toml`, one record per file.

A suite is any folder under groundtruth/ holding `*.toml` files; nothing here knows the suites by name. This module
lists and loads them, tells which records describe the same configuration (hardware and workload), and finds
duplicates (same configuration and same source) and contradictions (same configuration, another source, a metric
more than `CONTRADICTION` apart).
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path

from ..errors import PresetError
from ..paths import groundtruth_dir
from .schema import METRIC_KEYS, Record, load_record

CONTRADICTION = 0.10     # relative difference of one metric between two sources that is refused without --force

# Keys that identify a configuration: what ran, on what. Versions, free text and provenance are not part of it.
HARDWARE_KEYS = ("gpu", "gpus", "hosts", "gpus_per_host", "intra_host_link", "inter_host_gbps_per_gpu",
                 "host_cpu_cores")
WORKLOAD_KEYS = ("framework", "model", "micro_batch", "global_batch", "seq_len", "activation_checkpointing",
                 "ac_layer_period", "precision", "compile", "float8", "task")
SOURCE_KEYS = ("url", "contributor", "repository", "file", "commit", "version", "section")


def root_dir(root: str | Path | None = None) -> Path:
    return Path(root) if root is not None else groundtruth_dir()


def find_checkout(start: str | Path | None = None) -> Path | None:
    """The phantora project checkout holding `start` (default: the current directory), or None.

    A checkout is the first folder, from `start` upward, with a pyproject.toml whose project is named phantora and
    a groundtruth/ folder beside it.
    """
    try:
        here = Path(start if start is not None else Path.cwd()).resolve()
    except OSError:              # the current directory was removed
        return None
    for folder in (here, *here.parents):
        pyproject = folder / "pyproject.toml"
        if not pyproject.is_file() or not (folder / "groundtruth").is_dir():
            continue
        try:
            with open(pyproject, "rb") as f:
                name = tomllib.load(f).get("project", {}).get("name")
        except (OSError, tomllib.TOMLDecodeError):
            continue
        if name == "phantora":
            return folder
    return None


def submission_root(cwd: str | Path | None = None) -> tuple[Path, str]:
    """Where `phantora groundtruth submit` files records (and `list` reads them), and why there.

    PHANTORA_HOME's groundtruth/ when that is set; else the groundtruth/ of the phantora checkout the current
    directory lies in; else the installed tree's (phantora.paths.groundtruth_dir).
    """
    if os.environ.get("PHANTORA_HOME"):
        return groundtruth_dir(), "PHANTORA_HOME"
    checkout = find_checkout(cwd)
    if checkout is not None:
        return checkout / "groundtruth", "the phantora checkout of the current directory"
    return groundtruth_dir(), "the installed phantora tree (no phantora checkout holds the current directory)"


def list_suites(root: str | Path | None = None) -> list[str]:
    """Names of the folders under groundtruth/ that hold at least one record file."""
    base = root_dir(root)
    if not base.is_dir():
        return []
    return sorted(p.name for p in base.iterdir() if p.is_dir() and any(p.glob("*.toml")))


def suite_files(suite: str, root: str | Path | None = None) -> list[Path]:
    return sorted((root_dir(root) / suite).glob("*.toml"))


def load_suite(suite: str, root: str | Path | None = None) -> list[tuple[Path, Record]]:
    """Every record of a suite, validated, with its file; a record must sit where its id and suite say."""
    out = []
    for path in suite_files(suite, root):
        rec = load_record(path)
        if rec.suite != suite:
            raise PresetError(f"the record says suite '{rec.suite}' but sits in groundtruth/{suite}/", file=str(path),
                              key="suite")
        if rec.id != path.stem:
            raise PresetError(f"the record's id '{rec.id}' differs from its file name '{path.name}'", file=str(path),
                              key="id")
        out.append((path, rec))
    return out


def config_key(rec: Record) -> tuple:
    """What identifies the measured configuration: hardware and workload, less versions and prose."""
    hw = tuple(getattr(rec.hardware, k) for k in HARDWARE_KEYS)
    p = rec.workload.parallelism
    par = (p.dp_shard, p.dp_replicate, p.tp, p.pp, p.cp, p.ep)
    wl = tuple(getattr(rec.workload, k) for k in WORKLOAD_KEYS)
    return hw + par + wl + (tuple(sorted(rec.workload.options.items())),)


def source_key(rec: Record) -> tuple:
    return tuple(getattr(rec.source, k) for k in SOURCE_KEYS)


@dataclass
class Contradiction:
    other: Path
    metric: str
    value: float | bool
    other_value: float | bool

    def describe(self) -> str:
        if self.metric == "oom":
            a = "OOM" if self.value else "no OOM"
            b = "OOM" if self.other_value else "no OOM"
            return f"{self.metric}: {a} here, {b} in {self.other}"
        diff = abs(self.value - self.other_value) / self.other_value
        return (f"{self.metric}: {self.value:g} here, {self.other_value:g} in {self.other} "
                f"({100 * diff:.1f}% apart, more than {100 * CONTRADICTION:g}%)")


def find_duplicate(rec: Record, records: list[tuple[Path, Record]]) -> Path | None:
    """The file of a record with the same configuration and the same source, if any."""
    for path, other in records:
        if config_key(other) == config_key(rec) and source_key(other) == source_key(rec):
            return path
    return None


def find_contradictions(rec: Record, records: list[tuple[Path, Record]]) -> list[Contradiction]:
    """Metrics of `rec` that another source's record of the same configuration puts more than 10% away."""
    out = []
    for path, other in records:
        if config_key(other) != config_key(rec) or source_key(other) == source_key(rec):
            continue
        if rec.metrics.oom != other.metrics.oom:
            out.append(Contradiction(path, "oom", rec.metrics.oom, other.metrics.oom))
            continue
        for k in METRIC_KEYS:
            a, b = getattr(rec.metrics, k), getattr(other.metrics, k)
            if a is None or b is None:
                continue
            if k == "mfu_percent" and rec.metrics.mfu_counts_embedding != other.metrics.mfu_counts_embedding:
                continue      # two MFU conventions: not comparable
            lo, hi = _agreeing(k, b, other)
            if not lo <= a <= hi:
                out.append(Contradiction(path, k, a, b))
    return out


_STEP_METRICS = {"iteration_s": 1, "tokens_per_s_per_gpu": -1, "mfu_percent": -1}   # how each goes with step time


def _agreeing(metric: str, value: float, other: Record) -> tuple[float, float]:
    """The values of `metric` that agree with `other`'s: within CONTRADICTION of its figure, widened for the step-time
    metrics by the range of its repeated runs (metrics.iteration_s_repeats), if it has any."""
    r_lo = r_hi = 1.0
    spread = other.metrics.iteration_spread()
    if spread is not None and metric in _STEP_METRICS:
        r_lo, r_hi = spread[0] / other.metrics.iteration_s, spread[1] / other.metrics.iteration_s
        if _STEP_METRICS[metric] < 0:        # throughput and MFU go as the inverse of the step time
            r_lo, r_hi = 1.0 / r_hi, 1.0 / r_lo
    return value * r_lo * (1 - CONTRADICTION), value * r_hi * (1 + CONTRADICTION)


def record_path(rec: Record, root: str | Path | None = None) -> Path:
    return root_dir(root) / rec.suite / f"{rec.id}.toml"
