"""Replay: rebuild each rank's op stream from a trace and run the engine under another cluster, GPU or algorithm.

Kernels are re-costed from their signatures (the GPU's profile, else a same-architecture GPU's across, else the
roofline: `costmodel.select.default_cost_model`, as in live runs) when the GPU changes, a profile database is given
or `recost` is asked for (after the profiles were extended); otherwise their recorded durations are kept, so a replay on the recorded cluster reproduces the recorded timeline exactly.
Collectives and transfers are always re-simulated on the (possibly new) network.

A trace whose run failed (the writer recorded an error), was never closed (killed) or whose simulation did not
complete is refused with a TraceError saying what the trace records, unless `allow_incomplete`: its replay would
time only what the run did before it stopped. A replay that runs out of device memory completes (the allocator
model records every failed allocation in `ReplayResult.ooms`, with the bytes asked for and the capacity); callers
must report it (`phantora replay` exits with status 3). A failed replay leaves no output trace behind.
"""

from __future__ import annotations

import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from . import throughput
from .throughput import iteration_times
from .cluster import ClusterSpec, apply_overrides, check_node_options, cluster_from_table, load_cluster
from .engine.allocator import AllocatorConfig
from .engine.core import Engine
from .engine.ops import OpKind
from .engine.recorder import Recorder
from .net.collectives import forced_choice_text
from .errors import PhantoraError, TraceError
from .gcpause import gc_paused
from .hostcpu import HostCosts
from .trace.deps import check_dependencies


@dataclass
class ReplayResult:
    cluster: str
    gpu: str
    world_size: int
    iterations_s: list[float]            # simulated iteration times (global: slowest rank)
    recorded_iterations_s: list[float]
    n_ops: int
    wall_s: float
    tokens_per_iteration: float | None = None
    flops_per_token: float | None = None
    peak_flops: float = 0.0
    summary: dict = field(default_factory=dict)
    ooms: list = field(default_factory=list)
    kernel_time_by_source: list = field(default_factory=list)   # per simulated rank: CostSource value -> seconds
    peak_reserved_bytes: dict = field(default_factory=dict)     # per simulated rank: the allocator model's peaks
    peak_allocated_bytes: dict = field(default_factory=dict)
    allocator: str = ""                                          # PYTORCH_CUDA_ALLOC_CONF the replay modelled
    routing: dict | None = None                                  # the expert routing the recorded run assumed
    recorded_problem: str | None = None     # what the input trace says went wrong in its run (allow_incomplete)
    # model constants of the recorded cluster that its preset has changed since (replayed as recorded: preset_drift)
    preset_drift: list = field(default_factory=list)
    forced: str = ""                        # where --algo/--proto did not apply ("" = everywhere or not given)
    recorded_choice: str = ""               # the --algo/--proto the recorded run forced and the replay kept

    @property
    def out_of_memory(self) -> bool:
        """True when the replayed run ran out of device memory on some rank (see `ooms`)."""
        return bool(self.ooms)

    @property
    def iteration_s(self) -> float:
        return statistics.median(self.iterations_s) if self.iterations_s else float("nan")

    @property
    def recorded_iteration_s(self) -> float:
        return statistics.median(self.recorded_iterations_s) if self.recorded_iterations_s else float("nan")

    @property
    def ops_per_s(self) -> float:
        return self.n_ops / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def tokens_per_s_per_gpu(self) -> float | None:
        return throughput.tokens_per_s_per_gpu(self.tokens_per_iteration, self.iteration_s if self.iterations_s else None, self.world_size)

    @property
    def mfu(self) -> float | None:
        return throughput.mfu(self.tokens_per_s_per_gpu, self.flops_per_token, self.peak_flops)

    def as_dict(self) -> dict:
        return {"cluster": self.cluster, "gpu": self.gpu, "world_size": self.world_size,
                "iteration_s": self.iteration_s, "recorded_iteration_s": self.recorded_iteration_s,
                "iterations_s": self.iterations_s, "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
                "mfu": self.mfu, "ops": self.n_ops, "wall_s": self.wall_s, "ops_per_s": self.ops_per_s,
                "ooms": self.ooms, "out_of_memory": self.out_of_memory, "allocator": self.allocator,
                "routing": self.routing, "recorded_problem": self.recorded_problem, "forced": self.forced,
                "recorded_choice": self.recorded_choice,
                "peak_reserved_bytes": {str(r): v for r, v in self.peak_reserved_bytes.items()},
                "peak_allocated_bytes": {str(r): v for r, v in self.peak_allocated_bytes.items()},
                **{k: v for k, v in self.summary.items() if isinstance(v, (int, float, str))}}


def resolve_cluster(meta: dict, cluster: str | None, nodes: int | None, gpus_per_node: int | None, gpu: str | None,
                    overrides: tuple[str, ...]) -> ClusterSpec:
    if cluster:
        spec = load_cluster(cluster, nodes=nodes, gpus_per_node=gpus_per_node, gpu=gpu, overrides=overrides)
    else:
        if "cluster" not in meta:
            raise PhantoraError("the trace records no cluster; pass --cluster")
        check_node_options(nodes, gpus_per_node)
        spec = cluster_from_table(meta["cluster"], origin="the trace's cluster")
        changes = list(overrides)
        if nodes is not None:
            changes.append(f"nodes={nodes}")
        if gpus_per_node is not None:
            changes.append(f"gpus_per_node={gpus_per_node}")
        if gpu is not None:
            changes.append(f"gpu='{gpu}'")
        if changes:
            spec = apply_overrides(spec, changes, origin="the trace's cluster")
        spec.gpu_spec()
    return spec


DRIFT_SECTIONS = ("nccl", "host", "streams")   # the cluster's fitted model constants (GPU sharing, host CPU prices
#                                                 and rates, streams side by side)


def preset_drift(spec: ClusterSpec, overridden: tuple[str, ...] = ()) -> list[str]:
    """The model constants in which a trace's recorded cluster differs from the preset of the same name today
    ("nccl.sharing_compute 1.18 (preset: 1.8)"), leaving out the `overridden` keys ("host.py_line_ns": the user's
    --set, not a change of the preset); none for a cluster that is no preset (a TOML file, renamed)."""
    try:
        today = load_cluster(spec.name, nodes=spec.nodes, gpus_per_node=spec.gpus_per_node).to_table()
    except PhantoraError:
        return []
    mine = spec.to_table()
    return [f"{section}.{key} {value} (preset: {today[section][key]})"
            for section in DRIFT_SECTIONS for key, value in mine.get(section, {}).items()
            if key in today.get(section, {}) and today[section][key] != value and f"{section}.{key}" not in overridden]


def matching_cluster(meta: dict, cluster: str | None, nodes: int | None, gpus_per_node: int | None,
                     gpu: str | None, overrides: tuple[str, ...]) -> ClusterSpec:
    """`resolve_cluster`, refused unless it has as many GPUs as the traced run had ranks."""
    spec = resolve_cluster(meta, cluster, nodes, gpus_per_node, gpu, overrides)
    world = int(meta.get("world_size", spec.world_size))
    if spec.world_size != world:
        raise PhantoraError(f"the trace has {world} ranks but cluster {spec.name} has {spec.world_size} GPUs "
                            f"({spec.nodes} x {spec.gpus_per_node}); pick --nodes/--gpus-per-node to match")
    return spec


def replay(trace: str | Path, *, cluster: str | None = None, nodes: int | None = None, gpus_per_node: int | None = None,
           gpu: str | None = None, profile: str | None = None, overrides: tuple[str, ...] = (), out: str | None = None,
           algo: str | None = None, proto: str | None = None, progress=None, recost: bool = False,
           alloc_conf: str | None = None, allow_incomplete: bool = False, overwrite: bool = False) -> ReplayResult:
    """Re-simulate `trace` (see the module docstring). `wall_s` (and so `ops_per_s`) covers reading the op tables,
    the simulation and building the new rows; with `out`, also writing them (an existing `out` is refused unless
    `overwrite`)."""
    from .trace.reader import TraceReader
    from .trace.summary import kernel_time_by_source, summarize_ops
    from .trace.writer import TraceWriter

    with TraceReader(trace) as reader:
        meta = reader.meta
        algo, proto, kept = collective_choice(meta, algo, proto)
        problem = recorded_problem(reader)
        if problem is not None and not allow_incomplete:
            raise TraceError(f"{problem}; a replay would time only what the run did before it stopped (pass "
                             f"--allow-incomplete to replay it anyway)")
        spec = matching_cluster(meta, cluster, nodes, gpus_per_node, gpu, overrides)
        world = int(meta.get("world_size", spec.world_size))
        rank_map = meta.get("rank_map") or list(range(world))
        simulated = list(reader.ranks)
        recorded_gpu = meta.get("gpu")
        recoster = None
        if recost and profile is None and spec.gpu == recorded_gpu and meta.get("profile"):
            profile = meta["profile"]           # the live run's own --profile
            if not Path(profile).exists():
                raise PhantoraError(f"the trace was costed from the profile {profile}, which is not there; pass "
                                    f"--profile to re-cost from another")
        if recost or profile or (spec.gpu != recorded_gpu and recorded_gpu is not None):
            recoster = _recoster(spec, reader.signatures, profile, reader.path)
        host_costs = host_recost(meta, spec)
        writer = None
        if out is not None:
            out_meta = {k: v for k, v in meta.items() if k not in ("created", "versions")}   # this run's own
            out_meta.update({"mode": "replay", "cluster": spec.to_table(), "gpu": spec.gpu,
                             "replayed_from": str(trace), "algo": algo, "proto": proto})
            writer = TraceWriter(out, out_meta, overwrite=overwrite)
            for name in reader.names:        # same string ids as the input
                writer.add_string(name)
            for sig in reader.signatures:
                writer.add_signature(sig)
        recorder = Recorder(writer, keep=True)
        allocator = AllocatorConfig.parse(meta.get("allocator", "") if alloc_conf is None else alloc_conf)
        engine = Engine(spec, simulated=simulated, rank_map=rank_map, sink=recorder, algo=algo, proto=proto,
                        allocator=allocator)
        recorder.attach(engine)
        for gid, (name, ranks) in sorted(reader.groups.items()):
            engine.add_group(gid, ranks, name)
            if writer is not None:
                writer.add_group(gid, ranks, name)
        try:
            with gc_paused():
                n_ops, wall, done, recorded = _simulate(reader, engine, recorder, simulated, recoster, progress,
                                                        trace, host_costs)
        except BaseException:
            if writer is not None:
                writer.discard()           # no half-replayed trace at `out` (nor in place of an existing one)
            raise
        names = recorder.names
        ooms = [_oom_entry(r, i, e) for r, i, e in engine.ooms]
        if writer is not None:
            writer.update_meta({"complete_simulation": bool(done and not recorder.missing())})
            writer.close(error=f"rank {ooms[0]['rank']}: {ooms[0]['message']}" if ooms else None)
    marks = {r: engine.ranks[r].iterations for r in simulated}
    gspec = spec.gpu_spec()
    result = ReplayResult(spec.name, spec.gpu, spec.world_size, iteration_times(marks), iteration_times(recorded),
                          n_ops, wall, meta.get("tokens_per_iteration"), meta.get("flops_per_token"),
                          gspec.peak_flops("bf16"))
    result.ooms = ooms
    result.recorded_problem = problem
    if cluster is None:
        # the user's --set now and the recorded run's own (meta `overrides`) are not the preset's changes
        result.preset_drift = preset_drift(spec, tuple(o.split("=", 1)[0].strip() for o in overrides)
                                           + tuple(meta.get("overrides") or ()))
    result.summary = _flat_summary({"ranks": [summarize_ops(recorder.rows(r), names, np.asarray(marks[r]))
                                              for r in simulated]})
    result.kernel_time_by_source = [kernel_time_by_source(recorder.rows(r)) for r in simulated]
    result.peak_reserved_bytes = {r: engine.ranks[r].allocator.reserved.peak for r in simulated}
    result.peak_allocated_bytes = {r: engine.ranks[r].allocator.allocated.peak for r in simulated}
    result.allocator = allocator.to_text()
    result.forced = forced_choice_text(engine.collectives, algo, proto)
    result.recorded_choice = kept
    result.routing = meta.get("routing")
    recorder.engine = None   # engine and recorder refer to each other: let reference counting free them now
    return result


LIVE_ONLY = ("software.", "host.cpu_cores", "host.to_tensor_ns", "host.infer_dtype_ns", "host.to_list_ns",
             "host.copy_gbps", "host.downcast_gbps", "host.upcast_gbps", "host.elementwise_gbps",
             "host.reduction_gbps", "host.cpu_adam_gbps")
"""Cluster fields only a live run applies: the software the ranks load, and the prices of host compute on large host
tensors and of conversions, which a trace keeps as recorded durations (docs/host-cpu.md)."""


def live_only(overrides) -> list[str]:
    """The keys of `--set KEY=VALUE` overrides that a replay cannot apply (`LIVE_ONLY`)."""
    keys = [o.split("=", 1)[0].strip() for o in overrides]
    return [k for k in keys if any(k == p or (p.endswith(".") and k.startswith(p)) for p in LIVE_ONLY)]


def collective_choice(meta: dict, algo: str | None, proto: str | None) -> tuple[str | None, str | None, str]:
    """The algorithm and protocol a replay forces: the given ones, else those the recorded run forced (its meta's
    `algo` / `proto`), so that a replay on the recorded cluster reproduces the run; "auto": NCCL's own choice.
    Also the recorded choice kept, in words ("" when none was)."""
    kept = []
    if algo is None and meta.get("algo"):
        algo = meta["algo"]
        kept.append(f"--algo {algo}")
    if proto is None and meta.get("proto"):
        proto = meta["proto"]
        kept.append(f"--proto {proto}")
    return (None if algo == "auto" else algo), (None if proto == "auto" else proto), " ".join(kept)


def recorded_problem(reader) -> str | None:
    """What the trace says went wrong in the run that wrote it (None for a run that ended normally): the error the
    writer recorded, a trace never closed, or a simulation that did not complete."""
    if not reader.complete:
        return reader.warning
    if reader.error:
        return f"{reader.path}: the run that wrote this trace failed: {reader.error}"
    if reader.meta.get("complete_simulation") is False:
        return (f"{reader.path}: the run that wrote this trace did not complete its simulation (its meta says "
                f"complete_simulation: false)")
    return None


def _oom_entry(rank: int, op: int, exc) -> dict:
    """An OOM of the allocator model as a dict: rank, op index, message, and the bytes asked for and available."""
    out = {"rank": int(rank), "op": int(op), "message": str(exc)}
    for key, attr in (("requested_bytes", "rounded"), ("allocated_bytes", "allocated"),
                      ("reserved_bytes", "reserved"), ("capacity_bytes", "capacity"),
                      ("outside_bytes", "outside")):
        value = getattr(exc, attr, None)
        if value is not None:
            out[key] = int(value)
    return out


def host_recost(meta: dict, spec: ClusterSpec) -> tuple[HostCosts, HostCosts] | None:
    """(new, recorded) host prices to cost a trace's counted host work again with (phantora/hostcpu.py), or None to
    keep its recorded `cpu_delta`s: only a trace of the modelled host CPU can be re-costed, and only prices that
    differ from the recorded ones change anything (so a replay on the recorded cluster reproduces the run exactly).

    A trace recorded before Python lines were counted (no `py_line_ns` in its meta) knows its Python as calls only:
    its lines are not priced, and prices that leave calls to the lines (`py_call_ns` 0) keep its recorded call price."""
    recorded = meta.get("host_cpu") or {}
    if recorded.get("mode") != "model":
        return None
    costs = HostCosts.from_spec(spec.host)
    if "py_line_ns" not in recorded:
        recorded = {**recorded, "py_line_ns": 0.0}
        costs = replace(costs, py_line_s=0.0, py_call_s=costs.py_call_s or recorded["py_call_ns"] * 1e-9)
    if all(recorded.get(k) == v for k, v in costs.as_dict().items()):
        return None
    old = HostCosts(recorded["py_call_ns"] * 1e-9, recorded["c_call_ns"] * 1e-9, recorded["dispatch_us"] * 1e-6,
                    recorded["py_line_ns"] * 1e-9)
    return costs, old


def _simulate(reader, engine: Engine, recorder: Recorder, simulated: list[int], recost, progress, trace,
              host_costs=None):
    """The timed part of a replay: read and feed every rank's ops, check the dependencies table, run, build rows.
    Returns (ops, wall seconds, whether the simulation completed, recorded iteration marks by rank)."""
    n_ops = 0
    t0 = time.perf_counter()
    rows_by_rank = {}
    recorded = {}

    # A reader thread reads and inflates the op tables (zlib releases the GIL) while this one builds the ops.
    def read(rank: int):
        rows = reader.ops(rank)
        return rows, list(reader.iterations(rank, rows))

    with ThreadPoolExecutor(1, thread_name_prefix="phantora-replay-read") as pool:
        tables = [pool.submit(read, r) for r in simulated]
        for i, (r, table) in enumerate(zip(simulated, tables)):
            rows, recorded[r] = table.result()
            if host_costs is not None:        # the host work the run counted, priced for this host
                new, old = host_costs
                counts = rows["host_py"], rows["host_c"], rows["host_disp"], rows["host_line"]
                rows = rows.copy()
                # only the counted part changes: what a sleep charged (no counts) stays as recorded
                rows["cpu_delta"] = np.maximum(rows["cpu_delta"] + new.seconds_of(*counts) - old.seconds_of(*counts),
                                               0.0)
            rows_by_rank[r] = rows
            ops = reader.op_objects(rows, r)
            if recost is not None:
                recost(ops)
            recorder.use_template(r, rows, reader.names, costs_from_ops=recost is not None)
            n_ops += len(ops)
            engine.feed(r, ops)
            engine.close(r)
            if progress:
                progress("load", i + 1, len(simulated))
    deps = reader.dependencies
    if len(deps):
        n_bad, problems = check_dependencies(deps, rows_by_rank, timing=False)
        if n_bad:
            raise TraceError(f"{trace}: the dependencies table contradicts the op tables in {n_bad} row(s): "
                             + "; ".join(problems))
    del rows_by_rank
    done = engine.run()
    recorder.flush()
    return n_ops, time.perf_counter() - t0, done, recorded


def _flat_summary(s: dict) -> dict:
    """The run-wide figures of a trace summary (seconds per rank, averaged)."""
    ranks = s.get("ranks") or []
    if isinstance(ranks, dict):
        ranks = list(ranks.values())
    out = {}
    # per iteration where the ranks have iterations (trace/summary.py); `time_basis` says which
    bases = {r.get("time_basis") for r in ranks if r.get("time_basis")}
    if bases:
        out["time_basis"] = bases.pop() if len(bases) == 1 else "mixed"
    shares = [r["idle_share"] for r in ranks if isinstance(r.get("idle_share"), (int, float))]
    if shares:
        out["host_bound_share"] = max(shares)
    for key, name in (("compute", "compute_s"), ("communication", "communication_s"),
                      ("exposed_communication", "exposed_communication_s"), ("gpu_idle", "gpu_idle_s")):
        vals = [r[key] for r in ranks if isinstance(r.get(key), (int, float))]
        if vals:
            out[name] = sum(vals) / len(vals)
    return out


def _recoster(spec: ClusterSpec, signatures: list[str], profile: str | None, path=None):
    """A function that re-costs KERNEL ops in place on the new GPU."""
    from .costmodel.select import default_cost_model
    from .costmodel.signature import Signature

    model = default_cost_model(spec.gpu_spec(), profile)
    cache: dict[int, tuple[float, int]] = {}

    def apply(ops):
        for op in ops:
            if op.kind != OpKind.KERNEL or op.sig < 0:
                continue
            c = cache.get(op.sig)
            if c is None:
                if op.sig >= len(signatures):
                    raise TraceError(f"{path}: a kernel names signature {op.sig}, but the signature table has "
                                     f"{len(signatures)} entries: it cannot be re-costed")
                cost = model.estimate(Signature.from_key(signatures[op.sig]))
                c = cache[op.sig] = (cost.duration_s, int(cost.source))
            op.duration, op.source = c
    return apply
