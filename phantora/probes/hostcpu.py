"""Calibrates the host-CPU model (phantora/hostcpu.py) against host-bound steps measured on a real GPU host.

    python -m phantora.probes.hostcpu groundtruth/hostcpu/h200x2 [--cluster h200-2gpu-nvlink] [--out fit.json]

The folder holds what groundtruth/hostcpu/measure.sh wrote on the GPU host: for each configuration NAME, NAME.json,
the reference workload's SUMMARY, whose steps are host-bound (a model so small that every kernel finishes before
the host has issued the next), so that a step's time is the host's time to issue it. measure.sh is also read for
each configuration's GPU count and arguments.

For each configuration the same command runs under `phantora run` (modelled host CPU) and the work counted per
steady-state step is read from its trace on rank 0: Python calls, built-in calls, aten dispatches, Python lines and
launches (kernels, copies, collectives, point-to-point ops). Launches are priced at the cluster's `launch_overhead_us`
(the engine adds it to every launch in either host-CPU mode); a non-negative least-squares fit of the rest of the
measured step times, weighted for relative error, on the counts named by --features gives their `[host]` prices
(py_call_ns, c_call_ns, dispatch_us, py_line_ns; a count left out is priced 0). The table printed holds each
configuration's measured and modelled host time per step and the error, with the leave-one-out error of the fit; then
each configuration's trace is replayed with the fitted prices (`phantora replay --set host.…`), and the simulated step
(host, GPU and network together) is compared with the measured one. --out keeps it all as JSON; --traces DIR keeps the
simulated traces, so that a fit on other --features replays them instead of simulating again.
"""

from __future__ import annotations

import json
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import click
import numpy as np

from phantora.engine.ops import OpKind
from phantora.paths import project_root

FEATURES = ("py_calls", "c_calls", "dispatches", "launches", "py_lines")
PRICES = {"py_calls": ("py_call_ns", 1e9), "c_calls": ("c_call_ns", 1e9), "dispatches": ("dispatch_us", 1e6),
          "py_lines": ("py_line_ns", 1e9)}
LAUNCHES = FEATURES.index("launches")
_LAUNCH_KINDS = (OpKind.KERNEL, OpKind.MEMCPY, OpKind.COLLECTIVE, OpKind.SEND, OpKind.RECV)


def configurations(measure_sh: Path) -> list[tuple[str, int, list[str]]]:
    """(name, GPUs, workload arguments) of each `run` line of measure.sh (with its shell variables expanded)."""
    text = measure_sh.read_text()
    variables = dict(re.findall(r'^(\w+)="([^"]*)"\s*$', text, re.M))
    out = []
    for line in text.splitlines():
        m = re.match(r"^run\s+(\S+)\s+(\d+)\s+(.*)$", line.strip())
        if not m:
            continue
        args = re.sub(r"\$(\w+)", lambda v: variables.get(v.group(1), ""), m.group(3))
        out.append((m.group(1), int(m.group(2)), shlex.split(args)))
    return out


def measured_step(path: Path, skip: int = 1) -> float:
    """Median step time (s) of a SUMMARY json, leaving out the first `skip` steps."""
    data = json.loads(path.read_text())
    return statistics.median(data["step_times_s"][skip:])


def counted_step(trace: Path, skip: int = 1, host=None) -> np.ndarray:
    """Work counted per step on rank 0 of a trace: FEATURES, averaged over the steps after the first `skip`, and
    last the seconds a step's compiled regions charge at `host`'s prices (a HostSpec; the defaults without one):
    their generated kernels' launches and their calls (docs/compile.md), a fixed part of the modelled host time."""
    from phantora.cluster import HostSpec
    from phantora.trace.reader import TraceReader

    host = host or HostSpec()
    with TraceReader(trace) as r:
        ops = r.ops(0)
        objs = r.op_objects(ops, 0)        # KERNEL args as the engine reads them (older traces' too)
    marks = np.nonzero(ops["kind"] == OpKind.ITER_MARK)[0]
    if len(marks) < skip + 2:
        raise click.ClickException(f"{trace}: {len(marks)} iteration marks, need at least {skip + 2}")
    window = ops[marks[skip] + 1: marks[-1] + 1]
    steps = len(marks) - 1 - skip
    launches = np.isin(window["kind"], [int(k) for k in _LAUNCH_KINDS]).sum()
    lo = marks[skip] + 1
    args = np.array([o.arg if o.kind == OpKind.KERNEL else -1 for o in objs[lo:lo + len(window)]])
    generated = args[args > 0]
    compiled_s = (len(generated) * host.generated_launch_us + (generated - 1).sum() * host.compiled_call_us) * 1e-6
    return np.array([window["host_py"].sum(), window["host_c"].sum(), window["host_disp"].sum(), launches,
                     window["host_line"].sum(), compiled_s], dtype=np.float64) / steps


def nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Non-negative least squares (Lawson-Hanson active set), for a handful of columns."""
    n = a.shape[1]
    passive = np.zeros(n, bool)
    x = np.zeros(n)
    for _ in range(3 * n):
        w = a.T @ (b - a @ x)
        if passive.all() or (w[~passive] <= 1e-12 * np.abs(w).max()).all():
            break
        j = int(np.argmax(np.where(passive, -np.inf, w)))
        passive[j] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            neg = passive & (z <= 0)
            alpha = np.min(x[neg] / (x[neg] - z[neg]))
            x = x + alpha * (z - x)
            passive &= x > 1e-15
    return x


def simulate(name: str, gpus: int, args: list[str], cluster: str, workdir: Path) -> Path:
    trace = workdir / f"{name}.h5"
    workload = project_root() / "presets" / "workloads" / "llama.py"
    cmd = [sys.executable, "-m", "phantora.cli", "run", "--cluster", cluster, "--nodes", "1", "--gpus-per-node",
           str(gpus), "--ranks", "all", "--quiet", "--trace", str(trace),
           "--host-cpu", "model", "--", "python", str(workload), "--model", "llama-tiny", "--steps", "6", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise click.ClickException(f"{name}: the simulated run failed:\n{proc.stderr[-3000:]}")
    return trace


def fit(rows: list[tuple[str, float, np.ndarray]], features: list[str], launch_s: float):
    """Prices (seconds per unit, in FEATURES order; launches at `launch_s`), the modelled step times and the
    leave-one-out relative errors (%)."""
    a = np.array([f[:len(FEATURES)] for _, _, f in rows])
    fixed = np.array([f[len(FEATURES)] for _, _, f in rows])        # compiled regions' charges (counted_step)
    b = np.array([t for _, t, _ in rows])
    cols = [FEATURES.index(f) for f in features]
    rest = b - a[:, LAUNCHES] * launch_s - fixed
    w = 1.0 / b

    def solve(mask):
        x = np.zeros(len(FEATURES))
        x[cols] = nnls(a[mask][:, cols] * w[mask, None], rest[mask] * w[mask])
        x[LAUNCHES] = launch_s
        return x

    x = solve(np.ones(len(b), bool))
    loo = []
    for i in range(len(b)):
        mask = np.ones(len(b), bool)
        mask[i] = False
        loo.append(float((a[i] @ solve(mask) + fixed[i] - b[i]) / b[i] * 100))
    return x, a @ x + fixed, loo


def replayed_step(trace: Path, prices: dict) -> float:
    """Median simulated step (s) of `trace` replayed with the host `prices`."""
    from phantora.replay import replay

    result = replay(trace, overrides=tuple(f"host.{k}={v!r}" for k, v in prices.items()))
    return statistics.median(result.iterations_s[1:] or result.iterations_s)


@click.command()
@click.argument("folder", type=click.Path(exists=True, file_okay=False))
@click.option("--cluster", default="h200-2gpu-nvlink", show_default=True, help="Cluster preset of the measured host.")
@click.option("--features", default="py_lines,dispatches", show_default=True,
              help="Counts whose prices are fitted (py_calls, c_calls, dispatches, py_lines); the others are priced "
                   "0.")
@click.option("--out", default=None, type=click.Path(dir_okay=False), help="Write the fit and the table as JSON.")
@click.option("--measure-sh", default=None, type=click.Path(exists=True, dir_okay=False),
              help="The script that measured the folder (default: groundtruth/hostcpu/measure.sh).")
@click.option("--traces", "traces_dir", default=None, type=click.Path(file_okay=False),
              help="Keep the simulated traces in this folder, and reuse those already there (another --features "
                   "fit of the same runs).")
def main(folder, cluster, features, out, measure_sh, traces_dir):
    """Fit the [host] prices of the modelled host CPU to host-bound steps measured on a GPU host."""
    from phantora.cluster import load_cluster

    names = [f.strip() for f in features.split(",") if f.strip()]
    for f in names:
        if f not in PRICES:
            raise click.BadParameter(f"unknown count {f!r} (one of {', '.join(PRICES)})", param_hint="--features")
    launch_s = load_cluster(cluster).host.launch_overhead_us * 1e-6
    folder = Path(folder)
    script = Path(measure_sh) if measure_sh else project_root() / "groundtruth" / "hostcpu" / "measure.sh"
    rows = []
    traces = {}
    with tempfile.TemporaryDirectory(prefix="phantora-hostcpu-") as tmp:
        workdir = Path(traces_dir) if traces_dir else Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        for name, gpus, args in configurations(script):
            result = folder / f"{name}.json"
            if not result.exists():
                click.echo(f"{name}: no {result.name}, left out", err=True)
                continue
            if traces_dir and (workdir / f"{name}.h5").exists():
                traces[name] = workdir / f"{name}.h5"
            else:
                click.echo(f"{name}: simulating ({gpus} GPU(s))", err=True)
                traces[name] = simulate(name, gpus, args, cluster, workdir)
            rows.append((name, measured_step(result), counted_step(traces[name], host=load_cluster(cluster).host)))
        if len(rows) <= len(names):
            raise click.ClickException(f"{len(rows)} configurations: the fit needs more than {len(names)}")
        x, model, loo = fit(rows, names, launch_s)
        prices = {key: float(x[FEATURES.index(f)] * scale) for f, (key, scale) in PRICES.items()}
        simulated = {name: replayed_step(traces[name], prices) for name in traces}
    click.echo(f"{'configuration':<22}{'py calls':>10}{'C calls':>10}{'disp':>8}{'launch':>8}{'lines':>10}"
               f"{'measured ms':>13}{'host ms':>9}{'error':>8}{'LOO':>8}{'step ms':>9}{'error':>8}")
    table = []
    for (name, t, f), m, lo in zip(rows, model, loo):
        err = (m - t) / t * 100
        step = simulated[name]
        serr = (step - t) / t * 100
        click.echo(f"{name:<22}{f[0]:>10.0f}{f[1]:>10.0f}{f[2]:>8.0f}{f[3]:>8.0f}{f[4]:>10.0f}{t * 1e3:>13.2f}"
                   f"{m * 1e3:>9.2f}"
                   f"{err:>+7.1f}%{lo:>+7.1f}%{step * 1e3:>9.2f}{serr:>+7.1f}%")
        table.append({"configuration": name, **dict(zip(FEATURES, f.tolist())), "compiled_s": float(f[-1]),
                      "measured_s": t,
                      "model_s": float(m), "error_pct": err, "loo_error_pct": lo, "simulated_step_s": step,
                      "simulated_error_pct": serr})
    errs = [abs(r["error_pct"]) for r in table]
    serrs = [abs(r["simulated_error_pct"]) for r in table]
    click.echo(f"host time: mean |error| {statistics.mean(errs):.1f}%, max {max(errs):.1f}%; leave-one-out mean "
               f"{statistics.mean(map(abs, loo)):.1f}%, max {max(map(abs, loo)):.1f}%")
    click.echo(f"simulated step: mean |error| {statistics.mean(serrs):.1f}%, max {max(serrs):.1f}%")
    click.echo(f"[host]   # launch_overhead_us = {launch_s * 1e6:g} (the cluster's, not fitted)")
    for key, v in prices.items():
        click.echo(f"{key} = {v:.4g}")
    if out:
        Path(out).write_text(json.dumps({"folder": str(folder), "cluster": cluster, "features": names,
                                         "launch_overhead_us": launch_s * 1e6, "prices": prices,
                                         "rows": table}, indent=1) + "\n")


if __name__ == "__main__":
    main()
