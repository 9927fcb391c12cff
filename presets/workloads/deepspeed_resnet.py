#!/usr/bin/env python
"""ResNet-50 image classification trained with DeepSpeed (synthetic ImageNet-shaped data), as the original Phantora's
non-LLM DeepSpeed workload.

    torchrun --nproc-per-node 2 presets/workloads/deepspeed_resnet.py --batch 128 --zero 1
    phantora run --gpus-per-node 8 --cluster rtx3090-pcie -- python presets/workloads/deepspeed_resnet.py --zero 2

The network is torchvision's `resnet50()` layer for layer (Bottleneck blocks [3, 4, 6, 3], stride on the 3x3
convolution, BatchNorm after every convolution, 1000 classes), written out here so that the workload needs no
torchvision (whose compiled ops must match the torch build). The DeepSpeed config comes from the same options as
presets/workloads/deepspeed_gpt.py (deepspeed_common.py: `--zero`, `--precision`, `--torch-adam`, `--ds-config`...).
The model is cast to the training dtype before `deepspeed.initialize` (DeepSpeed casts parameters, not BatchNorm's
running statistics, and a GPU refuses the mix in the backward). Rank 0 prints one line per step and a final
`SUMMARY {json}` line (images per second per GPU in `tps_per_gpu`).

Bad arguments end the run with one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

PROG = "deepspeed_resnet"
sys.path.insert(0, str(Path(__file__).resolve().parent))
from deepspeed_common import (add_deepspeed_options, add_kernel_profile_option, check_deepspeed_options,  # noqa: E402
                              ds_config, run_steps, samples_summary, step_line, workload_main)
from workload_common import Parser, UsageError, write_summary  # noqa: E402


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.downsample = downsample

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)), inplace=True)
        out = F.relu(self.bn2(self.conv2(out)), inplace=True)
        out = self.bn3(self.conv3(out))
        identity = self.downsample(x) if self.downsample is not None else x
        return F.relu(out + identity, inplace=True)


class ResNet50(nn.Module):
    def __init__(self, num_classes: int = 1000):
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        self.layer1 = self._layer(64, 3)
        self.layer2 = self._layer(128, 4, stride=2)
        self.layer3 = self._layer(256, 6, stride=2)
        self.layer4 = self._layer(512, 3, stride=2)
        self.fc = nn.Linear(2048, num_classes)

    def _layer(self, planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * 4:
            downsample = nn.Sequential(nn.Conv2d(self.inplanes, planes * 4, 1, stride=stride, bias=False),
                                       nn.BatchNorm2d(planes * 4))
        layers = [Bottleneck(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * 4
        layers += [Bottleneck(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(F.relu(self.bn1(self.conv1(x)), inplace=True))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def parse_args(argv=None) -> argparse.Namespace:
    p = Parser(prog=PROG, description="DeepSpeed ResNet-50 training loop (synthetic images).")
    p.add_argument("--batch", type=int, default=64, help="images per GPU per micro-step")
    p.add_argument("--image-size", type=int, default=224, help="image height and width")
    p.add_argument("--steps", type=int, default=10, help="optimizer steps")
    p.add_argument("--json-out", default=None, help="also write the SUMMARY json to this file (rank 0)")
    add_deepspeed_options(p, default_zero=1)
    add_kernel_profile_option(p)
    args = p.parse_args(argv)
    for name in ("batch", "image_size", "steps"):
        if getattr(args, name) <= 0:
            raise UsageError(f"--{name.replace('_', '-')} must be positive")
    args.micro_batch = args.batch
    check_deepspeed_options(args)
    return args


def train(args, rank: int, local_rank: int, world: int) -> None:
    import deepspeed

    torch.cuda.set_device(local_rank)
    deepspeed.init_distributed(dist_backend="nccl")
    torch.manual_seed(args.seed)
    device = torch.device("cuda", local_rank)
    config = ds_config(args, world)
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float16
    with torch.device(device):
        model = ResNet50()
    # DeepSpeed casts the parameters to bf16/fp16, not BatchNorm's running statistics, which cuDNN wants alike
    model.to(dtype)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    generator = torch.Generator(device=device)
    generator.manual_seed(args.seed + rank)
    n_params = sum(p.numel() for p in model.parameters()) if args.zero < 3 else None
    images_per_step = args.batch * args.grad_accum * world
    device_name = torch.cuda.get_device_name(device)
    log = rank == 0
    if log:
        print(f"{PROG}: ResNet-50, world {world}, ZeRO {args.zero}, {args.precision}, batch {args.batch} x "
              f"accumulation {args.grad_accum}, {args.image_size}x{args.image_size}, on {device_name}", flush=True)
    def micro_loss():
        images = torch.randn(args.batch, 3, args.image_size, args.image_size, device=device,
                             generator=generator).to(dtype)
        labels = torch.randint(0, 1000, (args.batch,), device=device, generator=generator)
        return F.cross_entropy(engine(images).float(), labels)

    times, losses = run_steps(engine, args.steps, args.grad_accum, micro_loss,
                              step_line("images", images_per_step, world, device) if log else None,
                              kernel_profile=args.kernel_profile, rank=rank, prog=PROG)
    if log:
        write_summary(samples_summary(
            PROG, "resnet50", images_per_step, times, losses, world, device, params=n_params,
            config={"world_size": world, "zero": args.zero, "precision": args.precision, "micro_batch": args.batch,
                    "grad_accum": args.grad_accum, "image_size": args.image_size, "steps": args.steps,
                    "torch_adam": args.torch_adam, "clip_grad": args.clip_grad,
                    "offload_optimizer": args.offload_optimizer}), args.json_out)
    torch.distributed.destroy_process_group()


main = workload_main(PROG, parse_args, train)


if __name__ == "__main__":
    sys.exit(main())
