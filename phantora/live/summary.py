"""The report that ends a live run: iteration times, throughput, utilisation, memory and where the time went.

Iteration k ends when the slowest rank marks it (optimizer steps, or explicit marks); iteration times are the gaps
between consecutive ends, so the first (set-up) span never counts. Figures:
- `iteration_s`: median iteration time;
- `tflops_per_gpu` / `hfu`: FLOPs of the costed kernels (recomputation included) per iteration and GPU, over the
  iteration time, and that over the GPU's dense bf16 peak (hardware FLOPs utilisation);
- `tokens_per_s_per_gpu` and `mfu` when the tokens per iteration are known (`--tokens-per-iteration`) and, for MFU,
  the model (`--model`: TorchTitan's FLOPs per token);
- `peak_memory_bytes`: per simulated rank, the caching allocator's peak reserved and allocated bytes;
- compute / communication / exposed communication seconds per iteration (those of each rank's median iteration,
  trace/summary.py `median_iteration`), averaged over simulated ranks: the figures `phantora
  inspect` and `phantora replay` print (phantora/trace/summary.py, `per_iteration`); and the time the GPU runs
  nothing, waiting for the host: at HOST_BOUND_SHARE of the iteration or more the report says the step is
  host-bound, whose real time varies between hosts of one type (docs/host-cpu.md, "Host-bound steps");
- the cost of the simulation itself: wall seconds per iteration (between the moments the engine received the
  iteration marks of the slowest rank) and the peak RSS of the rank processes and of the engine.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any


from .. import throughput
from ..net.collectives import forced_choice_text
from ..throughput import iteration_times
from ..routing import describe as describe_routing, skewed

HOST_BOUND_SHARE = 0.2
"""The share of an iteration the GPU runs nothing, from which the report calls the step host-bound."""


def host_bound_text(share: float | None) -> str:
    """What the reports say of a step whose GPU idles `share` of an iteration ("" below HOST_BOUND_SHARE)."""
    if share is None or share < HOST_BOUND_SHARE:
        return ""
    return (f"the GPU runs nothing {share * 100:.0f}% of an iteration, waiting for the host: measured steps of "
            f"such configurations differ by up to 1.9 times between hosts of one type (docs/host-cpu.md)")


@dataclass
class RunSummary:
    cluster: str
    gpu: str
    world_size: int
    simulated_ranks: list[int]
    iterations_s: list[float]
    peak_memory_bytes: dict[int, int]
    peak_allocated_bytes: dict[int, int]
    vram_bytes: int
    flops_per_iteration: float | None = None         # per GPU (mean over simulated ranks)
    peak_flops: float = 0.0
    tokens_per_iteration: float | None = None
    flops_per_token: float | None = None
    compute_s: float | None = None                    # per iteration
    communication_s: float | None = None
    exposed_communication_s: float | None = None
    gpu_idle_s: float | None = None                   # per iteration: no kernel, copy or communication running
    host_bound_share: float | None = None             # median share of an iteration the GPU idles, largest over ranks
    oom: bool = False
    oom_messages: list[str] = field(default_factory=list)
    ops: int = 0
    wall_s: float = 0.0
    wall_per_iteration_s: float | None = None         # wall-clock seconds the simulation took per iteration
    rank_peak_rss_bytes: int | None = None            # largest peak RSS of a rank process
    engine_peak_rss_bytes: int | None = None          # peak RSS of the engine (launcher) process
    trace: str | None = None
    host_cpu: dict | None = None                      # how the framework's host time was found (trace meta's)
    routing: dict | None = None                       # the expert routing assumed (trace meta's)
    outside_bytes: dict[int, dict[str, int]] = field(default_factory=dict)   # per rank: memory outside the allocator
    software: str = ""                                # the cluster's [software] the ranks ran with, in words ("" = their own)
    forced: str = ""                                  # where --algo/--proto did not apply ("" = everywhere or not given)
    stopped: bool = False                             # the run failed or was interrupted (its figures are partial)

    @property
    def iteration_s(self) -> float | None:
        return statistics.median(self.iterations_s) if self.iterations_s else None

    @property
    def tflops_per_gpu(self) -> float | None:
        if not self.iteration_s or self.flops_per_iteration is None:
            return None
        return self.flops_per_iteration / self.iteration_s / 1e12

    @property
    def hfu(self) -> float | None:
        t = self.tflops_per_gpu
        return t * 1e12 / self.peak_flops if t is not None and self.peak_flops else None

    @property
    def tokens_per_s_per_gpu(self) -> float | None:
        return throughput.tokens_per_s_per_gpu(self.tokens_per_iteration, self.iteration_s, self.world_size)

    @property
    def mfu(self) -> float | None:
        return throughput.mfu(self.tokens_per_s_per_gpu, self.flops_per_token, self.peak_flops)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["peak_memory_bytes"] = {str(k): v for k, v in self.peak_memory_bytes.items()}
        d["peak_allocated_bytes"] = {str(k): v for k, v in self.peak_allocated_bytes.items()}
        for k in ("iteration_s", "tflops_per_gpu", "hfu", "tokens_per_s_per_gpu", "mfu"):
            d[k] = getattr(self, k)
        d["max_peak_memory_bytes"] = max(self.peak_memory_bytes.values(), default=0)
        return d

    def format(self) -> str:
        lines = [f"phantora: {self.world_size} x {self.gpu} on {self.cluster}; simulated ranks "
                 f"{_ranks(self.simulated_ranks)} ({self.ops:,} ops in {self.wall_s:.1f} s wall)"]
        if self.iterations_s:
            its = ", ".join(f"{t * 1e3:.1f}" for t in self.iterations_s[:8])
            more = f" ... ({len(self.iterations_s)} in all)" if len(self.iterations_s) > 8 else ""
            lines.append(f"  iteration time   median {self.iteration_s * 1e3:.2f} ms   [{its}{more}] ms")
        else:
            why = ("the run stopped before its second iteration mark" if self.stopped else
                   "fewer than two iteration marks: run at least 2 optimizer steps")
            lines.append(f"  iteration time   n/a ({why})")
        if self.tokens_per_s_per_gpu is not None:
            lines.append(f"  tokens/s/GPU     {self.tokens_per_s_per_gpu:,.0f}")
        if self.mfu is not None:
            lines.append(f"  MFU              {self.mfu * 100:.1f} %")
        if self.tflops_per_gpu is not None:
            hfu = f"   (HFU {self.hfu * 100:.1f} % of {self.peak_flops / 1e12:.0f})" if self.hfu is not None else ""
            lines.append(f"  kernel TFLOP/s   {self.tflops_per_gpu:.1f} per GPU{hfu}")
            if self.hfu is not None and self.hfu > 1.0:
                lines.append("                   above the GPU's peak: kernels of several streams ran side by side "
                             "beyond what the [streams] sharing takes (docs/cost-model.md, \"Streams of one GPU\")")
        if self.compute_s is not None:
            lines.append(f"  per iteration    compute {self.compute_s * 1e3:.2f} ms, communication "
                         f"{(self.communication_s or 0) * 1e3:.2f} ms, exposed communication "
                         f"{(self.exposed_communication_s or 0) * 1e3:.2f} ms"
                         + (f", GPU idle {self.gpu_idle_s * 1e3:.2f} ms" if self.gpu_idle_s is not None else ""))
            note = host_bound_text(self.host_bound_share)
            if note:
                lines.append(f"  host-bound       {note}")
        if self.peak_memory_bytes:
            gib = 2 ** 30
            peak = max(self.peak_memory_bytes.values())
            per = ", ".join(f"r{r} {v / gib:.2f}" for r, v in sorted(self.peak_memory_bytes.items())[:8])
            lines.append(f"  peak memory      {peak / gib:.2f} GiB reserved of {self.vram_bytes / gib:.0f} GiB "
                         f"({per} GiB)")
        if self.outside_bytes:
            gib = 2 ** 30
            rank, parts = max(self.outside_bytes.items(), key=lambda kv: sum(kv[1].values()))
            detail = ", ".join(f"{k} {v / gib:.2f}" for k, v in parts.items() if v)
            lines.append(f"  outside PyTorch  {sum(parts.values()) / gib:.2f} GiB on r{rank} ({detail} GiB), not "
                         f"in the reserved memory above")
        if self.oom:
            lines.append("  OUT OF MEMORY    " + "; ".join(self.oom_messages[:3]))
        if self.wall_per_iteration_s is not None:
            rss = ""
            if self.rank_peak_rss_bytes:
                rss = f", peak RSS {self.rank_peak_rss_bytes / 2**30:.2f} GiB per rank process"
            if self.engine_peak_rss_bytes:
                rss += f", {self.engine_peak_rss_bytes / 2**30:.2f} GiB engine"
            lines.append(f"  simulation       {self.wall_per_iteration_s:.2f} s wall per iteration{rss}")
        if self.host_cpu:
            lines.append(f"  host CPU         {host_cpu_text(self.host_cpu)}")
        if self.software:
            lines.append(f"  software         {self.software}")
        if self.forced:
            lines.append(f"  collectives      {self.forced}")
        if skewed(self.routing):
            lines.append(f"  expert routing   {describe_routing(self.routing)}")
        if self.trace:
            lines.append(f"  trace            {self.trace}")
        return "\n".join(lines)


def host_cpu_text(host: dict) -> str:
    """One line on how a run's framework host time was found (`host_cpu` of the trace meta; docs/host-cpu.md)."""
    scale = host.get("cpu_time_scale", 1.0)
    scaled = f", x{scale:g}" if scale != 1.0 else ""
    if host.get("mode") == "measured":
        return f"measured on this machine (thread CPU time{scaled}): depends on the machine that simulates"
    priced = [f"{host.get('py_line_ns', 0):g} ns per Python line"] if host.get("py_line_ns") else []
    for key, unit, what in (("py_call_ns", "ns", "Python call"), ("c_call_ns", "ns", "built-in call")):
        if host.get(key) or not priced:
            priced.append(f"{host.get(key, 0):g} {unit} per {what}")
    priced.append(f"{host.get('dispatch_us', 0):g} us per aten dispatch")
    return f"modelled: {', '.join(priced)}{scaled}{convert_text(host)} (docs/host-cpu.md)"


def convert_text(host: dict) -> str:
    """The per-element conversion prices of a run's host CPU model ("" for a trace that has none)."""
    if "to_tensor_ns" not in host:
        return ""
    return (f"; conversions {host['to_tensor_ns']:g} ns per element to a tensor (+{host.get('infer_dtype_ns', 0):g} "
            f"with no dtype), {host.get('to_list_ns', 0):g} from one")


def software_text(software) -> str:
    """The cluster's `[software]` in words, for the summary ("" when the ranks ran with their own)."""
    parts = []
    if software.torch_cuda:
        parts.append(f"torch {software.torch_cuda} CUDA kernel choices")
    if software.sdpa:
        parts.append("SDPA " + ",".join(software.sdpa))
    if software.transformer_engine:
        parts.append(f"Transformer Engine {software.transformer_engine} (stand-in, docs/megatron.md)")
    return "; ".join(parts)


def _ranks(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks[:8])) + (f", ... ({len(ranks)})" if len(ranks) > 8 else "")


def summarize_run(engine, trace_path: str | None, *, tokens_per_iteration: float | None = None,
                  flops_per_token: float | None = None, wall_s: float = 0.0, keep_trace: bool = True,
                  oom_messages: list[str] = (), wall_marks_s: list[float] | None = None,
                  host_cpu: dict | None = None, routing: dict | None = None, stopped: bool = False) -> RunSummary:
    """The summary of a finished (or stopped) live run from its engine and its closed trace."""
    spec = engine.spec
    gpu = spec.gpu_spec()
    marks = {r: list(rs.iterations) for r, rs in engine.ranks.items()}
    peak_res = {r: rs.allocator.stats["reserved_bytes.all.peak"] for r, rs in engine.ranks.items()}
    peak_alloc = {r: rs.allocator.stats["allocated_bytes.all.peak"] for r, rs in engine.ranks.items()}
    s = RunSummary(cluster=spec.name, gpu=spec.gpu, world_size=spec.world_size, simulated_ranks=sorted(engine.ranks),
                   iterations_s=iteration_times(marks), peak_memory_bytes=peak_res, peak_allocated_bytes=peak_alloc,
                   vram_bytes=engine.ranks[min(engine.ranks)].allocator.capacity, peak_flops=gpu.peak_flops("bf16"),
                   tokens_per_iteration=tokens_per_iteration, flops_per_token=flops_per_token, wall_s=wall_s,
                   trace=trace_path if keep_trace else None, host_cpu=host_cpu, routing=routing)
    import resource
    s.outside_bytes = {r: dict(rs.outside.parts) for r, rs in engine.ranks.items()}
    s.software = software_text(spec.software)
    s.forced = forced_choice_text(engine.collectives, engine.algo, engine.proto)
    s.stopped = stopped
    s.rank_peak_rss_bytes = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    s.engine_peak_rss_bytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    wall_marks = [m for m in wall_marks_s if m is not None] if wall_marks_s else []
    if len(wall_marks) >= 2:
        s.wall_per_iteration_s = (wall_marks[-1] - wall_marks[0]) / (len(wall_marks) - 1)
    msgs = list(oom_messages) + [f"rank {r}: {e}" for r, _, e in engine.ooms]
    s.oom, s.oom_messages = bool(msgs), msgs
    if trace_path is not None:
        _from_trace(s, trace_path)
    return s


def _from_trace(s: RunSummary, path: str) -> None:
    from ..errors import PhantoraError
    from ..trace.reader import TraceReader
    from ..trace.summary import flops_in, idle_shares, per_iteration

    try:
        reader = TraceReader(path)
    except PhantoraError:
        return
    with reader:
        flops, comp, comm, exp, idle, shares = [], [], [], [], [], []
        n_ops = 0
        for r in reader.ranks:
            ops = reader.ops(r)
            n_ops += len(ops)
            marks = reader.iterations(r, ops)
            if len(marks) < 2:
                continue
            lo, hi = float(marks[0]), float(marks[-1])
            n = len(marks) - 1
            flops.append(flops_in(ops, (lo, hi)) / n)
            part = per_iteration(ops, marks)      # the meaning `phantora inspect` and replay give these figures
            mine = idle_shares(ops, marks)
            if mine:
                shares.append(statistics.median(mine))
            for key, out in (("compute", comp), ("communication", comm), ("exposed_communication", exp),
                             ("gpu_idle", idle)):
                if part is not None:              # None: marks that do not advance
                    out.append(part[key])
        s.ops = n_ops
        if flops:
            s.flops_per_iteration = sum(flops) / len(flops)
        if comp:
            s.compute_s = sum(comp) / len(comp)
            s.communication_s = sum(comm) / len(comm) if comm else None
            s.exposed_communication_s = sum(exp) / len(exp) if exp else None
            s.gpu_idle_s = sum(idle) / len(idle) if idle else None
        if shares:
            s.host_bound_share = max(shares)
