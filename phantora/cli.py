"""The `phantora` command line (click). Each sub-command lives in the module that does its work; this file wires
them together and turns PhantoraError into a one-line message and exit status 2."""

from __future__ import annotations

import functools
import json
import sys

import click

from . import __version__
from .errors import PhantoraError


def user_errors(fn):
    """Report PhantoraError as `Error: ...` without a traceback."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except PhantoraError as exc:
            raise click.ClickException(str(exc)) from None
    return wrapper


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, prog_name="phantora")
def main() -> None:
    """Phantora: run unmodified PyTorch training scripts on a simulated GPU cluster.

    \b
    Examples:
      phantora presets
      phantora net bench --cluster h100-hgx --nodes 2 --op all_reduce
      phantora run --cluster h100-hgx -- python train.py
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
@click.option("--step-factor", "-f", default=2, show_default=True, help="Multiply the size by this between rows.")
@click.option("--algo", type=click.Choice(["ring", "tree"]), default=None, help="Force an algorithm (NCCL_ALGO).")
@click.option("--proto", type=click.Choice(["LL", "LL128", "Simple"]), default=None, help="Force a protocol.")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="Override a cluster field, e.g. net.inter_node_gbps=200.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of rows instead of the table.")
@user_errors
def net_bench(cluster, nodes, gpus_per_node, ops, min_bytes, max_bytes, step_factor, algo, proto, overrides, as_json):
    """Print nccl-tests' table (size, count, type, time, algbw, busbw) for a cluster preset.

    \b
    Example:
      phantora net bench --cluster h100-hgx --nodes 2 --op all_reduce --op all_gather
    """
    from .cluster import load_cluster
    from .net.bench import OPS, bench, format_table, rows_as_dicts, sizes
    from .net.network import Network

    spec = load_cluster(cluster, nodes=nodes, gpus_per_node=gpus_per_node, overrides=overrides)
    if algo or proto:
        spec.nccl.algorithms = [algo] if algo else spec.nccl.algorithms
        spec.nccl.protocols = [proto] if proto else spec.nccl.protocols
    network = Network(spec)
    size_list = sizes(parse_size(min_bytes), parse_size(max_bytes), step_factor)
    op_list = list(OPS) if "all" in ops else list(dict.fromkeys(ops))
    out = []
    for op in op_list:
        rows = bench(spec, op, size_list, network=network)
        if as_json:
            out += rows_as_dicts(rows)
        else:
            click.echo(format_table(spec, op, rows, 2 if op == "send_recv" else spec.world_size))
    if as_json:
        click.echo(json.dumps(out, indent=1))


def parse_size(text: str) -> int:
    text = str(text).strip().upper().removesuffix("B")
    mult = 1
    for suffix, m in (("K", 2**10), ("M", 2**20), ("G", 2**30), ("T", 2**40)):
        if text.endswith(suffix):
            text, mult = text[:-1], m
            break
    try:
        return int(float(text) * mult)
    except ValueError:
        raise PhantoraError(f"not a size: {text!r} (examples: 8, 64K, 1M, 8G)") from None


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
        }, indent=1))
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


def run_main() -> None:  # pragma: no cover
    main(prog_name="phantora")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
