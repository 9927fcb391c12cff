"""Replay: rebuild each rank's op stream from a trace and run the engine under another cluster, GPU or algorithm.

Kernels are re-costed from their signatures when the GPU changes or a profile database is given; otherwise their
recorded durations are kept, so a replay on the recorded cluster reproduces the recorded timeline exactly.
Collectives and transfers are always re-simulated on the (possibly new) network.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from .cluster import ClusterSpec, apply_overrides, cluster_from_table, load_cluster
from .engine.core import Engine
from .engine.ops import CostSource, OpKind
from .engine.recorder import Recorder
from .errors import PhantoraError


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
        if not self.tokens_per_iteration or not self.iterations_s:
            return None
        return self.tokens_per_iteration / self.iteration_s / self.world_size

    @property
    def mfu(self) -> float | None:
        tps = self.tokens_per_s_per_gpu
        if tps is None or not self.flops_per_token or not self.peak_flops:
            return None
        return tps * self.flops_per_token / self.peak_flops

    def as_dict(self) -> dict:
        return {"cluster": self.cluster, "gpu": self.gpu, "world_size": self.world_size,
                "iteration_s": self.iteration_s, "recorded_iteration_s": self.recorded_iteration_s,
                "iterations_s": self.iterations_s, "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
                "mfu": self.mfu, "ops": self.n_ops, "wall_s": self.wall_s, "ops_per_s": self.ops_per_s,
                "ooms": self.ooms, **{k: v for k, v in self.summary.items() if isinstance(v, (int, float, str))}}


def iteration_times(marks_by_rank: dict[int, list[float]]) -> list[float]:
    """Iteration times from per-rank ITER_MARK times: iteration k ends when the slowest rank marks it."""
    lists = [m for m in marks_by_rank.values() if len(m)]
    if not lists:
        return []
    n = min(len(m) for m in lists)
    ends = [max(m[i] for m in lists) for i in range(n)]
    return [b - a for a, b in zip(ends, ends[1:])]


def resolve_cluster(meta: dict, cluster: str | None, nodes: int | None, gpus_per_node: int | None, gpu: str | None,
                    overrides: tuple[str, ...]) -> ClusterSpec:
    if cluster:
        spec = load_cluster(cluster, nodes=nodes, gpus_per_node=gpus_per_node, gpu=gpu, overrides=overrides)
    else:
        if "cluster" not in meta:
            raise PhantoraError("the trace records no cluster; pass --cluster")
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


def replay(trace: str | Path, *, cluster: str | None = None, nodes: int | None = None, gpus_per_node: int | None = None,
           gpu: str | None = None, profile: str | None = None, overrides: tuple[str, ...] = (), out: str | None = None,
           algo: str | None = None, proto: str | None = None, progress=None) -> ReplayResult:
    from .trace.reader import TraceReader
    from .trace.writer import TraceWriter

    with TraceReader(trace) as reader:
        meta = reader.meta
        spec = resolve_cluster(meta, cluster, nodes, gpus_per_node, gpu, overrides)
        world = int(meta.get("world_size", spec.world_size))
        if spec.world_size != world:
            raise PhantoraError(f"the trace has {world} ranks but cluster {spec.name} has {spec.world_size} GPUs "
                                f"({spec.nodes} x {spec.gpus_per_node}); pick --nodes/--gpus-per-node to match")
        rank_map = meta.get("rank_map") or list(range(world))
        simulated = list(reader.ranks)
        recost = None
        recorded_gpu = meta.get("gpu")
        if profile or (spec.gpu != recorded_gpu and recorded_gpu is not None):
            recost = _recoster(spec, reader.signatures, profile)
        out_path = out or tempfile.mktemp(suffix=".h5", prefix="phantora-replay-")
        out_meta = dict(meta)
        out_meta.update({"mode": "replay", "cluster": spec.to_table(), "gpu": spec.gpu, "replayed_from": str(trace)})
        writer = TraceWriter(out_path, out_meta)
        for sig in reader.signatures:
            writer.add_signature(sig)
        recorder = Recorder(writer)
        engine = Engine(spec, simulated=simulated, rank_map=rank_map, sink=recorder, algo=algo, proto=proto)
        recorder.attach(engine)
        for gid, (name, ranks) in sorted(reader.groups.items()):
            engine.add_group(gid, ranks, name)
            writer.add_group(gid, ranks, name)
        recorded = {r: list(reader.iterations(r)) for r in simulated}
        n_ops = 0
        t0 = time.perf_counter()
        for i, r in enumerate(simulated):
            ops = list(reader.iter_ops(r))
            if recost is not None:
                recost(ops)
            n_ops += len(ops)
            engine.feed(r, ops)
            engine.close(r)
            if progress:
                progress("load", i + 1, len(simulated))
        done = engine.run()
        wall = time.perf_counter() - t0
        recorder.flush()
        writer.update_meta({"complete_simulation": bool(done)})
        writer.close()
    marks = {r: engine.ranks[r].iterations for r in simulated}
    gspec = spec.gpu_spec()
    result = ReplayResult(spec.name, spec.gpu, spec.world_size, iteration_times(marks), iteration_times(recorded),
                          n_ops, wall, meta.get("tokens_per_iteration"), meta.get("flops_per_token"),
                          gspec.peak_flops("bf16"))
    result.ooms = [{"rank": r, "op": i, "message": str(e)} for r, i, e in engine.ooms]
    try:
        from .trace.reader import TraceReader as _R
        from .trace.summary import summarize
        with _R(out_path) as rd:
            result.summary = _flat_summary(summarize(rd))
    except (ImportError, PhantoraError):
        pass
    if out is None:
        Path(out_path).unlink(missing_ok=True)
    return result


def _flat_summary(s: dict) -> dict:
    """The run-wide figures of a trace summary (seconds per rank, averaged)."""
    ranks = s.get("ranks") or []
    if isinstance(ranks, dict):
        ranks = list(ranks.values())
    out = {}
    for key, name in (("compute", "compute_s"), ("communication", "communication_s"),
                      ("exposed_communication", "exposed_communication_s")):
        vals = [r[key] for r in ranks if isinstance(r.get(key), (int, float))]
        if vals:
            out[name] = sum(vals) / len(vals)
    return out


def _recoster(spec: ClusterSpec, signatures: list[str], profile: str | None):
    """A function that re-costs KERNEL ops in place on the new GPU."""
    try:
        from .costmodel.model import CostModel
        from .costmodel.profiledb import ProfileDB
    except ImportError:
        raise PhantoraError("re-costing kernels for another GPU or a profile needs phantora.costmodel.model, "
                            "which this installation lacks") from None
    from .costmodel.signature import Signature

    db = ProfileDB.open(profile) if profile else None
    model = CostModel(spec.gpu_spec(), profile_db=db)
    cache: dict[int, tuple[float, int]] = {}

    def apply(ops):
        for op in ops:
            if op.kind != OpKind.KERNEL or op.sig < 0:
                continue
            c = cache.get(op.sig)
            if c is None:
                cost = model.estimate(Signature.from_key(signatures[op.sig]))
                c = cache[op.sig] = (cost.duration_s, int(cost.source))
            op.duration, op.source = c
    return apply
