"""The `phantora run` command (registered by phantora/cli.py)."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import click

from ..cluster import load_cluster, software_overrides
from ..engine.allocator import AllocatorConfig
from ..errors import PhantoraError
from ..routing import parse as parse_routing
from ..software import SDPA_BACKENDS, parse_release, te_release_problem
from .launcher import (RunFailed, RunOptions, check_program, default_trace_name, program_argv, run_live,
                       signal_text)
from .ranks import check_process_count, plan_ranks


def _write_json(path: str, data: dict) -> bool:
    """Write the summary JSON whole or not at all: a temporary file beside it, renamed into place."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
        os.replace(tmp, target)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        click.echo(f"phantora: could not write --summary-json {path}: {exc.strerror or exc}", err=True)
        return False
    return True


VALUES_NOTE = ("tensors hold no data: reading a value (.item(), .tolist(), printing a tensor) gives a placeholder "
               "(0, 0.0, False), so losses and gradient norms print 0.0; only small tensors (up to 64 elements; 4096 for integer tensors, "
               "2^24 on the host: a sampler's permutation) made from host data (torch.tensor, full, arange, small random draws) and what is computed from them "
               "alone read their real values, also through all_reduce, broadcast and all_gather, as do tensors of any size filled with one value "
               "(ones, zeros, full, fill_) and their sums; an fp16 loss scaler never sees an overflow, so it never skips a step or lowers its scale (docs/stubs.md)")


def _positive_seconds(ctx, param, value):
    if value is not None and not (math.isfinite(value) and value > 0):
        raise click.BadParameter(f"{value} is not a positive number of seconds", ctx=ctx, param=param)
    return value


def _torch_release(ctx, param, value):
    if value is not None and parse_release(value) is None:
        raise click.BadParameter(f"'{value}' is not a torch release like 2.6 or 2.11.0", ctx=ctx, param=param)
    return value


def _sdpa_order(ctx, param, value):
    if value is None:
        return value
    names = [n.strip() for n in value.split(",") if n.strip()]
    if not names:
        raise click.BadParameter(f"{value!r} names no SDPA backend ({', '.join(SDPA_BACKENDS)})", ctx=ctx,
                                 param=param)
    for name in names:
        if name not in SDPA_BACKENDS:
            raise click.BadParameter(f"unknown SDPA backend '{name}' ({', '.join(SDPA_BACKENDS)})", ctx=ctx,
                                     param=param)
    return value


def _te_release(ctx, param, value):
    problem = te_release_problem(value) if value is not None else None
    if problem:
        raise click.BadParameter(problem, ctx=ctx, param=param)
    return value


# torchrun's options with no counterpart here, and what to use instead
_TORCHRUN_ELSE = {
    "--max-restarts": "phantora runs each rank once and stops the run at the first failure",
    "--monitor-interval": "--hang-timeout S says how long a silent rank may hold the others up",
    "--start-method": "every rank is a new process",
    "--role": "ROLE_NAME is 'default'",
    "--log-dir": "each rank's output is relayed, prefixed with [rankN]; --quiet hides it",
    "--redirects": "each rank's output is relayed, prefixed with [rankN]; --quiet hides it",
    "-r": "each rank's output is relayed, prefixed with [rankN]; --quiet hides it",
    "--tee": "each rank's output is relayed, prefixed with [rankN]; --quiet hides it",
    "-t": "each rank's output is relayed, prefixed with [rankN]; --quiet hides it",
    "--local-ranks-filter": "--quiet hides every rank's output; --ranks LIST runs only some ranks (the others "
                            "mirrored)",
    "--no-python": "a program that is neither python nor a .py script runs as given",
    "--run-path": "give the script after --, e.g. -- python train.py",
    "--module": "give -m package.module after --",
    "--local-addr": "the ranks' rendezvous is simulated",
    "--max-nodes": "--nodes N",
    "--nproc": "--gpus-per-node G",
}


def torchrun_options(nodes, gpus_per_node, opts: dict) -> tuple[int | None, int | None, list[str]]:
    """torchrun's --nproc-per-node / --nnodes as --gpus-per-node / --nodes; the options that one launcher simulating
    every node does not need are ignored with a note."""
    notes = []
    nproc, nnodes = opts.get("nproc_per_node"), opts.get("nnodes")
    if nproc is not None:
        try:
            g = int(nproc)
        except ValueError:
            raise PhantoraError(f"--nproc-per-node {nproc!r}: give the number of GPUs per node of the simulated "
                                f"cluster (torchrun's gpu/cpu/auto count this machine's devices); phantora's "
                                f"name for it is --gpus-per-node") from None
        if g < 1:
            raise PhantoraError(f"--nproc-per-node {nproc}: must be at least 1")
        if gpus_per_node is not None and gpus_per_node != g:
            raise PhantoraError(f"--nproc-per-node {g} and --gpus-per-node {gpus_per_node} disagree (they are the "
                                f"same option)")
        gpus_per_node = g
    if nnodes is not None:
        lo, _, hi = str(nnodes).partition(":")
        try:
            n, top = int(lo), int(hi or lo)
        except ValueError:
            raise PhantoraError(f"--nnodes {nnodes!r}: give the number of nodes (phantora's name: --nodes)") from None
        if n != top:
            raise PhantoraError(f"--nnodes {nnodes}: elastic node ranges are not simulated; give one number, "
                                f"e.g. --nnodes {top} (phantora's name: --nodes)")
        if n < 1:
            raise PhantoraError(f"--nnodes {nnodes}: must be at least 1")
        if nodes is not None and nodes != n:
            raise PhantoraError(f"--nnodes {n} and --nodes {nodes} disagree (they are the same option)")
        nodes = n
    node_rank = opts.get("node_rank")
    if node_rank not in (None, 0):
        raise PhantoraError(f"--node-rank {node_rank}: phantora simulates every node from one launcher; run it "
                            f"once, without --node-rank, with --nnodes (or --nodes) giving the node count")
    ignored = [flag for key, flag in (("standalone", "--standalone"), ("node_rank", "--node-rank"),
                                      ("master_addr", "--master-addr"), ("master_port", "--master-port"),
                                      ("rdzv_backend", "--rdzv-backend"), ("rdzv_endpoint", "--rdzv-endpoint"),
                                      ("rdzv_id", "--rdzv-id"), ("rdzv_conf", "--rdzv-conf"))
               if opts.get(key) not in (None, False)]
    if ignored:
        notes.append(f"ignoring torchrun's {', '.join(ignored)}: one launcher simulates every node, and the ranks "
                     f"get MASTER_ADDR 127.0.0.1 and a free MASTER_PORT")
    return nodes, gpus_per_node, notes


# launchers a user may put after `--` out of habit, and the command that does what they meant
_LAUNCHERS = {
    "torchrun": "phantora run --gpus-per-node N [--nodes M] -- python train.py ARGS (torchrun's --nproc-per-node and "
                "--nnodes are taken before `--`)",
    "deepspeed": "phantora run --gpus-per-node N --local-rank-arg -- python train.py ARGS (the deepspeed launcher's "
                 "variables are set; --local-rank-arg passes --local_rank=N)",
}


def _check_program_start(program: list[str]) -> None:
    """An option before the program that is not phantora run's: name its equivalent."""
    if not program:
        raise PhantoraError("no program to run: give it after `--`, e.g. phantora run -- python train.py")
    first = program[0]
    launcher = os.path.basename(first)
    if os.path.basename(first).startswith("python") and program[1:3] in (["-m", "torch.distributed.run"],
                                                                         ["-m", "torch.distributed.launch"]):
        launcher = "torchrun"
    if launcher in _LAUNCHERS:
        raise PhantoraError(f"{' '.join(program[:3])} ...: phantora run is itself the launcher (each rank "
                            f"would start {launcher}'s own processes on this machine); run the script directly: "
                            f"{_LAUNCHERS[launcher]}")
    if not first.startswith("-") or first == "-m":
        return
    name = first.split("=", 1)[0]
    key = name.replace("_", "-") if name.startswith("--") else name
    if key in _TORCHRUN_ELSE:
        raise PhantoraError(f"torchrun's option {name} has no equivalent in phantora run: {_TORCHRUN_ELSE[key]}")
    raise PhantoraError(f"unknown option {name} before the program (phantora run --help lists the options; the "
                        f"program follows `--`, e.g. phantora run --nodes 2 -- python train.py)")


@click.command("run", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--cluster", default="h100-hgx", show_default=True, help="Cluster preset name or TOML file.")
@click.option("--nodes", type=click.IntRange(min=1), default=None, help="Number of nodes (default: the preset's).")
@click.option("--gpus-per-node", type=click.IntRange(min=1), default=None, help="GPUs per node (default: the preset's).")
@click.option("--gpu", default=None, help="GPU preset replacing the cluster's.")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override a cluster field, e.g. net.inter_node_gbps=100 (repeatable).")
@click.option("--ranks", "ranks", default="all", show_default=True, metavar="all|auto|LIST",
              help="Ranks that get a process: all; auto (one per pipeline stage, the rest mirrored); or a list "
                   "like 0,8 / 0-3 (other ranks mirror the nearest listed rank below them).")
@click.option("--pp-degree", type=click.IntRange(min=1), default=None,
              help="Pipeline stages for --ranks auto (default: read from the program's --pp / "
                   "--parallelism.pipeline_parallel_degree, else 1).")
@click.option("--trace", default=None, type=click.Path(dir_okay=False),
              help="HDF5 trace to write (default: phantora-<script>.h5 in the current directory).")
@click.option("--no-trace", is_flag=True, help="Do not keep a trace.")
@click.option("--overwrite", is_flag=True,
              help="Let the trace replace an existing file (refused otherwise, before the run starts).")
@click.option("--summary-json", default=None, type=click.Path(dir_okay=False),
              help="Also write the summary as JSON (written on failure too, with the error).")
@click.option("--tokens-per-iteration", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Global tokens per iteration (global batch x sequence), for tokens/s/GPU and MFU.")
@click.option("--model", default=None, help="Model preset, for MFU (TorchTitan's FLOPs per token).")
@click.option("--seq", type=click.IntRange(min=1), default=None, help="Sequence length, with --model, for the attention FLOPs.")
@click.option("--hang-timeout", type=float, default=300.0, show_default=True, callback=_positive_seconds,
              help="Seconds a rank may stay silent while others wait on it before the run is stopped (> 0).")
@click.option("--algo", type=click.Choice(["ring", "tree"]), default=None, help="Force a collective algorithm.")
@click.option("--proto", type=click.Choice(["LL", "LL128", "Simple"]), default=None, help="Force an NCCL protocol.")
@click.option("--torch-cuda", default=None, metavar="VERSION", callback=_torch_release,
              help="Emulate the CUDA kernel choices of this torch release (fused RMSNorm, SDPA order); "
                   "default: the ranks' own torch.")
@click.option("--sdpa", default=None, metavar="LIST", callback=_sdpa_order,
              help="SDPA backends in priority order, e.g. flash,efficient,math (overrides torch's and the "
                   "script's choice).")
@click.option("--transformer-engine", "transformer_engine", default=None, metavar="VERSION", callback=_te_release,
              help="The ranks import Transformer Engine VERSION (2.x): a stand-in whose layers issue the GEMMs, "
                   "norms, fused attention and tensor-parallel collectives TE launches (docs/megatron.md).")
@click.option("--routing", "routing_text", default="balanced", show_default=True,
              metavar="balanced|zipf:S|file:PATH|loads:L0,L1,...",
              help="Expert routing a mixture-of-experts step assumes (routers read data a simulation does not "
                   "have): every expert the same share, a Zipf skew of exponent S over the expert index, or one "
                   "load per expert from a file or the list; recorded in the trace (docs/stubs.md).")
@click.option("--profile", default=None, type=click.Path(exists=True, dir_okay=False),
              help="Measured profile database (HDF5) to cost kernels from (default: the GPU's own, else a "
                   "same-architecture GPU's across).")
@click.option("--host-cpu", "host_cpu", type=click.Choice(["model", "measured"]), default="model", show_default=True,
              help="How the framework's own host CPU time is found: 'model' counts its work (Python calls, built-in "
                   "calls, aten dispatches) and prices it with the cluster's [host] preset, the same on any machine; "
                   "'measured' takes this machine's thread CPU time (for simulating on a real training host; "
                   "docs/host-cpu.md).")
@click.option("--quiet", is_flag=True, help="Do not relay the ranks' output.")
@click.option("--local-rank-arg", is_flag=True,
              help="Pass --local_rank=N to each rank after its script, as the deepspeed launcher and "
                   "torch.distributed.launch do (for scripts that require the argument).")
@click.option("--force-ranks", is_flag=True,
              help="Start the rank processes even when they are far more than this machine holds.")
@click.option("--nproc-per-node", "--nproc_per_node", "nproc_per_node", default=None, metavar="G",
              help="torchrun's name for --gpus-per-node.")
@click.option("--nnodes", default=None, metavar="N", help="torchrun's name for --nodes.")
@click.option("--standalone", is_flag=True, hidden=True)
@click.option("--node-rank", "--node_rank", "node_rank", type=int, default=None, hidden=True)
@click.option("--master-addr", "--master_addr", "master_addr", default=None, hidden=True)
@click.option("--master-port", "--master_port", "master_port", default=None, hidden=True)
@click.option("--rdzv-backend", "--rdzv_backend", "rdzv_backend", default=None, hidden=True)
@click.option("--rdzv-endpoint", "--rdzv_endpoint", "rdzv_endpoint", default=None, hidden=True)
@click.option("--rdzv-id", "--rdzv_id", "rdzv_id", default=None, hidden=True)
@click.option("--rdzv-conf", "--rdzv_conf", "rdzv_conf", default=None, hidden=True)
@click.argument("program", nargs=-1, type=click.UNPROCESSED, required=True)
def run_cmd(cluster, nodes, gpus_per_node, gpu, overrides, ranks, pp_degree, trace, no_trace, summary_json,
            tokens_per_iteration, model, seq, hang_timeout, algo, proto, torch_cuda, sdpa, profile, quiet,
            program, force_ranks=False, host_cpu="model", overwrite=False, local_rank_arg=False,
            transformer_engine=None, routing_text="balanced", **torchrun):
    """Run an unmodified PyTorch program on a virtual cluster (a drop-in for torchrun).

    Every rank gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT as torchrun sets
    them (and LOCAL_SIZE, CROSS_RANK, CROSS_SIZE as the deepspeed launcher does; --local-rank-arg passes
    --local_rank=N too); its output is prefixed with [rankN]. The run ends with a summary and an HDF5 trace for replay.
    torchrun's --nproc-per-node and --nnodes are taken as --gpus-per-node and --nodes; --standalone,
    --node-rank 0, --master-addr/--master-port and --rdzv-* are accepted and ignored (one launcher simulates
    every node). SIGINT, SIGTERM and SIGHUP stop the ranks, close the trace and exit with 128 + the signal.

    \b
    Examples:
      phantora run -- python presets/workloads/llama.py --model llama-tiny --dp-mode fsdp --steps 3
      phantora run --cluster h100-hgx --nodes 16 --ranks auto -- python train.py --pp 4
      phantora run --nodes 1 --gpus-per-node 4 --summary-json s.json -m mypackage.train
    """
    try:
        nodes, gpus_per_node, notes = torchrun_options(nodes, gpus_per_node, torchrun)
        _check_program_start(list(program))
        check_program(program_argv(list(program)))    # a missing script or command: before anything starts
        AllocatorConfig.from_env(os.environ)           # an allocator setting PyTorch would refuse, likewise
        for note in notes:
            click.echo(f"phantora: {note}", err=True)
        overrides = list(overrides) + software_overrides(torch_cuda, sdpa, transformer_engine)
        spec = load_cluster(cluster, nodes=nodes, gpus_per_node=gpus_per_node, gpu=gpu, overrides=overrides)
        plan = plan_ranks(ranks, spec.world_size, list(program), pp_degree)
        routing = parse_routing(routing_text, base=Path.cwd())
        crowded = check_process_count(plan, force=force_ranks)
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
        if summary_json and not Path(summary_json).resolve().parent.is_dir():
            raise PhantoraError(f"--summary-json {summary_json}: folder {Path(summary_json).parent} does not exist")
        if summary_json:
            from ..clitools import writable_folder
            writable_folder(Path(summary_json).resolve().parent, f"--summary-json {summary_json}")
        if trace and no_trace:
            raise PhantoraError("--trace and --no-trace contradict each other: give one")
        trace_path = None if no_trace else (trace or str(default_trace_name(list(program))))
        if trace_path is not None:
            from ..trace.writer import refuse_existing
            refuse_existing(trace_path, overwrite, "trace file")      # an earlier trace is never replaced unasked
        opts = RunOptions(program=list(program), spec=spec, plan=plan, trace=trace_path, overwrite=overwrite,
                          tokens_per_iteration=tokens_per_iteration, flops_per_token=flops_per_token,
                          hang_timeout_s=hang_timeout, algo=algo, proto=proto, quiet_ranks=quiet, host_cpu=host_cpu,
                          local_rank_arg=local_rank_arg, routing=routing, overrides=tuple(overrides),
                          env={"PHANTORA_PROFILE": str(Path(profile).resolve())} if profile else {})
    except PhantoraError as exc:
        raise click.ClickException(str(exc)) from None
    note = f" ({plan.mirrored} mirrored)" if plan.mirrored else ""
    click.echo(f"phantora: {spec.world_size} x {spec.gpu} ({spec.name}, {spec.nodes} node(s) x {spec.gpus_per_node}); "
               f"{len(plan.simulated)} rank process(es){note}", err=True)
    click.echo(f"phantora: {VALUES_NOTE}", err=True)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        click.echo(f"phantora: CUDA_VISIBLE_DEVICES={visible!r} names this machine's GPUs, not the simulated "
                   f"host's: the ranks run without it (a script that sets it itself is shown the GPUs it names; "
                   f"docs/stubs.md)", err=True)
    if crowded:
        click.echo(f"phantora: warning: {crowded}", err=True)
    try:
        summary = run_live(opts, progress=lambda m: click.echo(f"phantora: {m}", err=True))
    except RunFailed as exc:
        if exc.signum is not None:
            kept = f"the trace {trace_path} was closed with the reason" if trace_path else "no trace kept"
            click.echo(f"phantora: stopped by {signal_text(exc.signum)}: the ranks were stopped, {kept}"
                       + (f", the summary written to {summary_json}" if summary_json else ""), err=True)
        else:
            click.echo(f"phantora: the run failed: {exc}", err=True)
        if exc.summary is not None:
            click.echo(exc.summary.format(), err=True)
            if summary_json:
                _write_json(summary_json, {**exc.summary.as_dict(), "error": str(exc), "oom": exc.summary.oom})
        elif summary_json:
            _write_json(summary_json, {"error": str(exc), "oom": exc.oom})
        sys.exit(128 + exc.signum if exc.signum is not None else 1)
    except PhantoraError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(summary.format())
    if summary_json and not _write_json(summary_json, {**summary.as_dict(), "error": None}):
        sys.exit(1)
