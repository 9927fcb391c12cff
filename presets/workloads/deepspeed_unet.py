#!/usr/bin/env python
"""A Stable Diffusion UNet training step with DeepSpeed (diffusers' UNet2DConditionModel with Stable Diffusion 1.5's
shapes, synthetic latents and text embeddings), one of the original Phantora's non-LLM DeepSpeed workloads.

    torchrun --nproc-per-node 2 presets/workloads/deepspeed_unet.py --batch 8 --zero 1
    phantora run --cluster rtx3090-pcie --ranks auto -- python presets/workloads/deepspeed_unet.py --precision fp16

The model is built from its config (no download): 4 latent channels at 64 x 64 (512 x 512 images), blocks of 320,
640, 1280 and 1280 channels, 2 layers per block, cross-attention over 77 tokens of 768. A step predicts the noise
added to random latents at random timesteps (mean squared error), as diffusion training does. The DeepSpeed config
comes from the options of presets/workloads/deepspeed_gpt.py (deepspeed_common.py). Rank 0 prints one line per step
and a final `SUMMARY {json}` line (samples per second per GPU in `tps_per_gpu`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

PROG = "deepspeed_unet"
sys.path.insert(0, str(Path(__file__).resolve().parent))
from deepspeed_common import (add_deepspeed_options, add_kernel_profile_option, check_deepspeed_options,  # noqa: E402
                              ds_config, run_steps, samples_summary, step_line, workload_main)
from workload_common import Parser, UsageError, write_summary  # noqa: E402

SD15_UNET = dict(sample_size=64, in_channels=4, out_channels=4, layers_per_block=2,
                 block_out_channels=(320, 640, 1280, 1280),
                 down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D",
                                   "DownBlock2D"),
                 up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
                 cross_attention_dim=768, attention_head_dim=8)
TEXT_TOKENS, TEXT_DIM, TIMESTEPS = 77, 768, 1000


def parse_args(argv=None) -> argparse.Namespace:
    p = Parser(prog=PROG, description="DeepSpeed Stable Diffusion UNet training loop (synthetic latents).")
    p.add_argument("--batch", type=int, default=8, help="samples per GPU per micro-step")
    p.add_argument("--steps", type=int, default=10, help="optimizer steps")
    p.add_argument("--json-out", default=None, help="also write the SUMMARY json to this file (rank 0)")
    add_deepspeed_options(p, default_zero=1)
    add_kernel_profile_option(p)
    args = p.parse_args(argv)
    for name in ("batch", "steps"):
        if getattr(args, name) <= 0:
            raise UsageError(f"--{name} must be positive")
    args.micro_batch = args.batch
    check_deepspeed_options(args)
    return args


def train(args, rank: int, local_rank: int, world: int) -> None:
    import deepspeed
    try:
        from diffusers import UNet2DConditionModel
    except ImportError:
        raise UsageError("this workload needs diffusers (pip install diffusers)") from None

    torch.cuda.set_device(local_rank)
    deepspeed.init_distributed(dist_backend="nccl")
    torch.manual_seed(args.seed)
    device = torch.device("cuda", local_rank)
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float16
    config = ds_config(args, world)
    with torch.device(device):
        model = UNet2DConditionModel(**SD15_UNET)
    model.to(dtype)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    generator = torch.Generator(device=device)
    generator.manual_seed(args.seed + rank)
    samples_per_step = args.batch * args.grad_accum * world
    device_name = torch.cuda.get_device_name(device)
    n_params = sum(p.numel() for p in model.parameters()) if args.zero < 3 else None
    log = rank == 0
    if log:
        print(f"{PROG}: Stable Diffusion 1.5 UNet ({n_params:,} parameters), world {world}, ZeRO {args.zero}, "
              f"{args.precision}, batch {args.batch} x accumulation {args.grad_accum}, on {device_name}", flush=True)
    size = SD15_UNET["sample_size"]

    def micro_loss():
        latents = torch.randn(args.batch, 4, size, size, device=device, generator=generator, dtype=dtype)
        noise = torch.randn(args.batch, 4, size, size, device=device, generator=generator, dtype=dtype)
        text = torch.randn(args.batch, TEXT_TOKENS, TEXT_DIM, device=device, generator=generator, dtype=dtype)
        t = torch.randint(0, TIMESTEPS, (args.batch,), device=device, generator=generator)
        pred = engine(latents + noise, t, encoder_hidden_states=text).sample
        return F.mse_loss(pred.float(), noise.float())

    times, losses = run_steps(engine, args.steps, args.grad_accum, micro_loss,
                              step_line("samples", samples_per_step, world, device) if log else None,
                              kernel_profile=args.kernel_profile, rank=rank, prog=PROG)
    if log:
        write_summary(samples_summary(
            PROG, "sd15-unet", samples_per_step, times, losses, world, device, params=n_params,
            config={"world_size": world, "zero": args.zero, "precision": args.precision, "micro_batch": args.batch,
                    "grad_accum": args.grad_accum, "steps": args.steps, "torch_adam": args.torch_adam,
                    "clip_grad": args.clip_grad, "offload_optimizer": args.offload_optimizer}), args.json_out)
    torch.distributed.destroy_process_group()


main = workload_main(PROG, parse_args, train)


if __name__ == "__main__":
    sys.exit(main())
