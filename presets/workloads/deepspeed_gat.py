#!/usr/bin/env python
"""A graph attention network (torch_geometric's GATConv) trained full-graph with DeepSpeed on a synthetic graph, one of
the original Phantora's non-LLM DeepSpeed workloads.

    torchrun --nproc-per-node 2 presets/workloads/deepspeed_gat.py --nodes 169343 --edges 1166243
    phantora run --cluster rtx3090-pcie --ranks auto -- python presets/workloads/deepspeed_gat.py

The default graph has ogbn-arxiv's sizes (169,343 nodes, 1,166,243 edges, 128 features, 40 classes), with random
features and edges drawn on the device; each data-parallel rank trains on its own graph of that size. The network:
`--layers` GATConv layers of `--heads` heads x `--hidden` channels (ELU between them; no self-loops added, so the
edge count is the graph's), a linear classifier, cross-entropy over all nodes. The DeepSpeed config comes from the
options of presets/workloads/deepspeed_gpt.py (deepspeed_common.py). Rank 0 prints one line per step and a final
`SUMMARY {json}` line (graphs per second per GPU in `tps_per_gpu`).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

PROG = "deepspeed_gat"
sys.path.insert(0, str(Path(__file__).resolve().parent))
from deepspeed_common import (add_deepspeed_options, add_kernel_profile_option, check_deepspeed_options,  # noqa: E402
                              ds_config, run_steps, samples_summary, step_line, workload_main)
from workload_common import Parser, UsageError, write_summary  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = Parser(prog=PROG, description="DeepSpeed GAT training loop (synthetic graph).")
    p.add_argument("--nodes", type=int, default=169_343, help="graph nodes")
    p.add_argument("--edges", type=int, default=1_166_243, help="graph edges")
    p.add_argument("--features", type=int, default=128, help="input features per node")
    p.add_argument("--classes", type=int, default=40, help="node classes")
    p.add_argument("--layers", type=int, default=3, help="GATConv layers")
    p.add_argument("--heads", type=int, default=8, help="attention heads per layer")
    p.add_argument("--hidden", type=int, default=64, help="channels per head")
    p.add_argument("--steps", type=int, default=10, help="optimizer steps")
    p.add_argument("--json-out", default=None, help="also write the SUMMARY json to this file (rank 0)")
    add_deepspeed_options(p, default_zero=1)
    add_kernel_profile_option(p)
    args = p.parse_args(argv)
    for name in ("nodes", "edges", "features", "classes", "layers", "heads", "hidden", "steps"):
        if getattr(args, name) <= 0:
            raise UsageError(f"--{name} must be positive")
    args.micro_batch = 1
    check_deepspeed_options(args)
    return args


class GAT(nn.Module):
    def __init__(self, args):
        super().__init__()
        from torch_geometric.nn import GATConv
        dims = [args.features] + [args.heads * args.hidden] * args.layers
        self.convs = nn.ModuleList(GATConv(dims[i], args.hidden, heads=args.heads, add_self_loops=False)
                                   for i in range(args.layers))
        self.head = nn.Linear(dims[-1], args.classes)

    def forward(self, x, edge_index):
        for conv in self.convs:
            x = F.elu(conv(x, edge_index))
        return self.head(x)


def train(args, rank: int, local_rank: int, world: int) -> None:
    import deepspeed
    if importlib.util.find_spec("torch_geometric") is None:
        raise UsageError("this workload needs torch_geometric (pip install torch_geometric)")

    torch.cuda.set_device(local_rank)
    deepspeed.init_distributed(dist_backend="nccl")
    torch.manual_seed(args.seed)
    device = torch.device("cuda", local_rank)
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float16
    with torch.device(device):
        model = GAT(args)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=ds_config(args, world))
    generator = torch.Generator(device=device)
    generator.manual_seed(args.seed + rank)
    x = torch.randn(args.nodes, args.features, device=device, generator=generator, dtype=dtype)
    edge_index = torch.randint(0, args.nodes, (2, args.edges), device=device, generator=generator)
    labels = torch.randint(0, args.classes, (args.nodes,), device=device, generator=generator)
    device_name = torch.cuda.get_device_name(device)
    log = rank == 0
    if log:
        print(f"{PROG}: GAT {args.layers} x {args.heads} heads x {args.hidden}, graph {args.nodes:,} nodes "
              f"{args.edges:,} edges, world {world}, ZeRO {args.zero}, {args.precision}, on {device_name}", flush=True)
    def micro_loss():
        return F.cross_entropy(engine(x, edge_index).float(), labels)

    times, losses = run_steps(engine, args.steps, args.grad_accum, micro_loss,
                              step_line("graphs", args.grad_accum * world, world, device) if log else None,
                              kernel_profile=args.kernel_profile, rank=rank, prog=PROG)
    if log:
        write_summary(samples_summary(
            PROG, "gat", args.grad_accum * world, times, losses, world, device,
            config={"world_size": world, "zero": args.zero, "precision": args.precision, "nodes": args.nodes,
                    "edges": args.edges, "features": args.features, "classes": args.classes, "layers": args.layers,
                    "heads": args.heads, "hidden": args.hidden, "grad_accum": args.grad_accum,
                    "steps": args.steps}), args.json_out)
    torch.distributed.destroy_process_group()


main = workload_main(PROG, parse_args, train)


if __name__ == "__main__":
    sys.exit(main())
