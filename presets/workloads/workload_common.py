"""What the workloads of presets/workloads/ share: model shapes from a preset TOML, FLOPs per token, one-line
argument errors, the torchrun environment, device peaks and the wait for worker threads at exit.

The workloads import it from beside themselves and import nothing from Phantora: they run on real GPUs under
torchrun as they run under `phantora run`.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import threading
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

MODELS_DIR = Path(__file__).resolve().parent.parent / "models"
PRESET_FIELDS = ("dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "ffn_dim", "rope_theta", "norm_eps")

# Dense bf16 tensor-core peaks (TFLOP/s) by device name, as TorchTitan's get_peak_flops: the first key found in
# torch.cuda.get_device_name() wins, so the H100 variants come before plain "H100".
PEAK_BF16_TFLOPS = (
    ("H100 NVL", 835.0),
    ("H100 PCIe", 756.0),
    ("H100", 989.0),
    ("H200", 989.0),
    ("A100", 312.0),
)


class UsageError(Exception):
    """A bad option or an option combination this script cannot run; reported in one line, exit status 2."""


@dataclass(frozen=True)
class ModelArgs:
    """The shapes of a Llama 3 model, as in a presets/models/*.toml file."""

    name: str
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    vocab_size: int
    ffn_dim: int
    rope_theta: float
    norm_eps: float

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads


def resolve_model_path(spec: str) -> Path:
    """`llama3-8b` -> <this dir>/../models/llama3-8b.toml; anything ending in .toml is a path."""
    if spec.endswith(".toml"):
        return Path(spec)
    return MODELS_DIR / f"{spec}.toml"


def load_model_args(spec: str, layers: int | None = None, dense_only: bool = False) -> ModelArgs:
    """Read a model preset TOML; `layers` replaces n_layers; `dense_only` refuses a mixture-of-experts preset."""
    path = resolve_model_path(spec)
    if not path.is_file():
        known = sorted(p.stem for p in MODELS_DIR.glob("*.toml"))
        raise UsageError(f"model preset '{spec}' not found ({path}); known: {', '.join(known)}")
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"{path}: not valid TOML: {e}") from None
    if dense_only and data.get("num_experts"):
        raise UsageError(f"{path}: a mixture-of-experts preset; this workload builds dense models only")
    missing = [k for k in PRESET_FIELDS if k not in data]
    if missing:
        raise UsageError(f"{path}: missing field(s) {', '.join(missing)}")
    fields = {k: data[k] for k in PRESET_FIELDS}
    for k in PRESET_FIELDS[:6]:
        if not isinstance(fields[k], int) or isinstance(fields[k], bool) or fields[k] <= 0:
            raise UsageError(f"{path}: {k} must be a positive integer, got {fields[k]!r}")
    for k in ("rope_theta", "norm_eps"):
        if not isinstance(fields[k], (int, float)) or fields[k] <= 0:
            raise UsageError(f"{path}: {k} must be a positive number, got {fields[k]!r}")
        fields[k] = float(fields[k])
    if layers is not None:
        if layers <= 0:
            raise UsageError(f"--layers must be positive, got {layers}")
        fields["n_layers"] = layers
    args = ModelArgs(name=str(data.get("name", path.stem)), **fields)
    if args.dim % args.n_heads:
        raise UsageError(f"{path}: dim {args.dim} is not divisible by n_heads {args.n_heads}")
    if args.head_dim % 2:
        raise UsageError(f"{path}: head size {args.head_dim} must be even for RoPE")
    if args.n_heads % args.n_kv_heads:
        raise UsageError(f"{path}: n_heads {args.n_heads} is not divisible by n_kv_heads {args.n_kv_heads}")
    return args


def flops_per_token(a: ModelArgs, seq_len: int, params_without_embedding: int) -> int:
    """Training FLOPs per token as TorchTitan's MFU counts them: 6 N + 12 L H Dh S (N without the input embedding)."""
    return 6 * params_without_embedding + 12 * a.n_layers * a.n_heads * a.head_dim * seq_len


class Parser(argparse.ArgumentParser):
    """argparse that reports an error in one line (no usage block) with exit status 2."""

    def error(self, message):
        raise UsageError(message)


def peak_tflops_for(device_name: str | None) -> float | None:
    if not device_name:
        return None
    for key, tflops in PEAK_BF16_TFLOPS:
        if key in device_name:
            return tflops
    return None


def default_env() -> None:
    """Without torchrun, run as a world of one."""
    if "RANK" in os.environ:
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))


def env_int(name: str) -> int:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        raise UsageError(f"environment variable {name} must be an integer (launch with torchrun)") from None


def settle_threads(timeout_s: float = 1.0, window_s: float = 0.02) -> None:
    """Wait (Linux) until the process's other threads have used no CPU for `window_s`, at most `timeout_s`.

    A worker thread of PyTorch (autograd's, a process group's) still releasing Python objects when the interpreter
    finalizes is ended by CPython with pthread_exit, which PyTorch's C++ frames turn into std::terminate: the run would
    end with SIGABRT after training finished. Waiting here, with the GIL released by each sleep, lets it finish."""
    def busy() -> int | None:
        try:
            tids = [t for t in os.listdir("/proc/self/task") if int(t) != threading.get_native_id()]
            return sum(int(open(f"/proc/self/task/{t}/schedstat").read().split()[0]) for t in tids)
        except (OSError, ValueError, IndexError):
            return None

    deadline = time.monotonic() + timeout_s
    before = busy()
    while before is not None and time.monotonic() < deadline:
        time.sleep(window_s)
        after = busy()
        if after == before:
            return
        before = after


# ------------------------------------------------------------------------------- a CUDA workload's frame
def cuda_main(prog: str, parse, start) -> int:
    """The `main` of a workload that needs CUDA: `parse()` reads the arguments, then `start(parsed, world, rank,
    local_rank)` trains; a UsageError (from the arguments or the layout) ends the run with one line on stderr and
    status 2."""
    import sys

    import torch
    try:
        parsed = parse()
        if not torch.cuda.is_available():
            raise UsageError("this workload needs CUDA (run on a GPU, or under `phantora run`)")
        default_env()
        start(parsed, env_int("WORLD_SIZE"), env_int("RANK"), env_int("LOCAL_RANK"))
    except UsageError as e:
        print(f"{prog}: error: {e}", file=sys.stderr, flush=True)
        return 2
    settle_threads()
    return 0


def lm_step_line(step: int, loss: float, dt: float, tps: float, fpt: float, peak: float | None, mem_gib: float,
                 grad_norm: float | None) -> str:
    """A language-model step line: `step N loss L time_s T tps_per_gpu X [mfu M%] mem_gib G [grad_norm N]`."""
    loss_text = "n/a" if loss != loss else f"{loss:.4f}"
    line = f"step {step} loss {loss_text} time_s {dt:.4f} tps_per_gpu {tps:.1f}"
    if peak:
        line += f" mfu {100.0 * tps * fpt / (peak * 1e12):.2f}%"
    line += f" mem_gib {mem_gib:.2f}"
    if grad_norm is not None:
        line += f" grad_norm {float(grad_norm):.3f}"
    return line


def lm_summary(workload: str, a: ModelArgs, params: tuple[int, int], fpt: float, tokens_per_step: int,
               times: list[float], losses: list[float], world: int, peak: float | None, peak_mem_gib: float,
               device_name: str, config: dict) -> dict:
    """The SUMMARY of a language-model workload (the keys presets/workloads/llama.py's SUMMARY has); the median
    leaves the first step out."""
    from dataclasses import asdict
    from statistics import median as _median

    median = _median(times[1:] if len(times) > 1 else times)
    tps = tokens_per_step / median / world
    return {"workload": workload, "model": a.name, "shapes": asdict(a), "params": params[0],
            "params_without_embedding": params[1], "flops_per_token": fpt,
            "global_tokens_per_step": tokens_per_step, "step_times_s": times, "losses": losses,
            "median_step_s": median, "tps_per_gpu": tps, "peak_tflops": peak,
            "mfu_pct": 100.0 * tps * fpt / (peak * 1e12) if peak else None,
            "peak_mem_gib": peak_mem_gib, "device_name": device_name, "config": config}


def write_summary(summary: dict, json_out: str | None) -> None:
    """Print `SUMMARY {json}` and write the json to `json_out` if given."""
    text = json.dumps(summary)
    print(f"SUMMARY {text}", flush=True)
    if json_out:
        Path(json_out).write_text(text + "\n")


# ------------------------------------------------------------------------------- in-situ kernel profile
KERNEL_PROFILE_STEPS = (3, 4)


def start_kernel_profile():
    from torch.profiler import ProfilerActivity, profile

    # KERNEL_PROFILE_STACKS=1: also the Python stack of the op that launched each kernel (launchers.json)
    prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True,
                   with_stack=os.environ.get("KERNEL_PROFILE_STACKS") == "1")
    prof.__enter__()
    return prof


def _launchers(prof) -> list[dict]:
    """Per (kernel, launching op with its callers' ops, input shapes, Python frames) the launches and GPU time."""
    found: dict[tuple, list] = {}
    for evt in prof.events():
        if not getattr(evt, "kernels", None):
            continue
        chain, p = [], evt
        while p is not None and len(chain) < 10:
            chain.append(p.name)
            p = p.cpu_parent
        frames = tuple(f for f in (getattr(evt, "stack", None) or ()) if "torch/" not in f)[:4]
        for k in evt.kernels:
            key = (k.name[:120], tuple(chain), json.dumps(evt.input_shapes), frames)
            slot = found.setdefault(key, [0, 0.0])
            slot[0] += 1
            slot[1] += float(k.duration)
    return [{"kernel": k, "ops": list(c), "shapes": json.loads(sh), "frames": list(fr), "count": n, "total_us": t}
            for (k, c, sh, fr), (n, t) in sorted(found.items(), key=lambda kv: -kv[1][1])]


def write_kernel_profile(prof, out: Path, step_times: list[float], prog: str) -> None:
    """In-situ GPU time of the recorded steps: per (op, input shapes) the kernel time launched by the op itself
    (torch.profiler's self device time), per op its host time under the profiler (host_ops.json: calls, CPU time
    with and without the ops it calls, the profiler's own cost per op included), per kernel name its calls and total
    time (summed over the recorded steps), the timeline of every kernel (name, stream, start, duration;
    timeline.json) and per kernel the op that launched it with its callers (launchers.json; with
    KERNEL_PROFILE_STACKS=1 also its Python frames). Times in microseconds."""
    import torch

    prof.__exit__(None, None, None)
    out.mkdir(parents=True, exist_ok=True)
    steps = len(step_times)
    ops = []
    for e in prof.key_averages(group_by_input_shape=True):
        dev_us = float(getattr(e, "self_device_time_total", 0.0) or 0.0)
        if dev_us <= 0 or e.key.startswith(("ProfilerStep", "cuda", "void ", "Memcpy", "Memset")):
            continue
        if getattr(e, "device_type", None) is not None and "CUDA" in str(e.device_type):
            continue
        ops.append({"op": e.key, "shapes": e.input_shapes, "count": e.count, "self_device_us": dev_us})
    kernels: dict[str, list[float]] = {}
    names: dict[str, int] = {}
    timeline = []                       # (kernel name id, stream, start µs, duration µs) of every GPU activity
    for ev in prof.profiler.kineto_results.events():
        if "cuda" not in str(ev.device_type()).lower():
            continue
        if getattr(ev, "is_user_annotation", lambda: False)():   # a record_function's range, not a GPU activity
            continue
        k = kernels.setdefault(ev.name(), [0, 0.0])
        k[0] += 1
        k[1] += ev.duration_ns() / 1000.0
        timeline.append((names.setdefault(ev.name(), len(names)), int(ev.device_resource_id()),
                         ev.start_ns() / 1000.0, ev.duration_ns() / 1000.0))
    meta = {"steps": steps, "step_times_s": step_times, "device": torch.cuda.get_device_name(),
            "torch": torch.__version__}
    (out / "ops.json").write_text(json.dumps({**meta, "ops": ops}) + "\n")
    host = [{"op": e.key, "count": e.count, "cpu_us": float(e.cpu_time_total),
             "self_cpu_us": float(e.self_cpu_time_total)} for e in prof.key_averages() if e.count]
    (out / "host_ops.json").write_text(json.dumps({**meta, "host_ops": sorted(host, key=lambda h: -h["cpu_us"])})
                                       + "\n")
    (out / "launchers.json").write_text(json.dumps({**meta, "launchers": _launchers(prof)}) + "\n")
    (out / "kernels.json").write_text(json.dumps(
        {**meta, "kernels": [{"name": n, "calls": c, "total_us": t} for n, (c, t) in
                             sorted(kernels.items(), key=lambda kv: -kv[1][1])]}) + "\n")
    t0 = min((t[2] for t in timeline), default=0.0)
    (out / "timeline.json").write_text(json.dumps(
        {**meta, "names": sorted(names, key=names.get), "columns": ["name", "stream", "start_us", "duration_us"],
         "kernels": [(n, st, round(s - t0, 3), round(d, 3)) for n, st, s, d in sorted(timeline, key=lambda t: t[2])]})
        + "\n")
    print(f"{prog}: in-situ kernel profile of steps {KERNEL_PROFILE_STEPS} written to {out}", flush=True)
