#!/usr/bin/env python
"""A DeepSpeed Llama trainer: `deepspeed.initialize` with a ZeRO config, `engine(batch)`, `engine.backward`,
`engine.step`, as DeepSpeed's own examples train.

    torchrun --nproc-per-node 2 presets/workloads/deepspeed_gpt.py --model llama3.2-1b --zero 3
    deepspeed --num_gpus 2 presets/workloads/deepspeed_gpt.py --model llama3.2-1b --zero 2
    phantora run --gpus-per-node 8 -- python presets/workloads/deepspeed_gpt.py --model llama3-8b --zero 3 --ac full

It imports nothing from Phantora: the same file measures ground truth on real GPUs and is simulated under
`phantora run`. What it does, with DeepSpeed's own pieces only:

- the Llama 3 model of presets/workloads/llama.py (shapes from a model preset TOML), built on the device, inside
  `deepspeed.zero.Init` under ZeRO-3 so that a large model never exists unpartitioned;
- a DeepSpeed config built from the options (`--zero 0|1|2|3`, bf16 or fp16 with dynamic loss scaling, the
  optimizer DeepSpeed picks for `"type": "AdamW"` (FusedAdam on a GPU; `--torch-adam` for torch's),
  `--offload-optimizer cpu`, `--clip-grad`, `--grad-accum`, ZeRO's bucket and prefetch sizes), with
  `--ds-config FILE.json` merged over it;
- `--ac full`: every block through `deepspeed.checkpointing.checkpoint`;
- a mixture-of-experts preset (mixtral-8x7b): every block's MLP is DeepSpeed's MoE layer
  (`deepspeed.moe.layer.MoE` over the preset's SwiGLU experts, its top-k gate, `--ep N` expert parallelism,
  `--capacity-factor`, `--no-drop-tokens`), the gate's auxiliary loss added with weight 0.01 and the optimizer's
  parameter groups split for the experts (`split_params_into_different_moe_groups_for_optimizer`); ZeRO 0-2;
- `--pp N`: DeepSpeed's PipelineEngine (`PipelineModule` of LayerSpecs: embedding, one layer per block, norm and head,
  split evenly; `engine.train_batch` runs --grad-accum micro-batches through the stages, ZeRO 0/1);
- random tokens; rank 0 prints one line per step and a final `SUMMARY {json}` line (the same keys as
  presets/workloads/llama.py's); `--wall-clock-breakdown` turns on DeepSpeed's own timers.

Bad arguments end the run with one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

PROG = "deepspeed_gpt"
sys.path.insert(0, str(Path(__file__).resolve().parent))     # workload_common.py, deepspeed_common.py, llama.py
from deepspeed_common import add_deepspeed_options, check_deepspeed_options, ds_config  # noqa: E402
from llama import Transformer, count_params  # noqa: E402
from workload_common import (KERNEL_PROFILE_STEPS, ModelArgs, Parser, UsageError, cuda_main,  # noqa: E402
                             flops_per_token, lm_step_line, lm_summary, load_model_args, peak_tflops_for,
                             resolve_model_path, start_kernel_profile, write_kernel_profile, write_summary)


def parse_args(argv=None) -> argparse.Namespace:
    p = Parser(prog=PROG, description="DeepSpeed Llama training loop (random data).")
    p.add_argument("--model", default="llama3.2-1b", help="preset name in presets/models/ or a path to a .toml")
    p.add_argument("--layers", type=int, default=None, help="override n_layers of the preset")
    p.add_argument("--micro-batch", type=int, default=1, help="sequences per GPU per micro-step")
    p.add_argument("--seq", type=int, default=2048, help="sequence length")
    p.add_argument("--steps", type=int, default=10, help="optimizer steps")
    p.add_argument("--ac", choices=("none", "full"), default="none",
                   help="activation checkpointing of every block (deepspeed.checkpointing)")
    p.add_argument("--pp", type=int, default=1,
                   help="pipeline stages (DeepSpeed's PipelineEngine; --grad-accum micro-batches per step, ZeRO 0-1)")
    p.add_argument("--ep", type=int, default=1, help="expert-parallel degree of a mixture-of-experts preset")
    p.add_argument("--capacity-factor", type=float, default=1.0, help="MoE expert capacity factor")
    p.add_argument("--no-drop-tokens", action="store_true",
                   help="MoE without dropping: each expert's capacity is the busiest expert's token count")
    p.add_argument("--json-out", default=None, help="also write the SUMMARY json to this file (rank 0)")
    p.add_argument("--kernel-profile", default=None, metavar="DIR",
                   help="on a real GPU: record steps 3-4 with torch.profiler and write the in-situ kernel times to DIR "
                        "(rank 0; as presets/workloads/llama.py)")
    add_deepspeed_options(p)
    args = p.parse_args(argv)
    for name in ("micro_batch", "seq", "steps", "pp"):
        if getattr(args, name) <= 0:
            raise UsageError(f"--{name.replace('_', '-')} must be positive")
    check_deepspeed_options(args)
    if args.pp > 1 and args.zero > 1:
        raise UsageError("DeepSpeed's pipeline engine supports ZeRO 0 and 1 only: use --zero 0 or 1 with --pp")
    if args.pp > 1 and args.offload_optimizer != "none":
        raise UsageError("--offload-optimizer is not combined with --pp here")
    if args.kernel_profile and args.steps < KERNEL_PROFILE_STEPS[-1]:
        raise UsageError("--kernel-profile records steps 3-4: it needs --steps 4 or more")
    return args


@dataclasses.dataclass(frozen=True)
class MoEArgs:
    experts: int
    top_k: int
    ep: int
    capacity_factor: float
    drop_tokens: bool


def moe_args(args, path: Path) -> MoEArgs | None:
    """The preset's mixture of experts (None for a dense preset), with the run's options."""
    import tomllib

    data = tomllib.loads(path.read_text())
    if not data.get("num_experts"):
        if args.ep != 1:
            raise UsageError(f"--ep {args.ep}: {path.stem} is a dense model")
        return None
    if data.get("moe_ffn_dim", data["ffn_dim"]) != data["ffn_dim"] or data.get("shared_experts") or \
            data.get("moe_bias") or data.get("head_dim", data["dim"] // data["n_heads"]) != data["dim"] // data["n_heads"]:
        raise UsageError(f"{path.stem}: only Llama-shaped MoE presets (SwiGLU experts, no shared experts or biases, "
                         f"head size dim / heads) are built here")
    return MoEArgs(int(data["num_experts"]), int(data["experts_per_token"]), args.ep, args.capacity_factor,
                   not args.no_drop_tokens)


class MoEFeedForward(nn.Module):
    """DeepSpeed's MoE layer over the preset's SwiGLU experts; keeps the gate's auxiliary loss of the last call."""

    def __init__(self, a: ModelArgs, m: MoEArgs):
        super().__init__()
        from deepspeed.moe.layer import MoE
        from llama import FeedForward
        self.moe = MoE(hidden_size=a.dim, expert=FeedForward(a), num_experts=m.experts, ep_size=m.ep, k=m.top_k,
                       capacity_factor=m.capacity_factor, eval_capacity_factor=m.capacity_factor,
                       drop_tokens=m.drop_tokens, min_capacity=4)
        self.aux = None

    def forward(self, x):
        out, self.aux, _ = self.moe(x)
        return out


class LlamaLM(nn.Module):
    """The Llama of llama.py with the cross-entropy loss inside, and each block optionally checkpointed; with
    `moe`, each block's MLP is DeepSpeed's MoE layer and the gates' auxiliary losses join the loss."""

    def __init__(self, a: ModelArgs, seq: int, checkpoint, moe: MoEArgs | None = None):
        super().__init__()
        # with experts, the dense MLPs are built at a token size and replaced (never held at full size)
        self.model = Transformer(dataclasses.replace(a, ffn_dim=8) if moe else a, seq_len=seq)
        if moe:
            for block in self.model.layers.values():
                block.feed_forward = MoEFeedForward(a, moe)
        self.checkpoint = checkpoint

    def forward(self, tokens, labels):
        m = self.model
        h = m.tok_embeddings(tokens)
        cos, sin = m.rope_cos[:tokens.shape[1]], m.rope_sin[:tokens.shape[1]]
        for layer in m.layers.values():
            h = self.checkpoint(layer, h, cos, sin) if self.checkpoint else layer(h, cos, sin)
        logits = m.output(m.norm(h))
        loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())
        aux = [b.feed_forward.aux for b in m.layers.values() if isinstance(b.feed_forward, MoEFeedForward)]
        return loss + 0.01 * sum(aux) if aux else loss


class EmbedPipe(nn.Module):
    def __init__(self, a: ModelArgs):
        super().__init__()
        self.tok_embeddings = nn.Embedding(a.vocab_size, a.dim)

    def forward(self, tokens):
        return self.tok_embeddings(tokens)


class BlockPipe(nn.Module):
    """One Llama block as a pipeline layer: a single tensor in and out, the RoPE tables its own buffers."""

    def __init__(self, layer_id: int, a: ModelArgs, seq: int):
        super().__init__()
        from llama import TransformerBlock, rope_tables
        self.block = TransformerBlock(layer_id, a)
        cos, sin = rope_tables(a.head_dim, seq, a.rope_theta, device=None)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, h):
        s = h.shape[1]
        return self.block(h, self.rope_cos[:s], self.rope_sin[:s])


class HeadPipe(nn.Module):
    def __init__(self, a: ModelArgs):
        super().__init__()
        self.norm = nn.RMSNorm(a.dim, eps=a.norm_eps)
        self.output = nn.Linear(a.dim, a.vocab_size, bias=False)

    def forward(self, h):
        return self.output(self.norm(h))


def lm_loss(logits, labels):
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())


def build_pipeline(args, a: ModelArgs, device: torch.device):
    """The model as DeepSpeed's PipelineModule: embedding, one layer per block, norm and head; layers split evenly
    over --pp stages; --ac full checkpoints every block (activation_checkpoint_interval 1, blocks only)."""
    from deepspeed.pipe import LayerSpec, PipelineModule

    layers = [LayerSpec(EmbedPipe, a)] + [LayerSpec(BlockPipe, i, a, args.seq) for i in range(a.n_layers)] + \
        [LayerSpec(HeadPipe, a)]
    with torch.device(device):
        return PipelineModule(layers=layers, num_stages=args.pp, loss_fn=lm_loss, partition_method="uniform",
                              activation_checkpoint_interval=1 if args.ac == "full" else 0,
                              checkpointable_layers=["BlockPipe"])


def build_model(args, a: ModelArgs, config: dict, device: torch.device, moe: MoEArgs | None = None) -> LlamaLM:
    import deepspeed

    checkpoint = None
    if args.ac == "full":
        deepspeed.checkpointing.configure(None, deepspeed_config=config)
        checkpoint = deepspeed.checkpointing.checkpoint
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float16
    if args.zero == 3:
        with deepspeed.zero.Init(config_dict_or_path=config, dtype=dtype):
            model = LlamaLM(a, args.seq, checkpoint)
    else:
        with torch.device(device):
            model = LlamaLM(a, args.seq, checkpoint, moe)
    with torch.no_grad():
        model.model.rope_cos, model.model.rope_sin = (
            t.to(device) for t in (model.model.rope_cos, model.model.rope_sin))
    return model


def train(args, a: ModelArgs, rank: int, local_rank: int, world: int) -> None:
    import deepspeed

    torch.cuda.set_device(local_rank)
    deepspeed.init_distributed(dist_backend="nccl")
    torch.manual_seed(args.seed)
    device = torch.device("cuda", local_rank)
    if world % args.pp:
        raise UsageError(f"world size {world} is not divisible by --pp {args.pp}")
    if args.pp > 1 and a.n_layers + 2 < args.pp:
        raise UsageError(f"{a.n_layers} layers and the embedding and head do not fill {args.pp} pipeline stages")
    dp = world // args.pp
    config = ds_config(args, dp)
    moe = moe_args(args, resolve_model_path(args.model))
    if moe is not None:
        if args.pp > 1 or args.zero == 3:
            raise UsageError("DeepSpeed's MoE layer trains with ZeRO 0-2 and without --pp")
        if world % moe.ep or moe.experts % moe.ep:
            raise UsageError(f"--ep {moe.ep} must divide the world ({world}) and the experts ({moe.experts})")
    if args.pp > 1:
        model = build_pipeline(args, a, device)
    else:
        model = build_model(args, a, config, device, moe)
    params = [p for p in model.parameters() if p.requires_grad]
    if moe is not None:
        from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer
        params = split_params_into_different_moe_groups_for_optimizer({"params": params, "name": "params"})
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=params, config=config)

    generator = torch.Generator(device=device)
    generator.manual_seed(args.seed + rank)

    def micro_batches():
        while True:
            tokens = torch.randint(0, a.vocab_size, (args.micro_batch, args.seq + 1), device=device,
                                   generator=generator)
            yield tokens[:, :-1], tokens[:, 1:]

    batches = micro_batches()
    n_params, n_params_no_emb = count_params(a)
    if moe is not None:     # every token runs top_k experts: FLOPs of the active parameters (TorchTitan's MoE rule)
        routers = a.n_layers * a.dim * moe.experts
        n_params = count_params(dataclasses.replace(a, ffn_dim=a.ffn_dim * moe.experts))[0] + routers
        n_params_no_emb = count_params(dataclasses.replace(a, ffn_dim=a.ffn_dim * moe.top_k))[1] + routers
    fpt = flops_per_token(a, args.seq, n_params_no_emb)
    tokens_per_step = args.micro_batch * args.grad_accum * dp * args.seq
    device_name = torch.cuda.get_device_name(device)
    peak = peak_tflops_for(device_name)
    log = rank == 0
    if log:
        print(f"{PROG}: model {a.name} ({n_params:,} parameters, {a.n_layers} layers), world {world} = pp "
              f"{args.pp} x dp {dp}, ZeRO "
              f"{args.zero}, {args.precision}, optimizer {type(engine.optimizer).__name__} over "
              f"{type(getattr(engine.optimizer, 'optimizer', engine.optimizer)).__name__}, micro-batch "
              f"{args.micro_batch} x accumulation {args.grad_accum}, seq {args.seq}, ac {args.ac}, offload "
              f"{args.offload_optimizer}, on {device_name}", flush=True)

    times, losses = [], []
    recorder = None
    for step in range(1, args.steps + 1):
        if args.kernel_profile and log and step == KERNEL_PROFILE_STEPS[0]:
            recorder = start_kernel_profile()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        if args.pp > 1:
            loss = engine.train_batch(data_iter=batches)          # --grad-accum micro-batches through the stages
        else:
            for _ in range(args.grad_accum):
                tokens, labels = next(batches)
                loss = engine(tokens, labels)
                engine.backward(loss)
                engine.step()
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        times.append(dt)
        if recorder is not None and step == KERNEL_PROFILE_STEPS[-1]:
            write_kernel_profile(recorder, Path(args.kernel_profile), times[-len(KERNEL_PROFILE_STEPS):], PROG)
            recorder = None
        loss_value = loss.item()
        losses.append(loss_value)
        if log:
            tps = tokens_per_step / dt / world
            print(lm_step_line(step, loss_value, dt, tps, fpt, peak, torch.cuda.max_memory_allocated(device) / 2**30,
                               engine.get_global_grad_norm()), flush=True)

    if log:
        optimizer = type(getattr(engine.optimizer, "optimizer", engine.optimizer)).__name__
        summary = lm_summary("deepspeed_gpt", a, (n_params, n_params_no_emb), fpt, tokens_per_step, times, losses,
                             world, peak,
                             torch.cuda.max_memory_allocated(device) / 2**30, device_name,
                             {"world_size": world, "pp": args.pp, "dp": dp, "zero": args.zero,
                              "precision": args.precision, "micro_batch": args.micro_batch,
                              "grad_accum": args.grad_accum, "seq": args.seq, "ac": args.ac,
                              "offload_optimizer": args.offload_optimizer, "torch_adam": args.torch_adam,
                              "clip_grad": args.clip_grad, "bucket_mb": args.bucket_mb,
                              "overlap_comm": not args.no_overlap_comm, "steps": args.steps, "optimizer": optimizer,
                              "moe": dataclasses.asdict(moe) if moe else None})
        write_summary(summary, args.json_out)
    torch.distributed.destroy_process_group()


def main(argv=None) -> int:
    def parse():
        args = parse_args(argv)
        return args, load_model_args(args.model, args.layers)

    def start(parsed, world: int, rank: int, local_rank: int) -> None:
        args, a = parsed
        train(args, a, rank, local_rank, world)

    return cuda_main(PROG, parse, start)


if __name__ == "__main__":
    sys.exit(main())
