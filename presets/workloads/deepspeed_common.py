"""What the DeepSpeed workloads of presets/workloads/ share: the options that build a DeepSpeed config, the config,
and the training loop and SUMMARY of the non-language-model workloads (deepspeed_resnet.py, deepspeed_unet.py,
deepspeed_gat.py). Imports nothing from Phantora; DeepSpeed is imported by the caller."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Callable

import torch

from workload_common import (KERNEL_PROFILE_STEPS, UsageError, cuda_main, start_kernel_profile,
                             write_kernel_profile)


def add_deepspeed_options(p: argparse.ArgumentParser, default_zero: int = 2) -> None:
    """The options that build the DeepSpeed config (shared with deepspeed_resnet.py)."""
    p.add_argument("--zero", type=int, choices=(0, 1, 2, 3), default=default_zero, help="ZeRO stage")
    p.add_argument("--grad-accum", type=int, default=1, help="gradient accumulation steps")
    p.add_argument("--precision", choices=("bf16", "fp16"), default="bf16",
                   help="bf16, or fp16 with dynamic loss scaling")
    p.add_argument("--offload-optimizer", choices=("none", "cpu", "nvme"), default="none",
                   help="ZeRO-Offload: optimizer state and step on the CPU (ZeRO 1-3); nvme: the state kept on local "
                        "storage (ZeRO-Infinity, ZeRO 3)")
    p.add_argument("--offload-param", choices=("none", "cpu", "nvme"), default="none",
                   help="ZeRO-Infinity: parameters kept on the CPU or on local storage (ZeRO 3)")
    p.add_argument("--nvme-path", default=None, metavar="DIR",
                   help="folder of the NVMe swap files (default: a new temporary folder, removed at exit)")
    p.add_argument("--torch-adam", action="store_true", help="torch's AdamW instead of DeepSpeed's FusedAdam")
    p.add_argument("--clip-grad", type=float, default=1.0, help="gradient clipping norm (0 disables)")
    p.add_argument("--bucket-mb", type=float, default=500.0,
                   help="ZeRO reduce / all-gather bucket size in millions of elements, as DeepSpeed's default 5e8")
    p.add_argument("--no-overlap-comm", action="store_true", help="ZeRO overlap_comm off")
    p.add_argument("--quantized-weights", action="store_true",
                   help="ZeRO++ qwZ: ZeRO-3's weight all-gathers in int8 (zero_quantized_weights)")
    p.add_argument("--quantized-gradients", action="store_true",
                   help="ZeRO++ qgZ: ZeRO-3's gradient reduction as 4-bit all-to-alls (zero_quantized_gradients)")
    p.add_argument("--hpz", type=int, default=1, metavar="N",
                   help="ZeRO++ hpZ: a secondary copy of the weights partitioned over N GPUs (zero_hpz_partition_size; "
                        "1: off)")
    p.add_argument("--ds-config", default=None, metavar="FILE.json",
                   help="a DeepSpeed config merged over the one the options build (its keys win)")
    p.add_argument("--wall-clock-breakdown", action="store_true", help="DeepSpeed's own timers, printed each step")
    p.add_argument("--lr", type=float, default=3e-4, help="AdamW learning rate")
    p.add_argument("--seed", type=int, default=1234, help="seed")
    p.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)  # deepspeed launcher


def add_kernel_profile_option(p: argparse.ArgumentParser) -> None:
    """`--kernel-profile DIR` of the non-language-model workloads (run_steps records steps 3-4)."""
    p.add_argument("--kernel-profile", default=None, metavar="DIR",
                   help="record steps 3-4 with torch.profiler on a GPU host: DIR/{ops,kernels,launchers,timeline}"
                        ".json (rank 0; DIR/rank<N>/ for the others)")


def check_deepspeed_options(args: argparse.Namespace) -> None:
    if args.grad_accum <= 0:
        raise UsageError("--grad-accum must be positive")
    if args.bucket_mb <= 0:
        raise UsageError("--bucket-mb must be positive")
    if args.offload_optimizer != "none" and args.zero == 0:
        raise UsageError("--offload-optimizer needs --zero 1, 2 or 3")
    if (args.offload_optimizer == "nvme" or args.offload_param != "none") and args.zero != 3:
        raise UsageError("--offload-optimizer nvme and --offload-param need --zero 3")
    if (args.quantized_weights or args.quantized_gradients or args.hpz != 1) and args.zero != 3:
        raise UsageError("--quantized-weights, --quantized-gradients and --hpz (ZeRO++) need --zero 3")
    if args.hpz < 1:
        raise UsageError("--hpz must be 1 or more")
    if getattr(args, "kernel_profile", None) and args.steps < KERNEL_PROFILE_STEPS[-1]:
        raise UsageError("--kernel-profile records steps 3-4: it needs --steps 4 or more")


def ds_config(args, dp: int) -> dict:
    """The DeepSpeed config of the options for `dp` data-parallel ranks, with --ds-config merged over it (one level
    deep per section)."""
    bucket = int(args.bucket_mb * 1e6)
    zero = {"stage": args.zero, "overlap_comm": not args.no_overlap_comm, "contiguous_gradients": True,
            "reduce_bucket_size": bucket, "allgather_bucket_size": bucket}
    if args.zero == 3:
        zero.update(stage3_prefetch_bucket_size=bucket, stage3_param_persistence_threshold=int(1e5))
        if args.quantized_weights:
            zero["zero_quantized_weights"] = True
        if args.quantized_gradients:
            zero["zero_quantized_gradients"] = True
        if args.hpz != 1:
            zero["zero_hpz_partition_size"] = args.hpz
    nvme = args.nvme_path
    if "nvme" in (args.offload_optimizer, args.offload_param) and not nvme:
        import atexit
        import shutil
        import tempfile
        nvme = tempfile.mkdtemp(prefix="nvme-swap-")
        atexit.register(shutil.rmtree, nvme, ignore_errors=True)     # the swap files go with the run
    for key, device in (("offload_optimizer", args.offload_optimizer), ("offload_param", args.offload_param)):
        if device != "none":
            zero[key] = {"device": device, "pin_memory": True, **({"nvme_path": nvme} if device == "nvme" else {})}
    config = {
        "train_micro_batch_size_per_gpu": args.micro_batch,
        "gradient_accumulation_steps": args.grad_accum,
        "train_batch_size": args.micro_batch * args.grad_accum * dp,
        "optimizer": {"type": "AdamW", "params": {"lr": args.lr, "betas": [0.9, 0.95], "eps": 1e-8,
                                                   "weight_decay": 0.1, "torch_adam": args.torch_adam}},
        "zero_optimization": zero,
        "gradient_clipping": args.clip_grad,
        "steps_per_print": 10 ** 9,
        "wall_clock_breakdown": args.wall_clock_breakdown,
    }
    if args.precision == "bf16":
        config["bf16"] = {"enabled": True}
    else:
        config["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}
    if args.ds_config:
        path = Path(args.ds_config)
        try:
            extra = json.loads(path.read_text())
        except OSError as e:
            raise UsageError(f"--ds-config {path}: {e.strerror}") from None
        except json.JSONDecodeError as e:
            raise UsageError(f"--ds-config {path}: not valid JSON: {e}") from None
        if not isinstance(extra, dict):
            raise UsageError(f"--ds-config {path}: a JSON object is expected")
        for key, value in extra.items():
            if isinstance(value, dict) and isinstance(config.get(key), dict):
                config[key] = {**config[key], **value}
            else:
                config[key] = value
    return config


def run_steps(engine, steps: int, grad_accum: int, micro_loss: Callable[[], torch.Tensor],
              line: Callable[[int, float, float], str] | None, kernel_profile: str | None = None,
              rank: int = 0, prog: str = "") -> tuple[list[float], list[float]]:
    """`steps` optimizer steps of `grad_accum` micro-steps (`engine.backward`, `engine.step`), each timed between two
    `torch.cuda.synchronize()`; `line(step, seconds, loss)`, if given, is printed after each. With `kernel_profile`
    (a folder), steps 3-4 are recorded by torch.profiler (workload_common.write_kernel_profile)."""
    times, losses = [], []
    recorder = None
    for step in range(1, steps + 1):
        if kernel_profile and step == KERNEL_PROFILE_STEPS[0]:
            recorder = start_kernel_profile()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(grad_accum):
            loss = micro_loss()
            engine.backward(loss)
            engine.step()
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        times.append(dt)
        if recorder is not None and step == KERNEL_PROFILE_STEPS[-1]:
            out = Path(kernel_profile) if rank == 0 else Path(kernel_profile) / f"rank{rank}"
            write_kernel_profile(recorder, out, times[-len(KERNEL_PROFILE_STEPS):], prog)
            recorder = None
        losses.append(loss.item())
        if line is not None:
            print(line(step, dt, losses[-1]), flush=True)
    return times, losses


def samples_summary(workload: str, model: str, samples_per_step: float, times: list[float], losses: list[float],
                    world: int, device: torch.device, config: dict, **extra) -> dict:
    """The SUMMARY of a non-language-model workload: median of the steps after the first, samples (images, latents,
    graphs) per second per GPU in `tps_per_gpu`."""
    median = statistics.median(times[1:] if len(times) > 1 else times)
    return {"workload": workload, "model": model, **extra, "samples_per_step": samples_per_step,
            "step_times_s": times, "losses": losses, "median_step_s": median,
            "tps_per_gpu": samples_per_step / median / world,
            "peak_mem_gib": torch.cuda.max_memory_allocated(device) / 2**30,
            "device_name": torch.cuda.get_device_name(device), "config": config}


def step_line(unit: str, samples_per_step: float, world: int, device: torch.device):
    """The per-step line of a non-language-model workload: `step N loss L time_s T <unit>_per_s_per_gpu X mem_gib G`."""
    def line(step: int, dt: float, loss: float) -> str:
        return (f"step {step} loss {loss:.4f} time_s {dt:.4f} {unit}_per_s_per_gpu "
                f"{samples_per_step / dt / world:.1f} mem_gib {torch.cuda.max_memory_allocated(device) / 2**30:.2f}")
    return line


def workload_main(prog: str, parse_args, train):
    """The `main(argv=None)` of a workload whose `train(args, rank, local_rank, world)` needs CUDA."""
    def main(argv=None) -> int:
        return cuda_main(prog, lambda: parse_args(argv),
                         lambda args, world, rank, local_rank: train(args, rank, local_rank, world))
    return main
