"""Cases: a ground-truth record with the workload command and the cluster that reproduce it.

A suite is the records of `groundtruth/<suite>/`; every record becomes one case. The workload command depends on the
record's framework (`WORKLOAD_COMMANDS`); a framework without one still becomes a case, whose run fails with a
message saying so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from phantora.errors import PhantoraError
from phantora.groundtruth.schema import Record
from phantora.groundtruth.store import list_suites, load_suite

from .deepspeed import deepspeed_command
from .megatron import megatron_command
from .moe import FRAMEWORK as MOE_FRAMEWORK, moe_command, moe_run_options
from .reference import reference_command
from .torchtitan import UnsupportedCase, torchtitan_command, torchtitan_environment, torchtitan_run_options

# framework (each of phantora.groundtruth.schema.RECORD_FRAMEWORKS, the names a record may give) -> function
# building the training command from a record
WORKLOAD_COMMANDS: dict[str, Callable[[Record], list[str]]] = {
    "torchtitan": torchtitan_command,
    "phantora-llama": reference_command,
    "megatron-core": megatron_command,
    "deepspeed": deepspeed_command,
    MOE_FRAMEWORK: moe_command,
}
# framework -> function giving the `phantora run` options of the record's software (torch release, SDPA order) or of
# its workload (the MoE trainer's expert routing)
RUN_OPTIONS: dict[str, Callable[[Record], list[str]]] = {
    "torchtitan": torchtitan_run_options,
    MOE_FRAMEWORK: moe_run_options,
}
# framework -> the environment its launcher gives the training processes (e.g. the caching allocator's settings)
ENVIRONMENTS: dict[str, Callable[[Record], dict[str, str]]] = {
    "torchtitan": torchtitan_environment,
}


@dataclass
class Case:
    id: str
    suite: str
    record: Record
    cluster: str                   # cluster preset
    nodes: int                     # hosts
    command: list[str] = field(default_factory=list)   # the training command; empty when unsupported
    unsupported: str = ""          # why there is no command
    run_options: list[str] = field(default_factory=list)   # extra `phantora run` options (software emulated)
    env: dict[str, str] = field(default_factory=dict)       # environment of the training processes
    path: Path | None = None       # the record's file

    @property
    def runnable(self) -> bool:
        return bool(self.command)


def case_from_record(record: Record, path: Path | None = None) -> Case:
    case = Case(id=record.id, suite=record.suite, record=record, cluster=record.hardware.cluster,
                nodes=record.hardware.hosts, path=path)
    build = WORKLOAD_COMMANDS.get(record.workload.framework)
    if build is None:
        case.unsupported = (f"no workload command for framework '{record.workload.framework}' (known: "
                            f"{', '.join(sorted(WORKLOAD_COMMANDS))})")
        return case
    try:
        case.command = build(record)
    except UnsupportedCase as exc:
        case.unsupported = str(exc)
    options = RUN_OPTIONS.get(record.workload.framework)
    case.run_options = options(record) if options is not None else []
    if record.hardware.host_cpu_cores:      # the measured host's cores, where the preset's differ (host compute)
        case.run_options += ["--set", f"host.cpu_cores={record.hardware.host_cpu_cores}"]
    environment = ENVIRONMENTS.get(record.workload.framework)
    case.env = environment(record) if environment is not None else {}
    return case


def load_cases(suite: str, *, root: str | Path | None = None, ids: tuple[str, ...] | list[str] = ()) -> list[Case]:
    """The cases of a suite, in file order; `ids` selects some of them (an unknown id is an error)."""
    suites = list_suites(root)
    if suite not in suites:
        known = ", ".join(suites) if suites else "none yet"
        raise PhantoraError(f"no ground-truth suite '{suite}' (suites with records: {known})")
    cases = [case_from_record(rec, path) for path, rec in load_suite(suite, root)]
    if ids:
        by_id = {c.id: c for c in cases}
        unknown = [i for i in ids if i not in by_id]
        if unknown:
            raise PhantoraError(f"suite '{suite}' has no case '{unknown[0]}' (cases: {', '.join(sorted(by_id))})")
        cases = [by_id[i] for i in dict.fromkeys(ids)]
    return cases
