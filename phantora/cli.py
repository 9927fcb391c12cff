"""The `phantora` command line (click). Each sub-command lives in the module that does its work; this file wires
them together and turns PhantoraError into a one-line message and exit status 1 (bad options: 2, as click gives;
`replay` and `sweep`: 3 when the replayed run runs out of device memory)."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path

import click

from . import __version__
from .clitools import not_the_input, plot_target, user_errors
from .errors import PhantoraError
from .live.summary import host_bound_text
from .routing import describe as describe_routing, skewed


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, prog_name="phantora")
def main() -> None:
    """Phantora: run unmodified PyTorch training scripts on a simulated GPU cluster.

    \b
    Examples:
      phantora presets
      phantora net bench --cluster h100-hgx --nodes 2 --op all_reduce
      phantora replay trace.h5 --cluster a100-hgx --nodes 2
    """


# ------------------------------------------------------------------------------------------------------------ net
@main.group()
def net() -> None:
    """The network model on its own."""


@net.command("bench")
@click.option("--cluster", "cluster", default="h100-hgx", show_default=True, help="Cluster preset name or TOML file.")
@click.option("--nodes", type=int, default=None, help="Number of nodes (default: the preset's).")
@click.option("--gpus-per-node", type=int, default=None, help="GPUs per node (default: the preset's).")
@click.option("--op", "ops", multiple=True, default=["all_reduce"], show_default=True,
              type=click.Choice(["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all",
                                 "send_recv", "all"]), help="Collective(s) to time; repeatable; 'all' for every one.")
@click.option("--min-bytes", "-b", default="8", show_default=True, help="Smallest size (accepts K, M, G suffixes).")
@click.option("--max-bytes", "-e", default="8G", show_default=True, help="Largest size.")
@click.option("--step-factor", "-f", default=2, show_default=True,
              help="Multiply the size by this between rows (a whole number >= 2).")
@click.option("--algo", type=click.Choice(["ring", "tree"]), default=None, help="Force an algorithm (NCCL_ALGO).")
@click.option("--proto", type=click.Choice(["LL", "LL128", "Simple"]), default=None, help="Force a protocol.")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="Override a cluster field, e.g. net.inter_node_gbps=200.")
@click.option("--skew", type=int, default=None, metavar="H",
              help="all_to_all with uneven split sizes: every rank sends the first rank H units of its buffer and "
                   "every other rank one unit (a busy expert rank), run as NCCL runs it: a group of sends/receives.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of rows instead of the table.")
@user_errors
def net_bench(cluster, nodes, gpus_per_node, ops, min_bytes, max_bytes, step_factor, algo, proto, overrides, as_json,
              skew=None):
    """Print nccl-tests' table (size, count, type, time, algbw, busbw) for a cluster preset.

    \b
    Example:
      phantora net bench --cluster h100-hgx --nodes 2 --op all_reduce --op all_gather
    """
    from .cluster import load_cluster
    from .net.bench import OPS, RowProgress, bench, format_table, rows_as_dicts
    from .net.network import Network

    size_list = _bench_sizes(min_bytes, max_bytes, step_factor)
    spec = load_cluster(cluster, nodes=nodes, gpus_per_node=gpus_per_node, overrides=overrides)
    for option, value, enabled, key in (("--algo", algo, spec.nccl.algorithms, "nccl.algorithms"),
                                        ("--proto", proto, spec.nccl.protocols, "nccl.protocols")):
        if value and value not in enabled:      # as NCCL_ALGO naming an algorithm the build leaves out
            raise PhantoraError(f"{option} {value}: the cluster's {key} does not enable it ({', '.join(enabled)}); "
                                f"enable it with --set or drop {option}")
    if algo or proto:
        spec.nccl.algorithms = [algo] if algo else spec.nccl.algorithms
        spec.nccl.protocols = [proto] if proto else spec.nccl.protocols
    network = Network(spec)
    op_list = list(OPS) if "all" in ops else list(dict.fromkeys(ops))
    progress = RowProgress(len(size_list) * len(op_list), ranks=spec.world_size)   # stderr, for long work only
    out = []
    for op in op_list:
        try:
            rows = bench(spec, op, size_list, network=network, progress=lambda done, total, op=op: progress.row(op),
                         skew=skew)
        except ValueError as exc:
            if not (algo or proto):
                raise
            forced = " ".join(f"--{k} {v}" for k, v in (("algo", algo), ("proto", proto)) if v)
            why = (f"{forced}: NCCL has no such algorithm or protocol for {op} on this cluster (tree is "
                   f"all_reduce's alone; LL128 only where the hardware enables it)")
            if len(op_list) == 1:
                raise PhantoraError(f"{why}: {exc}") from None
            click.echo(f"note: {why}; {op} left out", err=True)     # the other collectives of `--op all` go on
            continue
        if as_json:
            out += rows_as_dicts(rows)
        else:
            label = f"{op} --skew {skew}" if skew is not None else op
            click.echo(format_table(spec, label, rows, 2 if op == "send_recv" else spec.world_size))
    progress.finish()
    if as_json:
        click.echo(json.dumps(out, indent=1))


def _bench_sizes(min_bytes: str, max_bytes: str, step_factor: int) -> list[int]:
    """The sizes of `net bench -b/-e/-f`, each option checked on its own and named in the error."""
    lo = _size_option(min_bytes, "'--min-bytes' / '-b'")
    hi = _size_option(max_bytes, "'--max-bytes' / '-e'")
    if step_factor < 2:
        raise click.BadParameter(f"must be a whole number >= 2 (the size is multiplied by it between rows), got "
                                 f"{step_factor}", param_hint="'--step-factor' / '-f'")
    if hi < lo:
        raise click.BadParameter(f"{max_bytes} ({hi} B) is below --min-bytes {min_bytes} ({lo} B): the table would "
                                 f"have no row", param_hint="'--max-bytes' / '-e'")
    from .net.bench import sizes
    return sizes(lo, hi, step_factor)


def _size_option(text: str, hint: str) -> int:
    try:
        value = parse_size(text)
    except PhantoraError as exc:
        raise click.BadParameter(str(exc), param_hint=hint) from None
    if value < 1:
        raise click.BadParameter(f"must be at least 1 byte, got {text}", param_hint=hint)
    return value


def parse_size(text: str) -> int:
    given = str(text).strip()
    text = given.upper().removesuffix("B")
    mult = 1
    for suffix, m in (("K", 2**10), ("M", 2**20), ("G", 2**30), ("T", 2**40)):
        if text.endswith(suffix):
            text, mult = text[:-1], m
            break
    try:
        return int(float(text) * mult)
    except (ValueError, OverflowError):       # OverflowError: inf
        raise PhantoraError(f"not a size: {given!r} (examples: 8, 64K, 1M, 8G)") from None


# -------------------------------------------------------------------------------------------------------- presets
@main.command("presets")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@user_errors
def presets_cmd(as_json):
    """List the GPU, cluster and model presets.

    \b
    Example:
      phantora presets
    """
    from .cluster import list_clusters, load_cluster
    from .frameworks import format_table, framework_table
    from .gpus import list_gpus, load_gpu

    gpus = [load_gpu(n) for n in list_gpus()]
    clusters = [load_cluster(n) for n in list_clusters()]
    try:
        from .models import list_models, load_model
        models = [load_model(n) for n in list_models()]
    except ImportError:
        models = []
    if as_json:
        click.echo(json.dumps({
            "gpus": [{"name": g.name, "display_name": g.display_name, "bf16_tflops": g.peak_tflops["bf16"],
                      "hbm_gbyte_per_s": g.hbm_bandwidth_gbyte_per_s, "memory_gib": g.memory_gib} for g in gpus],
            "clusters": [{"name": c.name, "gpu": c.gpu, "nodes": c.nodes, "gpus_per_node": c.gpus_per_node,
                          "intra": c.intra.kind, "nics_per_node": c.net.nics_per_node,
                          "inter_node_gbps": c.net.inter_node_gbps} for c in clusters],
            "models": [{"name": m.name, "params": m.num_params()} for m in models],
            "frameworks": [r.__dict__ for r in framework_table()],
        }, indent=1, default=str))
        return
    click.echo("GPUs")
    click.echo(f"  {'name':<18} {'device name':<28} {'bf16 TFLOP/s':>12} {'HBM GB/s':>9} {'memory GiB':>10}")
    for g in gpus:
        click.echo(f"  {g.name:<18} {g.display_name:<28} {g.peak_tflops['bf16']:>12.1f} "
                   f"{g.hbm_bandwidth_gbyte_per_s:>9.0f} {g.memory_gib:>10.1f}")
    click.echo("\nClusters")
    click.echo(f"  {'name':<18} {'gpu':<18} {'nodes x gpus':>12} {'intra':<12} {'network':<28}")
    for c in clusters:
        netdesc = f"{c.net.nics_per_node} x {c.net.inter_node_gbps:g} Gb/s {c.net.topology}" if c.net.nics_per_node \
            else "-"
        click.echo(f"  {c.name:<18} {c.gpu:<18} {f'{c.nodes} x {c.gpus_per_node}':>12} {c.intra.kind:<12} {netdesc:<28}")
    if models:
        click.echo("\nModels")
        for m in models:
            click.echo(f"  {m.name:<18} {m.num_params() / 1e9:>8.2f} B params")
    click.echo("\nFrameworks (model x framework)\n" + format_table(framework_table()))


# --------------------------------------------------------------------------------------------------------- replay
def _alloc_conf(ctx, param, value):
    """--alloc-conf checked as PyTorch checks PYTORCH_CUDA_ALLOC_CONF (an unknown key is refused), before any work."""
    if value is not None:
        from .engine.allocator import AllocatorConfig
        try:
            AllocatorConfig.parse(value)
        except PhantoraError as exc:
            raise click.BadParameter(str(exc), ctx=ctx, param=param) from None
    return value


def _replay_options(fn):
    opts = [
        click.option("--cluster", default=None, help="Cluster preset or TOML (default: the trace's own cluster)."),
        click.option("--nodes", type=click.IntRange(min=1), default=None, help="Number of nodes."),
        click.option("--gpus-per-node", type=click.IntRange(min=1), default=None, help="GPUs per node."),
        click.option("--gpu", default=None, help="GPU preset to re-cost kernels on (e.g. a100-sxm-80gb)."),
        click.option("--profile", default=None, type=click.Path(exists=True, dir_okay=False),
                     help="Measured profile database (HDF5) to cost kernels from."),
        click.option("--recost", is_flag=True,
                     help="Re-cost kernels from today's profiles even on the recorded GPU."),
        click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
                     help="Override any cluster field, e.g. net.inter_node_gbps=100."),
        click.option("--algo", type=click.Choice(["ring", "tree", "auto"]), default=None,
                     help="Force a collective algorithm (default: the one the recorded run forced, if any; auto: "
                          "NCCL's own choice)."),
        click.option("--proto", type=click.Choice(["LL", "LL128", "Simple", "auto"]), default=None,
                     help="Force a protocol (default: the one the recorded run forced, if any; auto: NCCL's own)."),
        click.option("--alloc-conf", default=None, metavar="CONF", callback=_alloc_conf,
                     help="Caching allocator settings to model, as PYTORCH_CUDA_ALLOC_CONF "
                          "(e.g. expandable_segments:True; default: the live run's)."),
        click.option("--allow-incomplete", is_flag=True,
                     help="Replay the trace of a run that failed or was killed (refused otherwise: it holds only "
                          "what the run did before it stopped)."),
    ]
    for o in reversed(opts):
        fn = o(fn)
    return fn


EXIT_OUT_OF_MEMORY = 3
"""Exit status of `phantora replay` / `phantora sweep` when a replayed run runs out of device memory."""


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def _oom_lines(r, indent: str = "  ") -> list[str]:
    """What the allocator model's OOMs of a replay say: one line per rank (its first failed allocation)."""
    if not r.ooms:
        return []
    first: dict[int, dict] = {}
    for o in r.ooms:
        first.setdefault(o["rank"], o)
    ranks = sorted(first)
    lines = [f"{indent}OUT OF MEMORY: the replayed run does not fit in device memory ({len(r.ooms)} failed "
             f"allocation(s) on rank(s) {', '.join(map(str, ranks[:16]))}{' ...' if len(ranks) > 16 else ''})"]
    for rank in ranks[:4]:
        o = first[rank]
        if "requested_bytes" in o and "capacity_bytes" in o:
            outside = (f", {_gib(o['outside_bytes'])} held outside PyTorch's allocator (CUDA context, libraries, "
                       f"NCCL)" if o.get("outside_bytes") else "")
            lines.append(f"{indent}  rank {rank} at op {o['op']}: asked for {_gib(o['requested_bytes'])} with "
                         f"{_gib(o['allocated_bytes'])} allocated and {_gib(o['reserved_bytes'])} reserved"
                         f"{outside}, of {_gib(o['capacity_bytes'])} device memory")
        else:
            lines.append(f"{indent}  rank {rank} at op {o['op']}: {o['message']}")
    return lines


def _fmt_result(r) -> str:
    lines = [f"replay on {r.cluster} ({r.world_size} x {r.gpu}): {r.n_ops} ops in {r.wall_s:.2f} s "
             f"({r.ops_per_s:,.0f} ops/s)"]
    if r.recorded_problem:
        lines.append(f"  replayed with --allow-incomplete: {r.recorded_problem}")
    lines += _oom_lines(r)
    if r.iterations_s:
        unreal = "; not reachable: the run stops at its first OOM" if r.ooms else ""
        lines.append(f"  iteration time (median of {len(r.iterations_s)}{unreal}): {r.iteration_s * 1e3:.3f} ms "
                     f"(recorded: {r.recorded_iteration_s * 1e3:.3f} ms)")
        lines.append("  per iteration (ms): " + ", ".join(f"{t * 1e3:.3f}" for t in r.iterations_s))
    else:
        lines.append("  no iteration marks in the trace")
    if r.tokens_per_s_per_gpu is not None:
        lines.append(f"  tokens/s/GPU: {r.tokens_per_s_per_gpu:,.0f}")
    if r.mfu is not None:
        lines.append(f"  MFU: {r.mfu * 100:.1f}% (of {r.peak_flops / 1e12:.0f} TFLOP/s bf16)")
    basis = r.summary.get("time_basis")
    per = {"per iteration": " per iteration", "whole trace": " over the whole trace (no iterations)"}.get(basis, "")
    for k, label in (("compute_s", "compute"), ("communication_s", "communication"),
                     ("exposed_communication_s", "exposed communication"), ("gpu_idle_s", "GPU idle")):
        if k in r.summary:
            lines.append(f"  {label}{per}: {r.summary[k] * 1e3:.3f} ms (mean of the simulated ranks)")
    note = host_bound_text(r.summary.get("host_bound_share"))
    if note:
        lines.append(f"  host-bound: {note}")
    if r.peak_reserved_bytes:
        gib = 2**30
        failed = " (failed allocations not counted)" if r.ooms else ""
        lines.append(f"  peak memory: {max(r.peak_reserved_bytes.values()) / gib:.2f} GiB reserved, "
                     f"{max(r.peak_allocated_bytes.values()) / gib:.2f} GiB allocated{failed} "
                     f"(allocator: {r.allocator or 'PyTorch defaults'})")
    if skewed(r.routing):
        lines.append(f"  expert routing assumed by the recorded run: {describe_routing(r.routing)}")
    if r.recorded_choice:
        lines.append(f"  collectives: {r.recorded_choice}, as the recorded run forced (--algo auto / --proto auto: "
                     f"NCCL's own choice)")
    if r.forced:
        lines.append(f"  collectives: {r.forced}")
    return "\n".join(lines)


@contextlib.contextmanager
def _read_errors(trace: str):
    """A context in which an unexpected read failure of `trace` (h5py's OSError) is a one-line error naming it."""
    try:
        yield
    except OSError as e:
        raise PhantoraError(f"{trace}: cannot read the trace: {e}") from None


def _drift_note(r, skip: str = "") -> None:
    """A replay that kept its trace's cluster: the model constants its preset has changed since, on stderr."""
    drift = [d for d in r.preset_drift if d.split(" ")[0] != skip]
    if drift:
        click.echo(f"note: replayed with the trace's cluster '{r.cluster}', whose model constants its preset has "
                   f"changed since: {'; '.join(drift)}; pass --cluster {r.cluster} for today's", err=True)


@main.command("replay")
@click.argument("trace", type=click.Path(dir_okay=False))
@_replay_options
@click.option("--out", default=None, type=click.Path(dir_okay=False), help="Write the replayed timeline as a new trace.")
@click.option("--overwrite", is_flag=True, help="Let --out replace an existing file (refused otherwise).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@user_errors
def replay_cmd(trace, cluster, nodes, gpus_per_node, gpu, profile, recost, overrides, algo, proto, alloc_conf,
               allow_incomplete, out, overwrite, as_json):
    """Re-simulate a trace under another cluster, GPU or collective algorithm.

    Exit status: 0 on success; 1 for an error (including the trace of a failed or killed run, unless
    --allow-incomplete); 3 when the replayed run runs out of device memory (the result is printed first).

    \b
    Examples:
      phantora replay run.h5
      phantora replay run.h5 --set net.inter_node_gbps=100
      phantora replay run.h5 --cluster a100-hgx --nodes 2 --gpu a100-sxm-80gb --out a100.h5
    """
    from .replay import live_only, replay

    if out is not None:
        not_the_input(out, trace, "'--out'")
    inert = live_only(overrides)
    if inert:
        click.echo(f"note: --set {', '.join(inert)}: only a live run applies {'these' if len(inert) > 1 else 'this'} "
                   f"(the ranks' software, host compute and conversion prices); the replay keeps what the trace "
                   f"recorded: run phantora run with it instead", err=True)
    with _read_errors(trace):
        r = replay(trace, cluster=cluster, nodes=nodes, gpus_per_node=gpus_per_node, gpu=gpu, profile=profile,
                   overrides=tuple(overrides), out=out, algo=algo, proto=proto, recost=recost, alloc_conf=alloc_conf,
                   allow_incomplete=allow_incomplete, overwrite=overwrite)
    if r.recorded_problem:
        click.echo(f"warning: {r.recorded_problem}", err=True)
    _drift_note(r)
    if as_json:
        click.echo(json.dumps(r.as_dict(), indent=1))
    else:
        click.echo(_fmt_result(r))
    if r.out_of_memory:
        ranks = sorted({o["rank"] for o in r.ooms})
        click.echo(f"Error: the replayed run is out of device memory on rank(s) {', '.join(map(str, ranks[:16]))} "
                   f"(exit status {EXIT_OUT_OF_MEMORY})", err=True)
        sys.exit(EXIT_OUT_OF_MEMORY)


@main.command("sweep")
@click.argument("trace", type=click.Path(dir_okay=False))
@click.option("--vary", "vary", required=True, multiple=True, metavar="KEY=V1,V2,...",
              help="Cluster field and the values to try (one field: give --vary once; --set fixes others).")
@_replay_options
@click.option("--plot", default=None, type=click.Path(dir_okay=False), help="Write a PNG plot of the results.")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@user_errors
def sweep_cmd(trace, vary, cluster, nodes, gpus_per_node, gpu, profile, recost, overrides, algo, proto, alloc_conf,
              allow_incomplete, plot, as_json):
    """Replay a trace once per value of one cluster field and compare iteration times.

    Exit status as for replay: 3 when the replayed run is out of device memory for some value (marked OOM).

    \b
    Example:
      phantora sweep run.h5 --vary net.inter_node_gbps=100,200,400,800 --plot sweep.png
    """
    from .replay import replay

    if len(vary) > 1:
        raise click.BadParameter(f"given {len(vary)} times ({', '.join(vary)}): a sweep varies one cluster field; "
                                 f"run one sweep per field, or fix the others with --set", param_hint="'--vary'")
    vary = vary[0]
    if "=" not in vary:
        raise PhantoraError(f"--vary wants KEY=V1,V2,... (got {vary!r})")
    key, _, values = vary.partition("=")
    vals = [v for v in values.split(",") if v]
    if not vals:
        raise PhantoraError(f"--vary {vary!r} gives no value: KEY=V1,V2,...")
    from .replay import live_only
    if live_only([key]):
        raise PhantoraError(f"--vary {key}: only a live run applies it (the ranks' software, host compute and "
                            f"conversion prices), so every replay would give the trace's own figures; run phantora "
                            f"run with --set {key}=... once per value instead")
    plot_target(plot)
    from .replay import matching_cluster
    from .trace.reader import TraceReader
    with _read_errors(trace):                        # every value is checked before the first replay
        with TraceReader(trace) as reader:
            meta = reader.meta
        for v in vals:
            try:
                matching_cluster(meta, cluster, nodes, gpus_per_node, gpu, tuple(overrides) + (f"{key}={v}",))
            except PhantoraError as e:
                raise PhantoraError(f"--vary {key}={v}: {e}") from None
    results = []
    for i, v in enumerate(vals):
        click.echo(f"[{i + 1}/{len(vals)}] {key}={v}", err=True)
        with _read_errors(trace):
            r = replay(trace, cluster=cluster, nodes=nodes, gpus_per_node=gpus_per_node, gpu=gpu, profile=profile,
                       overrides=tuple(overrides) + (f"{key}={v}",), algo=algo, proto=proto, recost=recost,
                       alloc_conf=alloc_conf, allow_incomplete=allow_incomplete)
        if i == 0 and r.recorded_problem:
            click.echo(f"warning: {r.recorded_problem}", err=True)
        if i == 0:
            _drift_note(r, skip=key)
        results.append((v, r))
    if as_json:
        click.echo(json.dumps([{"value": v, **r.as_dict()} for v, r in results], indent=1))
    else:
        click.echo(f"{key:>24} {'iteration (ms)':>15} {'tokens/s/GPU':>13}  memory")
        for v, r in results:
            tps = f"{r.tokens_per_s_per_gpu:,.0f}" if r.tokens_per_s_per_gpu else "-"
            mem = "fits"
            if r.out_of_memory:
                o = r.ooms[0]
                mem = (f"OUT OF MEMORY (rank {o['rank']}: asked {_gib(o['requested_bytes'])} of "
                       f"{_gib(o['capacity_bytes'])})" if "capacity_bytes" in o else f"OUT OF MEMORY (rank {o['rank']})")
            click.echo(f"{v:>24} {r.iteration_s * 1e3:>15.3f} {tps:>13}  {mem}")
    oom_values = [v for v, r in results if r.out_of_memory]
    if plot:
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            raise PhantoraError("--plot needs matplotlib (pip install 'phantora[plot]')") from None
        fig, ax = plt.subplots(figsize=(6, 4))
        xs = list(range(len(results)))
        ax.plot(xs, [r.iteration_s * 1e3 for _, r in results], marker="o")
        ax.set_xticks(xs, [v for v, _ in results])
        ax.set_xlabel(key)
        ax.set_ylabel("simulated iteration time (ms)")
        ax.set_title(f"{Path(trace).name}: {key}")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        target = Path(plot)
        tmp = target.with_name(f".{target.name}.partial{target.suffix}")
        try:
            fig.savefig(tmp, dpi=120)                  # whole or not at all: renamed into place once written
            os.replace(tmp, target)
        except OSError as exc:
            raise PhantoraError(f"--plot {plot}: could not write it ({exc.strerror or exc}); the results are "
                                f"printed above") from None
        finally:
            tmp.unlink(missing_ok=True)
        click.echo(f"plot written to {plot}", err=True)
    if oom_values:
        click.echo(f"Error: the replayed run is out of device memory with {key} = {', '.join(oom_values)} "
                   f"(exit status {EXIT_OUT_OF_MEMORY})", err=True)
        sys.exit(EXIT_OUT_OF_MEMORY)


@main.command("inspect")
@click.argument("trace", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@user_errors
def inspect_cmd(trace, as_json):
    """Summarize a trace: ops, stream busy time, compute vs communication, iterations, memory.

    \b
    Example:
      phantora inspect run.h5
    """
    from .trace.reader import TraceReader
    from .trace.summary import format_summary, summarize

    with _read_errors(trace), TraceReader(trace) as rd:
        s = summarize(rd)
        if rd.warning:
            click.echo(f"warning: {rd.warning}", err=True)
    click.echo(json.dumps(s, indent=1, default=str) if as_json else format_summary(s))


@main.command("export")
@click.argument("trace", type=click.Path(dir_okay=False))
@click.option("--perfetto", "out", required=True, type=click.Path(dir_okay=False),
              help="Chrome/Perfetto trace-event JSON to write (open it in ui.perfetto.dev or chrome://tracing).")
@click.option("--overwrite", is_flag=True, help="Replace the --perfetto file if it exists (refused otherwise).")
@user_errors
def export_cmd(trace, out, overwrite):
    """Export a trace as a Perfetto / Chrome timeline (one process per rank, one track per stream).

    The JSON is written under a temporary name and renamed to its own only when complete: a failed export leaves
    no file and an existing one as it was.

    \b
    Example:
      phantora export run.h5 --perfetto run.json
    """
    from .trace.perfetto import export_perfetto
    from .trace.reader import TraceReader
    from .trace.writer import refuse_existing

    not_the_input(out, trace, "'--perfetto'")
    refuse_existing(out, overwrite, "Perfetto JSON file")     # before reading a large trace
    with _read_errors(trace), TraceReader(trace) as rd:
        if rd.warning:
            click.echo(f"warning: {rd.warning}", err=True)
        export_perfetto(rd, out, overwrite=overwrite)
    click.echo(f"wrote {out}")


# ------------------------------------------------------------------------------------------------------- run, groundtruth
def _register() -> None:
    from .frameworks.commands import assets_cmd
    from .groundtruth.commands import groundtruth as groundtruth_group
    from .live.command import run_cmd
    main.add_command(run_cmd)
    main.add_command(groundtruth_group)
    main.add_command(assets_cmd)
    main.add_command(_LazyCommand("profile", "phantora.probes.profile_cmd", "profile_command",
                                  "Measure every kernel signature of traces on the local CUDA GPU into a profile DB."))


class _LazyCommand(click.Command):
    """A sub-command whose module is imported only when it runs (or shows its help)."""

    def __init__(self, name: str, module: str, attr: str, short_help: str):
        super().__init__(name, short_help=short_help, context_settings={"ignore_unknown_options": True,
                                                                        "allow_extra_args": True,
                                                                        "help_option_names": []})
        self._target = (module, attr)

    def _load(self) -> click.Command:
        import importlib
        return getattr(importlib.import_module(self._target[0]), self._target[1])

    def invoke(self, ctx):
        cmd = self._load()
        return cmd.main(args=ctx.args, prog_name=ctx.command_path, standalone_mode=False)

    def get_help(self, ctx):
        return self._load().get_help(ctx)


_register()


def run_main() -> None:  # pragma: no cover
    main(prog_name="phantora")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
