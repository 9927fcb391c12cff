"""Plausibility of a record against the presets and against physics.

`check_record(record)` returns the problems (which make a submission fail) and warnings (which are printed). The
checks: the framework is one of `schema.RECORD_FRAMEWORKS`; the GPU, model and cluster presets exist and agree
with the record; the cluster preset models the measured hosts; peak memory fits in the GPU's memory unless the run
ran out of it; the throughput is below what the GPU's dense peak allows for the model's training FLOPs per token; a
reported MFU agrees with the reported throughput; an iteration time agrees with the throughput and the batch; a run
that offloads to the host (a `workload.options` key `offload...`) names its host's cores.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import PhantoraError, PresetError
from .schema import RECORD_FRAMEWORKS, Record

TOLERANCE = 0.10      # relative disagreement allowed between two figures that must describe the same run


class GroundTruthError(PhantoraError):
    """A record cannot be filed: implausible, a duplicate, or contradicting another record."""


@dataclass
class CheckReport:
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def matmul_dtype(record: Record) -> str:
    """The dtype whose peak bounds the run: fp8 for Float8 linears, else the training precision."""
    return "fp8" if record.workload.float8 else record.workload.precision


def flops_per_token(record: Record, *, count_embedding: bool | None = None) -> float:
    """Training FLOPs per token of the record's model at its sequence length (TorchTitan's convention).

    `count_embedding` defaults to the convention of the record's MFU (`metrics.mfu_counts_embedding`).
    """
    from ..models import load_model
    if count_embedding is None:
        count_embedding = record.metrics.mfu_counts_embedding
    return float(load_model(record.workload.model).flops_per_token(record.workload.seq_len,
                                                                   count_embedding=count_embedding))


def implied_mfu_percent(record: Record, tokens_per_s_per_gpu: float) -> float:
    """The MFU (percent) a throughput means for the record's model, GPU and MFU convention."""
    from ..gpus import load_gpu
    peak = load_gpu(record.hardware.gpu).peak_flops(record.workload.precision)
    return 100.0 * tokens_per_s_per_gpu * flops_per_token(record) / peak


REPEAT_RATIO = 3.0     # a repeated run farther than this factor from the record's own is a unit or a typo


def check_record(record: Record, *, file: str | None = None) -> CheckReport:
    """Every plausibility problem of `record` (see the module docstring)."""
    from ..cluster import load_cluster
    from ..frameworks import non_language_models
    from ..gpus import load_gpu
    from ..models import load_model

    rep = CheckReport()
    hw, wl, m = record.hardware, record.workload, record.metrics
    where = f"{file}: " if file else ""

    def problem(key: str, text: str) -> None:
        rep.problems.append(f"{where}key '{key}': {text}")

    def warn(key: str, text: str) -> None:
        rep.warnings.append(f"{where}key '{key}': {text}")

    if wl.framework not in RECORD_FRAMEWORKS:
        problem("workload.framework", f"unknown framework '{wl.framework}' (known: "
                                      f"{', '.join(RECORD_FRAMEWORKS)})")
    gpu = model = cluster = None
    try:
        gpu = load_gpu(hw.gpu)
    except PresetError as exc:
        problem("hardware.gpu", str(exc))
    if wl.task == "other":
        known = non_language_models(wl.framework)
        if wl.model not in known:
            problem("workload.model", f"'{wl.model}' is not a workload of framework '{wl.framework}' that Phantora "
                                      f"runs (known: {', '.join(known) or 'none'})")
    else:
        try:
            model = load_model(wl.model)
        except PresetError as exc:
            problem("workload.model", str(exc))
    try:
        cluster = load_cluster(hw.cluster, nodes=hw.hosts)
    except PresetError as exc:
        problem("hardware.cluster", str(exc))

    if cluster is not None:
        if cluster.gpu != hw.gpu:
            problem("hardware.cluster", f"cluster preset '{hw.cluster}' has GPU '{cluster.gpu}', the record '{hw.gpu}'")
        if cluster.gpus_per_node != hw.gpus_per_host:
            problem("hardware.cluster", f"cluster preset '{hw.cluster}' has {cluster.gpus_per_node} GPUs per node, "
                                        f"the record {hw.gpus_per_host} per host")
        if cluster.intra.kind != hw.intra_host_link:
            warn("hardware.intra_host_link", f"'{hw.intra_host_link}' but cluster preset '{hw.cluster}' models "
                                             f"'{cluster.intra.kind}'")
        offloads = any(k.startswith("offload") and v not in ("", "none", False) for k, v in wl.options.items())
        if offloads and hw.host_cpu_cores is None:
            warn("hardware.host_cpu_cores", f"not given, and the run offloads to the host: its host compute is "
                                            f"priced at cluster preset '{hw.cluster}''s {cluster.host.cpu_cores} cores "
                                            f"(give the measured host's `nproc`)")
        if hw.hosts > 1 and cluster.net.nics_per_node:
            per_gpu = cluster.net.inter_node_gbps * cluster.net.nics_per_node / cluster.gpus_per_node
            if abs(per_gpu - hw.inter_host_gbps_per_gpu) > TOLERANCE * hw.inter_host_gbps_per_gpu:
                warn("hardware.inter_host_gbps_per_gpu",
                     f"{hw.inter_host_gbps_per_gpu:g} Gb/s per GPU but cluster preset '{hw.cluster}' gives "
                     f"{per_gpu:g} Gb/s per GPU")

    if m.iteration_s is not None and m.iteration_s_repeats:
        for i, v in enumerate(m.iteration_s_repeats):
            if not m.iteration_s / REPEAT_RATIO <= v <= m.iteration_s * REPEAT_RATIO:
                problem(f"metrics.iteration_s_repeats[{i}]",
                        f"{v:g} s is more than {REPEAT_RATIO:g} times from iteration_s ({m.iteration_s:g} s): "
                        f"repeats are seconds per step, even where iteration_ms gives the record's own")

    if model is not None and wl.seq_len > model.max_seq_len:
        problem("workload.seq_len", f"{wl.seq_len} exceeds {wl.model}'s longest context ({model.max_seq_len})")

    if gpu is not None:
        if wl.float8 and gpu.peak_tflops.get("fp8", 0.0) <= 0:
            problem("workload.float8", f"{hw.gpu} has no FP8 tensor cores")
        if m.memory_gib is not None and m.memory_gib > gpu.memory_gib:
            problem("metrics.memory_gib", f"{m.memory_gib:g} GiB per GPU exceeds the {gpu.memory_gib:g} GiB of "
                                          f"{hw.gpu} (a run that did not fit is recorded with oom = true)")
        if m.memory_gib is not None and m.memory_gib > 10 * gpu.memory_gib:
            problem("metrics.memory_gib", "looks like bytes or MiB: give GiB, or use memory_bytes / memory_mib")
        if m.memory_allocated_gib is not None and m.memory_allocated_gib > gpu.memory_gib:
            problem("metrics.memory_allocated_gib", f"{m.memory_allocated_gib:g} GiB per GPU exceeds the "
                                                    f"{gpu.memory_gib:g} GiB of {hw.gpu}")

    if gpu is not None and model is not None and m.tokens_per_s_per_gpu is not None:
        # The loosest bound: the smaller FLOP count (no embedding, no recomputation) at the larger peak.
        fpt = float(model.flops_per_token(wl.seq_len, count_embedding=False))
        limit = gpu.peak_flops(matmul_dtype(record)) / fpt
        if m.tokens_per_s_per_gpu > limit:
            problem("metrics.tokens_per_s_per_gpu",
                    f"{m.tokens_per_s_per_gpu:g} tokens/s per GPU needs {m.tokens_per_s_per_gpu * fpt / 1e12:.1f} "
                    f"TFLOP/s, above the {hw.gpu} {matmul_dtype(record)} dense peak of "
                    f"{gpu.peak_flops(matmul_dtype(record)) / 1e12:g} TFLOP/s (at most {limit:.0f} tokens/s per GPU)")
        elif m.mfu_percent is not None and not wl.float8:
            implied = implied_mfu_percent(record, m.tokens_per_s_per_gpu)
            if abs(implied - m.mfu_percent) > TOLERANCE * m.mfu_percent:
                problem("metrics.mfu_percent",
                        f"{m.mfu_percent:g}% disagrees with the throughput: {m.tokens_per_s_per_gpu:g} tokens/s per "
                        f"GPU × {flops_per_token(record) / 1e9:.1f} GFLOP per token / {hw.gpu} "
                        f"{wl.precision} peak = {implied:.1f}% (mfu_counts_embedding = "
                        f"{str(m.mfu_counts_embedding).lower()})")

    if m.tokens_per_s_per_gpu is not None and m.iteration_s is not None:
        implied_s = wl.tokens_per_step / (m.tokens_per_s_per_gpu * hw.gpus)
        if abs(implied_s - m.iteration_s) > TOLERANCE * m.iteration_s:
            problem("metrics.iteration_s",
                    f"{m.iteration_s:g} s disagrees with the throughput: global_batch × seq_len / (tokens/s per GPU "
                    f"× GPUs) = {wl.global_batch} × {wl.seq_len} / ({m.tokens_per_s_per_gpu:g} × {hw.gpus}) = "
                    f"{implied_s:.3f} s")
    return rep
