#!/usr/bin/env python
"""Phantora's reference workload: a plain-PyTorch Llama 3 trainer, launched like any torchrun script.

    torchrun --nproc-per-node 8 presets/workloads/llama.py --model llama3-8b --dp-mode fsdp --ac selective
    phantora run --gpus-per-node 8 -- python presets/workloads/llama.py --model llama3-8b ...

It imports nothing from Phantora: the same file measures ground truth on real GPUs under torchrun and is simulated under
`phantora run`. What it is:

- the model: Llama 3 blocks (RMSNorm, RoPE, grouped-query attention through
  `F.scaled_dot_product_attention(is_causal=True, enable_gqa=...)`, SwiGLU), an untied output head; shapes from a model
  preset TOML of presets/models/ (`--model llama3-8b` or `--model FILE.toml`; `--layers N` overrides n_layers);
- built on the meta device, parallelised, then `to_empty()` on the device and initialised as TorchTitan does, so that
  8B/70B shapes never exist unsharded;
- parallelism on a DeviceMesh with dims (pp, dp, tp): `--tp N` tensor parallel (`parallelize_module`, Colwise/Rowwise
  plan, loss parallel), `--pp N` pipeline parallel (`PipelineStage` + `Schedule1F1B`, layers split evenly),
  `--dp-mode ddp|fsdp` over the remaining `WORLD_SIZE / (tp × pp)` ranks (DDP, or FSDP2 `fully_shard` per block plus
  the root); `--ac none|full|selective` activation checkpointing (selective: every other block); `--compile`
  compiles each block with `torch.compile(fullgraph=True)`; `--float8 tensorwise|rowwise` trains the blocks' linear
  layers in Float8 (torchao);
- random tokens drawn on the device (`torch.randint` with a generator seeded by the data-parallel rank), cross-entropy,
  AdamW (foreach), and TorchTitan-style logging on rank 0 plus a final `SUMMARY {json}` line.

See presets/workloads/README.md and docs/workloads.md for the options, the dtype rules and the MFU definition.
Bad arguments end the run with one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

PROG = "llama.py"
sys.path.insert(0, str(Path(__file__).resolve().parent))     # workload_common.py, however this file is loaded
from workload_common import (KERNEL_PROFILE_STEPS, ModelArgs, Parser, UsageError, default_env,  # noqa: E402
                             env_int, flops_per_token, load_model_args, peak_tflops_for, settle_threads,
                             start_kernel_profile, write_kernel_profile)


# Weights of pipeline stage p use seed WEIGHT_SEED_STRIDE × --seed + p; the data of data-parallel rank d use
# DATA_SEED_BASE + WEIGHT_SEED_STRIDE × --seed + d: no two streams share a seed.
WEIGHT_SEED_STRIDE = 1000
DATA_SEED_BASE = 1 << 40


# ------------------------------------------------------------------------------------------------------ model shapes
# ---------------------------------------------------------------------------------------------------------- model
def rope_tables(head_dim: int, seq_len: int, theta: float, device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the RoPE angles, each (seq_len, head_dim / 2), fp32 (Llama: theta^(-2i/d) per pair i)."""
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), freqs)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the interleaved pairs (x[2i], x[2i+1]) of x (batch, seq, heads, head_dim), as Llama's complex form does."""
    b, s, h, d = x.shape
    xf = x.float().view(b, s, h, d // 2, 2)
    x0, x1 = xf[..., 0], xf[..., 1]
    c, sn = cos.view(1, s, 1, d // 2), sin.view(1, s, 1, d // 2)
    out = torch.stack((x0 * c - x1 * sn, x0 * sn + x1 * c), dim=-1)
    return out.flatten(3).type_as(x)


class Attention(nn.Module):
    """Grouped-query self-attention with RoPE. Head counts come from the projections' (possibly TP-sharded) widths."""

    def __init__(self, a: ModelArgs):
        super().__init__()
        self.head_dim = a.head_dim
        self.gqa = a.n_kv_heads != a.n_heads
        self.wq = nn.Linear(a.dim, a.n_heads * a.head_dim, bias=False)
        self.wk = nn.Linear(a.dim, a.n_kv_heads * a.head_dim, bias=False)
        self.wv = nn.Linear(a.dim, a.n_kv_heads * a.head_dim, bias=False)
        self.wo = nn.Linear(a.n_heads * a.head_dim, a.dim, bias=False)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, -1, self.head_dim)
        k = self.wk(x).view(b, s, -1, self.head_dim)
        v = self.wv(x).view(b, s, -1, self.head_dim)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.gqa)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, a: ModelArgs):
        super().__init__()
        self.w1 = nn.Linear(a.dim, a.ffn_dim, bias=False)
        self.w2 = nn.Linear(a.ffn_dim, a.dim, bias=False)
        self.w3 = nn.Linear(a.dim, a.ffn_dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then + ffn(norm(.))."""

    def __init__(self, layer_id: int, a: ModelArgs):
        super().__init__()
        self.layer_id = layer_id
        self.attention_norm = nn.RMSNorm(a.dim, eps=a.norm_eps)
        self.attention = Attention(a)
        self.ffn_norm = nn.RMSNorm(a.dim, eps=a.norm_eps)
        self.feed_forward = FeedForward(a)

    def forward(self, x, cos, sin):
        h = x + self.attention(self.attention_norm(x), cos, sin)
        return h + self.feed_forward(self.ffn_norm(h))

    @torch.no_grad()
    def init_weights(self):
        """TorchTitan's llama3 init: std 0.02, and 0.02 / sqrt(2 (layer_id + 1)) for wo, w2, w3 (depth init)."""
        depth_std = 0.02 / (2 * (self.layer_id + 1)) ** 0.5
        for norm in (self.attention_norm, self.ffn_norm):
            norm.reset_parameters()
        for lin in (self.attention.wq, self.attention.wk, self.attention.wv, self.feed_forward.w1):
            nn.init.trunc_normal_(lin.weight, mean=0.0, std=0.02)
        for lin in (self.attention.wo, self.feed_forward.w2, self.feed_forward.w3):
            nn.init.trunc_normal_(lin.weight, mean=0.0, std=depth_std)


class Transformer(nn.Module):
    """Llama 3 decoder. A pipeline stage is this module with the embedding, some layers, or the head set to None."""

    def __init__(self, a: ModelArgs, seq_len: int):
        super().__init__()
        self.args = a
        self.seq_len = seq_len
        self.tok_embeddings = nn.Embedding(a.vocab_size, a.dim)
        # A dict keyed by the global layer index keeps parameter names stable when a pipeline stage drops layers.
        self.layers = nn.ModuleDict({str(i): TransformerBlock(i, a) for i in range(a.n_layers)})
        self.norm = nn.RMSNorm(a.dim, eps=a.norm_eps)
        self.output = nn.Linear(a.dim, a.vocab_size, bias=False)
        cos, sin = rope_tables(a.head_dim, seq_len, a.rope_theta, device=None)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        s = h.shape[1]
        cos, sin = self.rope_cos[:s], self.rope_sin[:s]
        for layer in self.layers.values():
            h = layer(h, cos, sin)
        if self.norm is not None:
            h = self.norm(h)
        return self.output(h) if self.output is not None else h

    @torch.no_grad()
    def init_weights(self):
        """Weights as TorchTitan initialises Llama 3; the RoPE tables recomputed in fp32 on the module's device."""
        device = self.rope_cos.device
        self.rope_cos, self.rope_sin = rope_tables(self.args.head_dim, self.seq_len, self.args.rope_theta, device)
        if self.tok_embeddings is not None:
            nn.init.normal_(self.tok_embeddings.weight)
        for m in self.modules():
            if isinstance(m, TransformerBlock):
                m.init_weights()
        if self.norm is not None:
            self.norm.reset_parameters()
        if self.output is not None:
            std = self.args.dim ** -0.5
            nn.init.trunc_normal_(self.output.weight, mean=0.0, std=std, a=-3 * std, b=3 * std)


def count_params(a: ModelArgs) -> tuple[int, int]:
    """(all parameters, parameters without the input embedding) of the full model, counted on the meta device."""
    with torch.device("meta"):
        model = Transformer(a, seq_len=1)
    total = sum(p.numel() for p in model.parameters())
    return total, total - model.tok_embeddings.weight.numel()


# ----------------------------------------------------------------------------------------------------- arguments
def parse_args(argv=None) -> argparse.Namespace:
    p = Parser(prog=PROG, description="Llama 3 trainer (DDP / FSDP2 / TP / PP 1F1B, activation checkpointing).")
    p.add_argument("--model", default="llama3-8b", help="preset name in presets/models/ or a path to a .toml")
    p.add_argument("--layers", type=int, default=None, help="override n_layers of the preset")
    p.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16", help="compute dtype (default bf16)")
    p.add_argument("--dp-mode", choices=("ddp", "fsdp"), default="fsdp", help="data parallelism over the rest")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel degree")
    p.add_argument("--pp", type=int, default=1, help="pipeline-parallel degree (Schedule1F1B)")
    p.add_argument("--microbatches", type=int, default=None, help="pipeline microbatches per step (default: pp)")
    p.add_argument("--ac", choices=("none", "full", "selective"), default="none",
                   help="activation checkpointing: every block (full) or every other block (selective)")
    p.add_argument("--batch", type=int, default=1, help="batch per data-parallel rank (split into microbatches by PP)")
    p.add_argument("--seq", type=int, default=2048, help="sequence length")
    p.add_argument("--steps", type=int, default=10, help="training steps")
    p.add_argument("--lr", type=float, default=3e-4, help="AdamW learning rate")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights and of the data")
    p.add_argument("--fixed-batch", action="store_true", help="train on the same batch every step")
    p.add_argument("--device", choices=("cuda", "cpu"), default=None,
                   help="default: cuda when torch.cuda.is_available(), else cpu")
    p.add_argument("--peak-tflops", type=float, default=None,
                   help="peak TFLOP/s per GPU for MFU (default: from the device name for H100/H200/A100)")
    p.add_argument("--shard-one-rank", action="store_true",
                   help="apply FSDP2 even with one data-parallel rank (its all-gather and reduce-scatter streams "
                        "then run: for allocator measurements on one GPU)")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile each block (fullgraph, after activation checkpointing and before FSDP, as "
                        "TorchTitan does)")
    p.add_argument("--float8", choices=("tensorwise", "rowwise"), default=None,
                   help="Float8 training of the blocks' linear layers (torchao's convert_to_float8_training with "
                        "this recipe; the output head stays bf16, as TorchTitan filters it)")
    p.add_argument("--json-out", default=None, help="also write the SUMMARY json to this file (rank 0)")
    p.add_argument("--kernel-profile", default=None, metavar="DIR",
                   help="on CUDA, record steps 3-4 with torch.profiler and write the in-situ GPU time of every op "
                        "(DIR/ops.json), kernel (DIR/kernels.json) and the kernel timeline (DIR/timeline.json) "
                        "of rank 0")
    p.add_argument("--describe", action="store_true",
                   help="print the model's parameter count and FLOPs per token as json and exit (no training)")
    args = p.parse_args(argv)
    if args.kernel_profile is not None and args.steps < 4:
        raise UsageError("--kernel-profile records steps 3-4: it needs --steps 4 or more")
    for name in ("tp", "pp", "batch", "seq", "steps"):
        if getattr(args, name) <= 0:
            raise UsageError(f"--{name} must be positive, got {getattr(args, name)}")
    if args.microbatches is not None and args.microbatches <= 0:
        raise UsageError(f"--microbatches must be positive, got {args.microbatches}")
    if args.peak_tflops is not None and args.peak_tflops <= 0:
        raise UsageError(f"--peak-tflops must be positive, got {args.peak_tflops}")
    if args.lr <= 0:
        raise UsageError(f"--lr must be positive, got {args.lr}")
    return args


@dataclass(frozen=True)
class Layout:
    """World size and the (pp, dp, tp) degrees; dp is what is left after tp and pp."""

    world: int
    pp: int
    dp: int
    tp: int
    microbatches: int


def plan_layout(args: argparse.Namespace, a: ModelArgs, world: int) -> Layout:
    """Check the parallelism options against WORLD_SIZE and the model's shapes."""
    if world % (args.tp * args.pp):
        raise UsageError(f"WORLD_SIZE {world} is not divisible by tp × pp = {args.tp} × {args.pp}; "
                         f"the data-parallel degree must be a whole number")
    dp = world // (args.tp * args.pp)
    if args.tp > 1:
        for field, value in (("n_heads", a.n_heads), ("n_kv_heads", a.n_kv_heads), ("ffn_dim", a.ffn_dim),
                             ("vocab_size", a.vocab_size)):
            if value % args.tp:
                raise UsageError(f"{field} {value} of model '{a.name}' is not divisible by --tp {args.tp}")
        if args.dp_mode == "ddp" and dp > 1:
            raise UsageError("--dp-mode ddp cannot be combined with --tp > 1 (DDP does not take the DTensor "
                             "parameters of TP); use --dp-mode fsdp")
    m = 1
    if args.pp > 1:
        if a.n_layers % args.pp:
            raise UsageError(f"{a.n_layers} layers cannot be split evenly over --pp {args.pp} stages")
        m = args.microbatches if args.microbatches is not None else args.pp
        if m < args.pp:
            raise UsageError(f"Schedule1F1B needs --microbatches >= --pp ({m} < {args.pp})")
        if args.batch % m:
            raise UsageError(f"--batch {args.batch} is not divisible by --microbatches {m}")
    elif args.microbatches not in (None, 1):
        raise UsageError("--microbatches needs --pp > 1")
    return Layout(world=world, pp=args.pp, dp=dp, tp=args.tp, microbatches=m)


# ------------------------------------------------------------------------------------------------- parallelism
def split_stage(model: Transformer, stage: int, n_stages: int) -> Transformer:
    """Keep the layers of pipeline stage `stage` (an even split); the embedding on the first, norm and head on the last."""
    per = model.args.n_layers // n_stages
    keep = {str(i) for i in range(stage * per, (stage + 1) * per)}
    for name in list(model.layers.keys()):
        if name not in keep:
            del model.layers[name]
    if stage != 0:
        model.tok_embeddings = None
    if stage != n_stages - 1:
        model.norm = None
        model.output = None
    return model


def apply_tp(model: Transformer, tp_mesh) -> None:
    """The Llama TP plan (Megatron style, no sequence parallelism): q/k/v and w1/w3 column-wise, wo and w2 row-wise,
    the embedding row-wise (vocabulary-sharded), the head column-wise with its logits left vocabulary-sharded for
    loss parallelism. Each block's attention and FFN end in one all-reduce forward and one backward."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    top = {}
    if model.tok_embeddings is not None:
        top["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate())
    if model.output is not None:
        top["output"] = ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)
    if top:
        parallelize_module(model, tp_mesh, top)
    block_plan = {
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(),
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w3": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(),
    }
    for block in model.layers.values():
        parallelize_module(block, tp_mesh, block_plan)


def apply_ac(model: Transformer, mode: str) -> None:
    """Wrap blocks in non-reentrant activation checkpointing: every block (full) or every other one (selective)."""
    if mode == "none":
        return
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    for i, (name, block) in enumerate(list(model.layers.items())):
        if mode == "full" or i % 2 == 0:
            model.layers[name] = checkpoint_wrapper(block, preserve_rng_state=False)


def apply_fsdp(model: Transformer, dp_mesh, param_dtype: torch.dtype, reshard_blocks: bool) -> None:
    """FSDP2: fully_shard each block, then the root (embedding, norm, head). fp32 sharded parameters, compute in
    `param_dtype`, gradients reduce-scattered in fp32 (TorchTitan's MixedPrecisionPolicy)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    for block in model.layers.values():
        fully_shard(block, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=reshard_blocks)
    fully_shard(model, mesh=dp_mesh, mp_policy=mp)


# ---------------------------------------------------------------------------------------------------- metrics
def step_line(step: int, loss: float, t: float, tps: float, mfu: float | None, mem: float | None) -> str:
    line = f"step {step} loss {loss:.4f} time_s {t:.4f} tps_per_gpu {tps:.1f}"
    if mfu is not None:
        line += f" mfu {mfu:.2f}%"
    if mem is not None:
        line += f" mem_gib {mem:.2f}"
    return line


# ------------------------------------------------------------------------------------------------------ main
def describe(args, a: ModelArgs) -> None:
    total, no_emb = count_params(a)
    print(json.dumps({"model": a.name, "shapes": asdict(a), "params": total, "params_without_embedding": no_emb,
                      "seq": args.seq, "flops_per_token": flops_per_token(a, args.seq, no_emb)}))


def train(args, a: ModelArgs, layout: Layout, rank: int, local_rank: int) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    device_type = args.device
    if device_type == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if device_type == "cuda" else "gloo")
    mesh = init_device_mesh(device_type, (layout.pp, layout.dp, layout.tp), mesh_dim_names=("pp", "dp", "tp"))
    pp_rank, dp_rank = mesh["pp"].get_local_rank(), mesh["dp"].get_local_rank()
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    use_fsdp = args.dp_mode == "fsdp" and (layout.dp > 1 or args.shard_one_rank)
    use_ddp = args.dp_mode == "ddp" and layout.dp > 1

    n_params, n_params_no_emb = count_params(a)
    fpt = flops_per_token(a, args.seq, n_params_no_emb)

    # Build on meta, split, parallelise, then materialise and initialise.
    # Each pipeline stage draws its weights from its own seed: stages seeded alike would draw their layers from
    # the same random stream as the first stage's embedding, and correlated weights start far from ln(vocab).
    torch.manual_seed(WEIGHT_SEED_STRIDE * args.seed + pp_rank)
    with torch.device("meta"):
        model = Transformer(a, args.seq)
    if layout.pp > 1:
        model = split_stage(model, pp_rank, layout.pp)
    if not use_fsdp:
        model = model.to(dtype)  # FSDP keeps fp32 parameters and casts for compute (mixed precision)
    if layout.tp > 1:
        apply_tp(model, mesh["tp"])
    if args.float8:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        convert_to_float8_training(model.layers, config=Float8LinearConfig.from_recipe_name(args.float8))
    apply_ac(model, args.ac)
    if args.compile:
        for block in model.layers.values():
            block.compile(fullgraph=True)
    if use_fsdp:
        apply_fsdp(model, mesh["dp"], dtype, reshard_blocks=layout.pp == 1)
    model.to_empty(device=device)
    model.init_weights()
    model.train()
    stage_module = model
    if use_ddp:
        from torch.nn.parallel import DistributedDataParallel as DDP

        stage_module = DDP(model, process_group=mesh["dp"].get_group(),
                           device_ids=[local_rank] if device_type == "cuda" else None,
                           # PP runs one backward per microbatch (no_sync but the last); a static graph keeps the
                           # reducer's first-iteration bucket rebuild from counting each parameter once per microbatch
                           static_graph=layout.pp > 1, **_ddp_no_buffer_sync())

    # foreach kernels cannot mix DTensor and plain tensors: under TP the replicated norms get a group of their own.
    from torch.distributed.tensor import DTensor

    params = list(model.parameters())
    groups = [{"params": g} for g in ([p for p in params if isinstance(p, DTensor)],
                                      [p for p in params if not isinstance(p, DTensor)]) if g]
    optimizer = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                                  foreach=True, fused=False)

    loss_ctx = _loss_parallel if layout.tp > 1 else _nullcontext

    def loss_fn(logits, labels):
        return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())

    schedule = None
    first_stage = pp_rank == 0
    last_stage = pp_rank == layout.pp - 1
    if layout.pp > 1:
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B

        stage = PipelineStage(stage_module, pp_rank, layout.pp, device, group=mesh["pp"].get_group())
        schedule = Schedule1F1B(stage, n_microbatches=layout.microbatches, loss_fn=loss_fn)

    gen = torch.Generator(device=device)
    gen.manual_seed(DATA_SEED_BASE + WEIGHT_SEED_STRIDE * args.seed + dp_rank)

    def next_batch():
        tokens = torch.randint(0, a.vocab_size, (args.batch, args.seq + 1), device=device, generator=gen)
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    batch = next_batch() if args.fixed_batch else None
    on_cuda = device_type == "cuda"
    device_name = torch.cuda.get_device_name(device) if on_cuda else None
    peak = args.peak_tflops if args.peak_tflops is not None else peak_tflops_for(device_name)
    global_tokens = layout.dp * args.batch * args.seq
    log = rank == 0
    if log:
        print(f"{PROG}: model {a.name} ({n_params:,} parameters, {a.n_layers} layers), world {layout.world} = "
              f"pp {layout.pp} × dp {layout.dp} ({args.dp_mode}) × tp {layout.tp}, ac {args.ac}, dtype {args.dtype}, "
              f"batch {args.batch} × seq {args.seq}, device {device_name or device_type}", flush=True)

    pp_group = mesh["pp"].get_group() if layout.pp > 1 else None
    times, losses, mems = [], [], []
    recorder = None
    for step in range(1, args.steps + 1):
        inputs, labels = batch if batch is not None else next_batch()
        if on_cuda:
            torch.cuda.synchronize()
            if args.kernel_profile and log and recorder is None and step == KERNEL_PROFILE_STEPS[0]:
                recorder = start_kernel_profile()
            if hasattr(torch.cuda, "reset_peak_memory_stats"):
                torch.cuda.reset_peak_memory_stats(device)
        t0 = time.perf_counter()
        with loss_ctx():
            if schedule is None:
                loss = loss_fn(stage_module(inputs), labels)
                loss.backward()
            else:
                mb_losses: list = []
                if first_stage:
                    schedule.step(inputs, target=labels if last_stage else None, losses=mb_losses)
                elif last_stage:
                    schedule.step(target=labels, losses=mb_losses)
                else:
                    schedule.step()
                loss = torch.stack([_local(x) for x in mb_losses]).mean() if last_stage else None
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if on_cuda:
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        if recorder is not None and step == KERNEL_PROFILE_STEPS[-1]:
            n = len(KERNEL_PROFILE_STEPS)
            write_kernel_profile(recorder, Path(args.kernel_profile), times[len(times) - n + 1:] + [dt], PROG)
            recorder = None

        # The loss for the log: the last stage owns it under PP and sends it to its pipeline group.
        if pp_group is not None:
            value = (loss.detach().float().reshape(1) if last_stage else torch.zeros(1, device=device))
            dist.broadcast(value, group=pp_group, group_src=layout.pp - 1)
            loss_value = value.item()
        else:
            loss_value = _local(loss).item()
        mem = torch.cuda.max_memory_allocated(device) / 2**30 if on_cuda else None
        times.append(dt)
        losses.append(loss_value)
        mems.append(mem)
        if log:
            tps = global_tokens / dt / layout.world
            mfu = 100.0 * tps * fpt / (peak * 1e12) if peak else None
            print(step_line(step, loss_value, dt, tps, mfu, mem), flush=True)

    if log:
        timed = times[1:] if len(times) > 1 else times
        median = statistics.median(timed)
        tps = global_tokens / median / layout.world
        summary = {
            "workload": "llama",
            "model": a.name,
            "shapes": asdict(a),
            "params": n_params,
            "params_without_embedding": n_params_no_emb,
            "flops_per_token": fpt,
            "global_tokens_per_step": global_tokens,
            "step_times_s": times,
            "losses": losses,
            "median_step_s": median,
            "tps_per_gpu": tps,
            "peak_tflops": peak,
            "mfu_pct": 100.0 * tps * fpt / (peak * 1e12) if peak else None,
            "peak_mem_gib": max(mems) if on_cuda else None,
            "device_name": device_name,
            "config": {
                "world_size": layout.world, "pp": layout.pp, "dp": layout.dp, "tp": layout.tp,
                "dp_mode": args.dp_mode, "microbatches": layout.microbatches, "ac": args.ac, "dtype": args.dtype,
                "batch": args.batch, "seq": args.seq, "steps": args.steps, "lr": args.lr, "seed": args.seed,
                "fixed_batch": args.fixed_batch, "device": device_type, "fsdp_applied": use_fsdp,
                "ddp_applied": use_ddp, "compile": args.compile, "float8": args.float8,
            },
        }
        text = json.dumps(summary)
        print(f"SUMMARY {text}", flush=True)
        if args.json_out:
            Path(args.json_out).write_text(text + "\n")
    dist.destroy_process_group()


def _ddp_no_buffer_sync() -> dict:
    """DDP keyword that stops the per-forward broadcast of buffers (the RoPE tables, equal on every rank)."""
    import inspect

    from torch.nn.parallel import DistributedDataParallel as DDP

    if "forward_sync_buffers" in inspect.signature(DDP.__init__).parameters:
        return {"forward_sync_buffers": False}
    return {"broadcast_buffers": False}


def _local(t):
    """A DTensor's full value (loss parallel returns a replicated DTensor); a plain tensor as it is."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def _loss_parallel():
    from torch.distributed.tensor.parallel import loss_parallel

    return loss_parallel()


def _nullcontext():
    from contextlib import nullcontext

    return nullcontext()


def main(argv=None) -> int:
    try:
        args = parse_args(argv)
        a = load_model_args(args.model, args.layers)
        if args.describe:
            describe(args, a)
            return 0
        if args.device is None:
            args.device = "cuda" if torch.cuda.is_available() else "cpu"
        elif args.device == "cuda" and not torch.cuda.is_available():
            raise UsageError("--device cuda but torch.cuda.is_available() is False; use --device cpu")
        default_env()
        world, rank, local_rank = env_int("WORLD_SIZE"), env_int("RANK"), env_int("LOCAL_RANK")
        layout = plan_layout(args, a, world)
    except UsageError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr, flush=True)
        return 2
    train(args, a, layout, rank, local_rank)
    settle_threads()
    return 0


if __name__ == "__main__":
    sys.exit(main())
