"""The `phantora run` command (registered by phantora/cli.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from ..cluster import load_cluster, software_overrides
from ..errors import PhantoraError
from .launcher import RunFailed, RunOptions, default_trace_name, run_live
from .ranks import plan_ranks


def _write_json(path: str, data: dict) -> None:
    Path(path).write_text(json.dumps(data, indent=2, default=str) + "\n")


@click.command("run", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--cluster", default="h100-hgx", show_default=True, help="Cluster preset name or TOML file.")
@click.option("--nodes", type=int, default=None, help="Number of nodes (default: the preset's).")
@click.option("--gpus-per-node", type=int, default=None, help="GPUs per node (default: the preset's).")
@click.option("--gpu", default=None, help="GPU preset replacing the cluster's.")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override a cluster field, e.g. net.inter_node_gbps=100 (repeatable).")
@click.option("--ranks", "ranks", default="all", show_default=True, metavar="all|auto|LIST",
              help="Ranks that get a process: all; auto (one per pipeline stage, the rest mirrored); or a list "
                   "like 0,8 / 0-3 (other ranks mirror the nearest listed rank below them).")
@click.option("--pp-degree", type=int, default=None,
              help="Pipeline stages for --ranks auto (default: read from the program's --pp / "
                   "--parallelism.pipeline_parallel_degree, else 1).")
@click.option("--trace", default=None, type=click.Path(dir_okay=False),
              help="HDF5 trace to write (default: phantora-<script>.h5 in the current directory).")
@click.option("--no-trace", is_flag=True, help="Do not keep a trace.")
@click.option("--summary-json", default=None, type=click.Path(dir_okay=False),
              help="Also write the summary as JSON (written on failure too, with the error).")
@click.option("--tokens-per-iteration", type=float, default=None,
              help="Global tokens per iteration (global batch x sequence), for tokens/s/GPU and MFU.")
@click.option("--model", default=None, help="Model preset, for MFU (TorchTitan's FLOPs per token).")
@click.option("--seq", type=int, default=None, help="Sequence length, with --model, for the attention FLOPs.")
@click.option("--hang-timeout", type=float, default=300.0, show_default=True,
              help="Seconds a rank may stay silent while others wait on it before the run is stopped.")
@click.option("--algo", type=click.Choice(["ring", "tree"]), default=None, help="Force a collective algorithm.")
@click.option("--proto", type=click.Choice(["LL", "LL128", "Simple"]), default=None, help="Force an NCCL protocol.")
@click.option("--torch-cuda", default=None, metavar="VERSION",
              help="Emulate the CUDA kernel choices of this torch release (fused RMSNorm, SDPA order); "
                   "default: the ranks' own torch.")
@click.option("--sdpa", default=None, metavar="LIST",
              help="SDPA backends in priority order, e.g. flash,efficient,math (overrides torch's and the "
                   "script's choice).")
@click.option("--profile", default=None, type=click.Path(exists=True, dir_okay=False),
              help="Measured profile database (HDF5) to cost kernels from (default: the GPU's own, else a "
                   "same-architecture GPU's across).")
@click.option("--quiet", is_flag=True, help="Do not relay the ranks' output.")
@click.argument("program", nargs=-1, type=click.UNPROCESSED, required=True)
def run_cmd(cluster, nodes, gpus_per_node, gpu, overrides, ranks, pp_degree, trace, no_trace, summary_json,
            tokens_per_iteration, model, seq, hang_timeout, algo, proto, torch_cuda, sdpa, profile, quiet,
            program):
    """Run an unmodified PyTorch program on a virtual cluster (a drop-in for torchrun).

    Every rank gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT as torchrun sets
    them; its output is prefixed with [rankN]. The run ends with a summary and an HDF5 trace for replay.

    \b
    Examples:
      phantora run -- python presets/workloads/llama.py --model llama-tiny --dp-mode fsdp --steps 3
      phantora run --cluster h100-hgx --nodes 16 --ranks auto -- python train.py --pp 4
      phantora run --nodes 1 --gpus-per-node 4 --summary-json s.json -m mypackage.train
    """
    try:
        overrides = list(overrides) + software_overrides(torch_cuda, sdpa)
        spec = load_cluster(cluster, nodes=nodes, gpus_per_node=gpus_per_node, gpu=gpu, overrides=overrides)
        plan = plan_ranks(ranks, spec.world_size, list(program), pp_degree)
        if profile:
            from ..costmodel.profiledb import ProfileDB
            measured_on = ProfileDB.open(profile).gpu
            if measured_on != spec.gpu:
                raise PhantoraError(f"--profile {profile} was measured on {measured_on}, but the cluster's GPU is "
                                    f"{spec.gpu}; pass --gpu {measured_on} or a profile of {spec.gpu}")
        flops_per_token = None
        if model:
            from ..models import load_model
            if not seq:
                raise PhantoraError("--model needs --seq (the sequence length) for the attention FLOPs")
            flops_per_token = float(load_model(model).flops_per_token(seq))
        trace_path = None if no_trace else (trace or str(default_trace_name(list(program))))
        opts = RunOptions(program=list(program), spec=spec, plan=plan, trace=trace_path,
                          tokens_per_iteration=tokens_per_iteration, flops_per_token=flops_per_token,
                          hang_timeout_s=hang_timeout, algo=algo, proto=proto, quiet_ranks=quiet,
                          env={"PHANTORA_PROFILE": str(Path(profile).resolve())} if profile else {})
    except PhantoraError as exc:
        raise click.ClickException(str(exc)) from None
    note = f" ({plan.mirrored} mirrored)" if plan.mirrored else ""
    click.echo(f"phantora: {spec.world_size} x {spec.gpu} ({spec.name}, {spec.nodes} node(s) x {spec.gpus_per_node}); "
               f"{len(plan.simulated)} rank process(es){note}", err=True)
    try:
        summary = run_live(opts, progress=lambda m: click.echo(f"phantora: {m}", err=True))
    except RunFailed as exc:
        click.echo(f"phantora: the run failed: {exc}", err=True)
        if exc.summary is not None:
            click.echo(exc.summary.format(), err=True)
            if summary_json:
                _write_json(summary_json, {**exc.summary.as_dict(), "error": str(exc), "oom": exc.summary.oom})
        sys.exit(1)
    except PhantoraError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(summary.format())
    if summary_json:
        _write_json(summary_json, {**summary.as_dict(), "error": None})
