"""The ground-truth record: one measured training run, its provenance, hardware, workload and metrics.

A record is a TOML file (docs/groundtruth.md lists every key with its unit). `load_record(path)` reads and validates
one; every error is a `PresetError` naming the file and the key. These checks need no preset; the checks against
the GPU, model and cluster presets (names, VRAM, peak FLOPs) are in `checks.py`.
"""

from __future__ import annotations

import datetime as _dt
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import PresetError
from ..tomlconf import build, read_toml, to_table
from .units import normalize_units

ID_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
HEX_RE = re.compile(r"^[0-9a-f]{7,40}$")
INTRA_LINKS = ("nvswitch", "nvlink-mesh", "pcie")
AC_MODES = ("none", "full", "selective-op", "selective-layer")
PRECISIONS = ("bf16", "fp16", "tf32", "fp32")
# workload.framework: the frameworks whose records the validation harness (validation/cases.py) turns into runs
RECORD_FRAMEWORKS = ("torchtitan", "megatron-core", "deepspeed", "phantora-llama", "phantora-moe")
METRIC_KEYS = ("tokens_per_s_per_gpu", "mfu_percent", "iteration_s", "memory_gib", "memory_allocated_gib")
# workload.task: "" is a language model (`model` a preset of presets/models, seq_len its tokens per sequence);
# "other" a workload of the framework's that is not one (`model` names it: DeepSpeed's resnet50, sd15-unet, gat),
# counted in samples (seq_len 1) and measured by its iteration time and memory only
TASKS = ("", "other")
OTHER_TASK_METRICS = ("iteration_s", "memory_gib", "memory_allocated_gib")


def _check_date(value: str, key: str) -> None:
    try:
        day = _dt.date.fromisoformat(value)
    except ValueError:
        raise PresetError(f"'{value}' is not a date YYYY-MM-DD", key=key) from None
    # a measurement, a publication or a simulation has happened: a day's margin for time zones
    if day > _dt.datetime.now(_dt.timezone.utc).date() + _dt.timedelta(days=1):
        raise PresetError(f"'{value}' is in the future: give the day it happened", key=key)


@dataclass
class Source:
    """Where the measurement comes from: a published document (url, repository, file, commit) or a contributor."""
    date: str                      # YYYY-MM-DD: publication date of the document, or the day of the measurement
    url: str = ""                  # page that shows the figure
    contributor: str = ""          # who measured it (name or GitHub handle), for unpublished measurements
    repository: str = ""           # "owner/name" of the repository holding the document
    file: str = ""                 # the document's path in that repository
    commit: str = ""               # commit of the document that shows the figure (hex)
    version: str = ""              # version of the document or of the measuring setup, where there is no commit
    section: str = ""              # table or section of the document (e.g. "Table 1")

    def validate(self) -> None:
        if not self.url and not self.contributor:
            raise PresetError("a record needs source.url (published) or source.contributor (measured yourself)",
                              key="source")
        _check_date(self.date, "source.date")
        if self.commit and not HEX_RE.match(self.commit):
            raise PresetError(f"'{self.commit}' is not a commit hash (7 to 40 lowercase hex digits)",
                              key="source.commit")


@dataclass
class Hardware:
    """The machines measured, and the cluster preset that reproduces them."""
    gpu: str                       # GPU preset name (presets/gpus)
    gpus: int                      # GPUs in the job
    hosts: int                     # hosts (nodes)
    gpus_per_host: int
    cluster: str                   # cluster preset that models these hosts (presets/clusters); `--nodes` = hosts
    intra_host_link: str           # nvswitch | nvlink-mesh | pcie
    inter_host_gbps_per_gpu: float = 0.0   # scale-out bandwidth per GPU, Gb/s; 0 for a single host
    inter_host_link: str = ""      # the scale-out network in words ("RDMA (RoCE), one 400 Gb/s NIC per GPU")
    host_cpu_cores: int | None = None   # CPU cores of each host (nproc), where they differ from the cluster preset's

    def validate(self) -> None:
        for key in ("gpus", "hosts", "gpus_per_host"):
            if getattr(self, key) < 1:
                raise PresetError("must be at least 1", key=f"hardware.{key}")
        if self.host_cpu_cores is not None and self.host_cpu_cores < 1:
            raise PresetError("must be at least 1 (leave it out for the cluster preset's cores)",
                              key="hardware.host_cpu_cores")
        if self.gpus != self.hosts * self.gpus_per_host:
            raise PresetError(f"{self.gpus} GPUs is not hosts × gpus_per_host = {self.hosts} × {self.gpus_per_host} "
                              f"= {self.hosts * self.gpus_per_host}", key="hardware.gpus")
        if self.intra_host_link not in INTRA_LINKS:
            raise PresetError(f"'{self.intra_host_link}' is not one of {', '.join(INTRA_LINKS)}",
                              key="hardware.intra_host_link")
        if self.inter_host_gbps_per_gpu < 0:
            raise PresetError("must not be negative", key="hardware.inter_host_gbps_per_gpu")
        if self.hosts > 1 and self.inter_host_gbps_per_gpu <= 0:
            raise PresetError("a multi-host job needs its scale-out bandwidth per GPU (Gb/s)",
                              key="hardware.inter_host_gbps_per_gpu")


@dataclass
class Parallelism:
    """Degrees of each parallel dimension (TorchTitan's names). Their product, less `ep`, is the GPU count."""
    dp_shard: int = 1              # FSDP (sharded data parallel)
    dp_replicate: int = 1          # replicated data parallel (DDP / HSDP replicas)
    tp: int = 1                    # tensor parallel
    pp: int = 1                    # pipeline parallel
    cp: int = 1                    # context parallel
    ep: int = 1                    # expert parallel (carved out of dp_shard × cp, so not a factor of the GPU count)

    def validate(self) -> None:
        for key in ("dp_shard", "dp_replicate", "tp", "pp", "cp", "ep"):
            if getattr(self, key) < 1:
                raise PresetError("must be at least 1", key=f"workload.parallelism.{key}")

    @property
    def world(self) -> int:
        return self.dp_shard * self.dp_replicate * self.tp * self.pp * self.cp

    @property
    def dp(self) -> int:
        return self.dp_shard * self.dp_replicate


@dataclass
class Workload:
    """What was trained, and how."""
    framework: str                 # one of RECORD_FRAMEWORKS: "torchtitan", "megatron-core", "phantora-llama", ...
    framework_version: str         # release or commit of the framework
    model: str                     # model preset name (presets/models)
    micro_batch: int               # sequences per GPU per forward/backward (TorchTitan's local batch size)
    global_batch: int              # sequences per optimizer step over the whole job
    seq_len: int                   # tokens per sequence
    activation_checkpointing: str  # none | full | selective-op | selective-layer
    parallelism: Parallelism = field(default_factory=Parallelism)
    ac_layer_period: int = 0       # selective-layer: every k-th block is checkpointed (0: not stated)
    precision: str = "bf16"        # dtype of the matmuls under mixed precision: bf16 | fp16 | tf32 | fp32
    compile: bool = False          # torch.compile
    float8: bool = False           # Float8 linear layers (FP8 tensor cores)
    torch_version: str = ""        # release or commit of PyTorch
    optimizer: str = ""            # e.g. "AdamW"
    # framework settings the fields above do not cover, named as the framework's workload command takes them
    # (Megatron-core: vpp, distributed_optimizer, overlap_grad_reduce, overlap_param_gather, sequence_parallel,
    # torch_fsdp2)
    options: dict[str, bool | int | str] = field(default_factory=dict)
    task: str = ""                 # "" (a language model) or "other" (see TASKS above)

    def validate(self) -> None:
        if self.task not in TASKS:
            raise PresetError(f"'{self.task}' is not a task: leave it out for a language model, or write 'other' "
                              f"for a workload that is not one", key="workload.task")
        if self.task == "other" and self.seq_len != 1:
            raise PresetError("a workload that is not a language model counts samples: seq_len must be 1",
                              key="workload.seq_len")
        for key in ("micro_batch", "global_batch", "seq_len"):
            if getattr(self, key) < 1:
                raise PresetError("must be at least 1", key=f"workload.{key}")
        if self.activation_checkpointing not in AC_MODES:
            raise PresetError(f"'{self.activation_checkpointing}' is not one of {', '.join(AC_MODES)}",
                              key="workload.activation_checkpointing")
        if self.ac_layer_period < 0:
            raise PresetError("must not be negative", key="workload.ac_layer_period")
        if self.ac_layer_period and self.activation_checkpointing != "selective-layer":
            raise PresetError("only selective-layer checkpointing has a layer period", key="workload.ac_layer_period")
        if self.precision not in PRECISIONS:
            raise PresetError(f"'{self.precision}' is not one of {', '.join(PRECISIONS)} (Float8 linears: set "
                              f"float8 = true)", key="workload.precision")
        per_step = self.micro_batch * self.parallelism.dp
        if self.global_batch % per_step:
            raise PresetError(f"global_batch {self.global_batch} is not a multiple of micro_batch × data-parallel "
                              f"degree = {self.micro_batch} × {self.parallelism.dp} = {per_step}",
                              key="workload.global_batch")

    @property
    def grad_accumulation(self) -> int:
        return self.global_batch // (self.micro_batch * self.parallelism.dp)

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq_len


@dataclass
class Metrics:
    """What was measured; only what the source reports. Per-GPU figures are per GPU of the job."""
    tokens_per_s_per_gpu: float | None = None   # training throughput, tokens/s per GPU (TorchTitan's WPS / TPS)
    mfu_percent: float | None = None            # model FLOPs utilization, percent of the GPU's dense peak
    mfu_counts_embedding: bool = False          # the MFU's FLOPs count the input embedding (6 × all parameters)
    iteration_s: float | None = None            # seconds per optimizer step
    memory_gib: float | None = None             # peak memory per GPU (the largest over GPUs), GiB = 2^30 bytes
    memory_allocated_gib: float | None = None   # peak memory handed to tensors (torch.cuda.max_memory_allocated)
    oom: bool = False                           # the run ran out of GPU memory (then no other metric)
    at_iteration: int = 0                       # the iteration at which the figures were read (0: not stated)
    # the same configuration's iteration time measured again (other runs, other hosts of the kind), seconds: with
    # iteration_s, the measured spread a validation report sets the simulation against (raw output cited in notes)
    iteration_s_repeats: list[float] | None = None

    def validate(self) -> None:
        given = [k for k in METRIC_KEYS if getattr(self, k) is not None]
        if self.oom and given:
            raise PresetError("an out-of-memory record has no other metric", key=f"metrics.{given[0]}")
        if not self.oom and not given:
            raise PresetError(f"give at least one of {', '.join(METRIC_KEYS)} (or oom = true)", key="metrics")
        for k in given:
            if getattr(self, k) <= 0:
                raise PresetError("must be positive", key=f"metrics.{k}")
        if self.mfu_percent is not None:
            if self.mfu_percent > 100:
                raise PresetError(f"MFU {self.mfu_percent}% exceeds 100%", key="metrics.mfu_percent")
            if self.mfu_percent < 1:
                raise PresetError(f"MFU {self.mfu_percent}% looks like a fraction: write the percent "
                                  f"({100 * self.mfu_percent:g}) or use the key 'mfu' for a fraction",
                                  key="metrics.mfu_percent")
        if self.at_iteration < 0:
            raise PresetError("must not be negative", key="metrics.at_iteration")
        if self.iteration_s_repeats is not None:
            if self.oom:
                raise PresetError("an out-of-memory record has no iteration time to repeat",
                                  key="metrics.iteration_s_repeats")
            if self.iteration_s is None:
                raise PresetError("repeats of the iteration time need metrics.iteration_s, the record's own",
                                  key="metrics.iteration_s_repeats")
            if not self.iteration_s_repeats:
                raise PresetError("give at least one repeat, or leave the key out", key="metrics.iteration_s_repeats")
            for i, v in enumerate(self.iteration_s_repeats):
                if v <= 0:
                    raise PresetError("must be positive", key=f"metrics.iteration_s_repeats[{i}]")
        if (self.memory_allocated_gib is not None and self.memory_gib is not None
                and self.memory_allocated_gib > self.memory_gib):
            raise PresetError(f"{self.memory_allocated_gib:g} GiB allocated exceeds the {self.memory_gib:g} GiB peak "
                              f"memory: the caching allocator hands tensors part of what it holds",
                              key="metrics.memory_allocated_gib")

    def iteration_spread(self) -> tuple[float, float, int] | None:
        """(fastest, slowest, runs) of the iteration time over the record's run and its repeats; None without
        repeats."""
        if not self.iteration_s_repeats or self.iteration_s is None:
            return None
        runs = [self.iteration_s, *self.iteration_s_repeats]
        return min(runs), max(runs), len(runs)

    def measured(self) -> dict[str, float | bool]:
        """The metrics the record holds (OOM as {'oom': True})."""
        if self.oom:
            return {"oom": True}
        return {k: getattr(self, k) for k in METRIC_KEYS if getattr(self, k) is not None}


@dataclass
class Simulation:
    """Phantora's estimate for the record, attached by `phantora groundtruth submit --simulate`."""
    phantora_version: str
    date: str                      # YYYY-MM-DD of the simulation
    cost_source: str               # profile | cross-gpu | roofline | measured | recorded | mixed (see the harness)
    oom: bool = False
    tokens_per_s_per_gpu: float | None = None
    mfu_percent: float | None = None
    iteration_s: float | None = None
    memory_gib: float | None = None
    memory_allocated_gib: float | None = None

    def validate(self) -> None:
        _check_date(self.date, "simulation.date")


@dataclass
class Record:
    """One measurement. `assumptions` maps a key (e.g. "hardware.inter_host_gbps_per_gpu") to why its value is assumed
    rather than stated by the source."""
    id: str                        # unique within the suite; the file is groundtruth/<suite>/<id>.toml
    suite: str                     # folder under groundtruth/
    source: Source
    hardware: Hardware
    workload: Workload
    metrics: Metrics
    notes: str = ""
    assumptions: dict[str, str] = field(default_factory=dict)
    simulation: Simulation | None = None

    def validate(self) -> None:
        for key in ("id", "suite"):
            value = getattr(self, key)
            if not ID_RE.match(value):
                raise PresetError(f"'{value}' must be lowercase letters, digits, '.', '_' or '-', starting with a "
                                  f"letter or digit", key=key)
        if self.workload.parallelism.world != self.hardware.gpus:
            p = self.workload.parallelism
            raise PresetError(f"dp_shard × dp_replicate × tp × pp × cp = {p.dp_shard} × {p.dp_replicate} × {p.tp} × "
                              f"{p.pp} × {p.cp} = {p.world}, but hardware.gpus is {self.hardware.gpus}",
                              key="workload.parallelism")
        if self.workload.task == "other":
            from ..frameworks import non_language_models
            if not non_language_models(self.workload.framework):
                raise PresetError(f"framework '{self.workload.framework}' has no workloads that are not language "
                                  f"models (DeepSpeed has: resnet50, sd15-unet, gat)", key="workload.task")
            for section, table in (("metrics", self.metrics), ("simulation", self.simulation)):
                for k in METRIC_KEYS:
                    if table is not None and k not in OTHER_TASK_METRICS and getattr(table, k) is not None:
                        raise PresetError(f"a workload that is not a language model is measured by "
                                          f"{' and '.join(OTHER_TASK_METRICS)} only (it has no tokens or model "
                                          f"FLOPs)", key=f"{section}.{k}")
            if self.metrics.mfu_counts_embedding:
                raise PresetError("a workload that is not a language model has no MFU convention",
                                  key="metrics.mfu_counts_embedding")
        for key in self.assumptions:
            section, _, name = key.partition(".")
            if section not in ("source", "hardware", "workload", "metrics") or not name:
                raise PresetError(f"'{key}' does not name a key of the record (e.g. hardware.inter_host_link)",
                                  key="assumptions")

    def to_table(self) -> dict[str, Any]:
        """The record as plain tables, in canonical key order, without unset optional values and empty strings."""
        return _prune(to_table(self))


def _prune(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _prune(v) for k, v in value.items() if v is not None and v != {} and v != ""}
    return value


def record_from_table(table: dict[str, Any], *, file: str | None = None) -> Record:
    """A validated `Record` from a raw TOML table (alias units converted first)."""
    return build(Record, normalize_units(table, file=file), file=file)


def load_record(path: str | Path) -> Record:
    """Read and validate one record file."""
    return record_from_table(read_toml(Path(path)), file=str(path))
