"""`phantora profile` (also `python -m phantora.probes.profile_cmd`): measure every distinct kernel signature of one
or more traces on the local CUDA GPU into a profile database (one HDF5 file per GPU model, see
phantora/costmodel/profiledb.py).

The signatures are those the traces' kernel and copy ops refer to (the `sig` column of their op rows), deduplicated
across traces and ranks. An existing database at `--out` is merged into: its signatures are skipped unless
`--force`, and it must be of the same GPU preset. Ops that launch no kernel (views, metadata) are skipped. Each
signature prints one progress line (n/total, the signature, the median in µs or why it was skipped or failed); the
database is saved at the end, also when the run is interrupted, with what was measured so far. `--op OP` keeps
only the signatures of that op; with no trace, the signatures are those the database at `--out` already holds, so
`--op OP --force` re-measures one op's records after a change to how it is measured.

`profile_traces` does the work and takes the measuring function as an argument, so tests (and other devices) can
supply their own; `profile_command` is the click command.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import click

from ..errors import PhantoraError
from ..costmodel import families as fam
from ..costmodel.measure import DEFAULT_REPEATS, DEFAULT_WARMUP
from ..costmodel.profiledb import ProfileDB
from ..costmodel.signature import Signature

Measure = Callable[[Signature, int, int], list[float]]
"""measure(signature, timed runs, warm-up runs) -> samples of one call's GPU time, in microseconds."""


@dataclass
class ProfileRun:
    """What `profile_traces` did."""

    path: Path
    gpu: str
    signatures: int = 0                        # distinct kernel signatures of the traces
    measured: list[str] = field(default_factory=list)        # keys measured (and recorded) in this run
    already: int = 0                           # in the database before, not re-measured
    no_kernel: int = 0                         # views and ops that launch no kernel
    failed: list[tuple[str, str]] = field(default_factory=list)   # (key, message)
    total_in_db: int = 0

    def summary(self) -> str:
        return (f"{self.signatures} kernel signature(s): measured {len(self.measured)}, already in the database "
                f"{self.already}, no kernel {self.no_kernel}, failed {len(self.failed)}; {self.path} holds "
                f"{self.total_in_db} signature(s) for {self.gpu}")


def trace_signatures(paths: Iterable[str | Path]) -> list[Signature]:
    """Distinct signatures of the kernel and copy ops of the traces, in order of first appearance."""
    import numpy as np

    from ..engine.ops import OpKind
    from ..trace.reader import TraceReader

    kinds = [int(OpKind.KERNEL), int(OpKind.MEMCPY)]
    out: dict[str, Signature] = {}
    for path in paths:
        with TraceReader(path) as reader:
            keys = reader.signatures
            used: set[int] = set()
            for rank in reader.ranks:
                ops = reader.ops(rank)
                sel = np.isin(ops["kind"], kinds) & (ops["sig"] >= 0)
                used.update(np.unique(ops["sig"][sel]).tolist())
            for i in sorted(used):
                if i >= len(keys):
                    raise PhantoraError(f"{path}: an op refers to signature {i}, but the trace's signature table "
                                        f"has {len(keys)} entries")
                if keys[i] not in out:
                    out[keys[i]] = Signature.from_key(keys[i])
    return list(out.values())


def describe(sig: Signature) -> str:
    """One-line text of a signature: op, tensor shapes and dtypes (a generated kernel: its name and sizes)."""
    if sig.op.startswith("inductor."):
        return (f"{sig.op}({sig.scalar('name')}, numel {sig.scalar('numel')}, rnumel {sig.scalar('rnumel')}, "
                f"{sig.scalar('bytes')} bytes)")
    tensors = [f"{'x'.join(map(str, s)) or 'scalar'}:{d}" for s, d in zip(sig.shapes, sig.dtypes)
               if s is not None and d is not None]
    for _, entries in sig.lists:
        tensors += [f"{n}*[{'x'.join(map(str, s or ()))}:{d}]" for s, d, n in entries]
    return f"{sig.op}({', '.join(tensors)})"


def guess_gpu(device_name: str) -> str | None:
    """The GPU preset whose display name matches the local device's name, if exactly one does."""
    from ..gpus import list_gpus, load_gpu, same_device

    hits = [name for name in list_gpus() if same_device(load_gpu(name).display_name, device_name)]
    return hits[0] if len(hits) == 1 else None


def _live_measure(sig: Signature, repeats: int, warmup: int) -> list[float]:
    from ..costmodel.measure import measure_signature

    return measure_signature(sig, repeats, warmup=warmup)


def _local_facts() -> tuple[str, str, str]:
    """(device name, driver version, torch version) of this machine's GPU; a PhantoraError without one."""
    import torch

    from .calibrate import _driver_version
    from ..costmodel.measure import cuda_available

    if not cuda_available():
        why = "torch is built without CUDA" if torch.version.cuda is None else "no CUDA GPU is visible"
        raise PhantoraError(f"phantora profile measures kernels on a local CUDA GPU, and {why} "
                            f"(torch {torch.__version__}); run it on a machine with the GPU to profile")
    return torch.cuda.get_device_name(), _driver_version(), torch.__version__


def _selects(ops: Sequence[str], sig_op: str) -> bool:
    """Whether a signature's op is one of `ops` (each a full overload name, or a name without the overload)."""
    return not ops or any(sig_op == op or sig_op.rsplit(".", 1)[0] == op for op in (o.strip() for o in ops))


def profile_traces(traces: Sequence[str | Path], out: str | Path, *, gpu: str | None = None, force: bool = False,
                   warmup: int = DEFAULT_WARMUP, iters: int = DEFAULT_REPEATS, measure: Measure | None = None,
                   device: tuple[str, str, str] | None = None, command: str = "",
                   echo: Callable[[str], None] = print, ops: Sequence[str] = ()) -> ProfileRun:
    """Measure the kernel signatures of `traces` into the profile database `out` (created or merged into).

    `ops` keeps only the signatures of those ops ('fsdp.split_with_sizes_copy.default', or without the overload).
    With no traces, the signatures are the database's own (it must exist and `ops` must be given): with `force`,
    they are measured again.

    `measure` defaults to live measurement on the local CUDA GPU and `device` (device name, driver, torch version)
    to this machine's; without a CUDA GPU that is a PhantoraError. `gpu` is the GPU preset name (default: the
    preset whose display name is the device's name).
    """
    from ..gpus import load_gpu, same_device

    if not traces and not ops:
        raise PhantoraError("phantora profile needs at least one trace, or --op to re-measure records of the "
                            "database itself")
    if not traces and not Path(out).exists():
        raise PhantoraError(f"{out} does not exist: without traces, --op re-measures records of an existing database")
    if warmup < 0 or iters < 1:
        raise PhantoraError(f"--warmup must be >= 0 and --iters >= 1 (got {warmup} and {iters})")
    if measure is None:
        measure = _live_measure
        device = device or _local_facts()
    device_name, driver, torch_version = device or ("", "", "")
    out = Path(out)
    db = ProfileDB.open(out) if out.exists() else None
    if gpu is None:
        gpu = db.gpu if db is not None else guess_gpu(device_name)
        if gpu is None:
            raise PhantoraError(f"cannot tell which GPU preset '{device_name}' is; pass --gpu PRESET "
                                f"(see `phantora presets`)")
    spec = load_gpu(gpu)                                        # an unknown preset is a PresetError
    if device_name and not same_device(spec.display_name, device_name):
        here = guess_gpu(device_name)
        raise PhantoraError(f"this machine's GPU is {device_name}{f' (preset {here})' if here else ''}, not "
                            f"{spec.display_name} ({gpu}): its times would be recorded as that GPU's; profile "
                            f"into a database of {here or 'a preset whose display_name is this GPU'}")
    if db is None:
        db = ProfileDB.create(out, gpu=gpu, driver=driver, torch_version=torch_version, command=command)
    elif db.gpu != gpu:
        raise PhantoraError(f"{out} is a profile of {db.gpu}, not {gpu}; profile into another file")
    else:
        for key, mine in (("driver", driver), ("torch_version", torch_version)):
            if mine and db.meta.get(key) and db.meta[key] != mine:
                echo(f"warning: {out} was measured with {key.replace('_', ' ')} {db.meta[key]}, this machine has "
                     f"{mine}; the new records are merged in")

    sigs = trace_signatures(traces) if traces else [Signature.from_key(k) for k, _ in db.items()]
    sigs = [s for s in sigs if _selects(ops, s.op)]
    if ops and not sigs:
        raise PhantoraError(f"no signature of {', '.join(ops)} in "
                            f"{'the traces' if traces else out}")
    run = ProfileRun(out, gpu, signatures=len(sigs))
    source = f"{len(traces)} trace(s)" if traces else f"{out} itself"
    echo(f"profiling {len(sigs)} kernel signature(s) of {source} on "
         f"{device_name or 'the given measuring function'} as {gpu} into {out}")
    t0 = time.perf_counter()
    try:
        for n, sig in enumerate(sigs, 1):
            key = sig.key()
            head = f"[{n}/{len(sigs)}] {describe(sig)}"
            w = fam.work(sig)                   # a conditional view (contiguous, reshape) that copies is a copy
            if w.is_view or w.family in fam.NO_KERNEL:
                run.no_kernel += 1
                echo(f"{head}: no kernel, skipped")
                continue
            if sig.op.startswith("inductor.") and not sig.scalar("graph"):
                run.no_kernel += 1              # generated by Inductor, without a recipe to rebuild it from
                echo(f"{head}: a kernel Inductor generated (torch.compile) without a recipe (sizes of a graph "
                     "compiled for dynamic shapes, a split reduction, or ops not written down), costed from its "
                     "bytes; skipped")
                continue
            if key in db and not force:
                run.already += 1
                echo(f"{head}: {db.lookup(key).median_us:.2f} us (already in the database)")
                continue
            try:
                rec = db.add(sig, measure(sig, iters, warmup))
            except PhantoraError as e:
                run.failed.append((key, str(e)))
                echo(f"{head}: failed: {e}")
                continue
            run.measured.append(key)
            echo(f"{head}: {rec.median_us:.2f} us (p10 {rec.p10_us:.2f}, p90 {rec.p90_us:.2f}, {rec.count} runs)")
    finally:
        if run.measured or not out.exists():
            db.save()
        run.total_in_db = len(db)
    echo(f"{run.summary()} ({time.perf_counter() - t0:.1f} s)")
    return run


@click.command("profile", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("traces", nargs=-1, type=click.Path(exists=True, dir_okay=False))
@click.option("--out", required=True, type=click.Path(dir_okay=False),
              help="Profile database (HDF5) to write, or to merge into when it exists.")
@click.option("--gpu", default=None, metavar="PRESET",
              help="GPU preset this machine's GPU is (default: the database's, else the preset whose device name "
                   "matches).")
@click.option("--force", is_flag=True, help="Re-measure signatures the database already has.")
@click.option("--warmup", type=int, default=DEFAULT_WARMUP, show_default=True, help="Untimed runs per signature.")
@click.option("--iters", type=int, default=DEFAULT_REPEATS, show_default=True,
              help="Timed runs per signature (fewer for kernels over 0.5 s in all, at least 3).")
@click.option("--op", "ops", multiple=True, metavar="OP",
              help="Only the signatures of this op (e.g. fsdp.split_with_sizes_copy.default; repeatable). With no "
                   "trace: the database's own signatures of it (add --force to measure them again).")
@click.option("--model", default=None, metavar="PRESET",
              help="Profile the signatures of a model preset's workload (not supported yet).")
def profile_command(traces, out, gpu, force, warmup, iters, ops, model):
    """Measure every distinct kernel signature of one or more traces on this machine's CUDA GPU into a profile
    database, which `phantora replay --profile` then costs kernels from.

    \b
    Examples:
      phantora profile run.h5 --out h100-sxm-80gb.h5
      phantora profile a.h5 b.h5 --out h100-sxm-80gb.h5 --gpu h100-sxm-80gb --iters 50
      phantora profile --out h100-sxm-80gb.h5 --op fsdp.split_with_sizes_copy --force
    """
    try:
        if model is not None:
            raise PhantoraError("--model is not supported yet: record a trace of the model's workload "
                                "(phantora run ... --trace run.h5) and profile that trace")
        command = ["phantora", "profile", *traces, "--out", out, "--warmup", str(warmup), "--iters", str(iters)]
        command += (["--gpu", gpu] if gpu else []) + (["--force"] if force else [])
        command += [a for op in ops for a in ("--op", op)]
        profile_traces(traces, out, gpu=gpu, force=force, warmup=warmup, iters=iters, echo=click.echo,
                       command=shlex.join(command), ops=ops)
    except PhantoraError as e:
        raise click.ClickException(str(e)) from None


if __name__ == "__main__":
    profile_command(prog_name="python -m phantora.probes.profile_cmd")
