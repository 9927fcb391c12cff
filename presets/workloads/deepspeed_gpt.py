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
  `--offload-optimizer cpu|nvme`, `--offload-param cpu|nvme` with `--nvme-path`, `--clip-grad`, `--grad-accum`, ZeRO's bucket and prefetch sizes), with
  `--ds-config FILE.json` merged over it;
- `--ac full`: every block through `deepspeed.checkpointing.checkpoint`;
- a mixture-of-experts preset (mixtral-8x7b): every block's MLP is DeepSpeed's MoE layer
  (`deepspeed.moe.layer.MoE` over the preset's SwiGLU experts, its top-k gate, `--ep N` expert parallelism,
  `--capacity-factor`, `--no-drop-tokens`), the gate's auxiliary loss added with weight 0.01 and the optimizer's
  parameter groups split for the experts (`split_params_into_different_moe_groups_for_optimizer`); ZeRO 0-2;
- a gpt-oss preset (gpt-oss-20b): gpt-oss's own blocks (`GptOssLM`): head size from the preset (64 with dim 2880),
  biased q/k/v/o projections, YaRN RoPE, FlexAttention (`torch.compile(flex_attention)`) over a causal block mask or,
  on even-numbered layers, a causal band of `sliding_window` tokens, one learned sink logit per head joined to the
  softmax's denominator through the attention's log-sum-exp, and DeepSpeed's MoE layer over gpt-oss experts (one
  biased gate/up projection, the clamped SwiGLU, a biased down projection) with a biased router;
- `--pp N`: DeepSpeed's PipelineEngine (`PipelineModule` of LayerSpecs: embedding, one layer per block, norm and head,
  split evenly; `engine.train_batch` runs --grad-accum micro-batches through the stages, ZeRO 0/1);
- random tokens; rank 0 prints one line per step and a final `SUMMARY {json}` line (the same keys as
  presets/workloads/llama.py's); `--wall-clock-breakdown` turns on DeepSpeed's own timers.

Bad arguments end the run with one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import tomllib
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

PROG = "deepspeed_gpt"
sys.path.insert(0, str(Path(__file__).resolve().parent))     # workload_common.py, deepspeed_common.py, llama.py
from deepspeed_common import add_deepspeed_options, check_deepspeed_options, ds_config  # noqa: E402
from llama import Transformer, count_params  # noqa: E402
from workload_common import (KERNEL_PROFILE_STEPS, PRESET_FIELDS, ModelArgs, Parser, UsageError,  # noqa: E402
                             cuda_main, flops_per_token, lm_step_line, lm_summary, peak_tflops_for,
                             resolve_model_path, start_kernel_profile, write_kernel_profile, write_summary)
from workload_common import load_model_args as load_llama_args  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = Parser(prog=PROG, description="DeepSpeed Llama / gpt-oss training loop (random data).")
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
                        "(rank 0; as presets/workloads/llama.py), and every other rank's to DIR/rank<N>")
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
    data = tomllib.loads(path.read_text())
    if not data.get("num_experts"):
        if args.ep != 1:
            raise UsageError(f"--ep {args.ep}: {path.stem} is a dense model")
        return None
    if data.get("family") == GPT_OSS:           # gpt-oss's own blocks (GptOssLM), checked by load_gpt_oss_args
        pass
    elif data.get("moe_ffn_dim", data["ffn_dim"]) != data["ffn_dim"] or data.get("shared_experts") or \
            data.get("moe_bias") or data.get("head_dim", data["dim"] // data["n_heads"]) != data["dim"] // data["n_heads"]:
        raise UsageError(f"{path.stem}: only Llama-shaped MoE presets (SwiGLU experts, no shared experts or biases, "
                         f"head size dim / heads) are built here")
    return MoEArgs(int(data["num_experts"]), int(data["experts_per_token"]), args.ep, args.capacity_factor,
                   not args.no_drop_tokens)


class MoEFeedForward(nn.Module):
    """DeepSpeed's MoE layer over the preset's SwiGLU experts (or `expert`, copied for each local expert); keeps the
    gate's auxiliary loss of the last call. `router_bias` gives the gate's router a bias (BiasedTopKGate)."""

    def __init__(self, a: ModelArgs, m: MoEArgs, expert: nn.Module | None = None, router_bias: bool = False):
        super().__init__()
        from deepspeed.moe.layer import MoE
        from llama import FeedForward
        self.moe = MoE(hidden_size=a.dim, expert=expert if expert is not None else FeedForward(a),
                       num_experts=m.experts, ep_size=m.ep, k=m.top_k,
                       capacity_factor=m.capacity_factor, eval_capacity_factor=m.capacity_factor,
                       drop_tokens=m.drop_tokens, min_capacity=4)
        if router_bias:
            self.moe.deepspeed_moe.gate = biased_gate(self.moe.deepspeed_moe.gate)
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
        return decoder_loss(self.model, tokens, labels, self.checkpoint)


def decoder_loss(m: nn.Module, tokens, labels, checkpoint):
    """The loss of a decoder `m` (tok_embeddings, layers, norm, output, rope_cos/rope_sin tables): its blocks
    (each through `checkpoint` if given), the cross-entropy over the whole logits, plus the MoE gates' auxiliary
    losses at weight 0.01."""
    h = m.tok_embeddings(tokens)
    cos, sin = m.rope_cos[:tokens.shape[1]], m.rope_sin[:tokens.shape[1]]
    for layer in m.layers.values():
        h = checkpoint(layer, h, cos, sin) if checkpoint else layer(h, cos, sin)
    loss = F.cross_entropy(m.output(m.norm(h)).flatten(0, 1).float(), labels.flatten())
    aux = [b.feed_forward.aux for b in m.layers.values() if isinstance(b.feed_forward, MoEFeedForward)]
    return loss + 0.01 * sum(aux) if aux else loss


# ------------------------------------------------------------------------------------------------------ gpt-oss
GPT_OSS = "gpt-oss"
# gpt-oss's RoPE scaling (Hugging Face openai/gpt-oss-20b config.json, rope_scaling): YaRN, factor 32 over an initial
# context of 4096, beta_fast 32, beta_slow 1; the model preset does not carry these.
YARN_FACTOR, YARN_INITIAL_CONTEXT, YARN_BETA_FAST, YARN_BETA_SLOW = 32.0, 4096, 32.0, 1.0
# gpt-oss's expert activation (its reference torch/model.py `swiglu`): alpha 1.702, inputs clamped to 7
SWIGLU_ALPHA, SWIGLU_LIMIT = 1.702, 7.0
GPT_OSS_FIELDS = ("head_dim", "num_experts", "experts_per_token", "moe_ffn_dim")


@dataclasses.dataclass(frozen=True)
class GptOssArgs(ModelArgs):
    """The shape of a gpt-oss preset: ModelArgs with a head size of its own (64 with dim 2880, not dim / heads), the
    sliding window of the even-numbered layers, the experts, and which projections carry biases and sinks."""

    head_size: int = 0
    sliding_window: int = 0
    num_experts: int = 0
    experts_per_token: int = 0
    attn_bias: bool = False
    attn_sinks: bool = False
    moe_bias: bool = False

    @property
    def head_dim(self) -> int:
        return self.head_size


def load_model_args(spec: str, layers: int | None = None) -> ModelArgs:
    """The preset's shapes: workload_common's Llama shapes, or GptOssArgs for a gpt-oss preset."""
    path = resolve_model_path(spec)
    if path.is_file():
        try:
            data = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError:
            data = {}                            # load_llama_args reports it
        if data.get("family") == GPT_OSS:
            return load_gpt_oss_args(path, data, layers)
    return load_llama_args(spec, layers)


def load_gpt_oss_args(path: Path, data: dict, layers: int | None) -> GptOssArgs:
    missing = [k for k in PRESET_FIELDS + GPT_OSS_FIELDS if k not in data]
    if missing:
        raise UsageError(f"{path}: missing field(s) {', '.join(missing)}")
    ints = PRESET_FIELDS[:6] + GPT_OSS_FIELDS
    for k in ints:
        if not isinstance(data[k], int) or isinstance(data[k], bool) or data[k] <= 0:
            raise UsageError(f"{path}: {k} must be a positive integer, got {data[k]!r}")
    if layers is not None and layers <= 0:
        raise UsageError(f"--layers must be positive, got {layers}")
    if data["head_dim"] % 2:
        raise UsageError(f"{path}: head size {data['head_dim']} must be even for RoPE")
    if data["n_heads"] % data["n_kv_heads"]:
        raise UsageError(f"{path}: n_heads {data['n_heads']} is not divisible by n_kv_heads {data['n_kv_heads']}")
    if data["moe_ffn_dim"] != data["ffn_dim"]:
        raise UsageError(f"{path}: every gpt-oss layer is an MoE layer: moe_ffn_dim must equal ffn_dim")
    if data.get("shared_experts") or data.get("qk_norm"):
        raise UsageError(f"{path}: shared experts and q/k norms are not part of gpt-oss's blocks")
    if data["experts_per_token"] > data["num_experts"]:
        raise UsageError(f"{path}: experts_per_token ({data['experts_per_token']}) exceeds num_experts "
                         f"({data['num_experts']})")
    if data.get("moe_bias") and data["experts_per_token"] < 3:
        raise UsageError(f"{path}: the biased router is built on DeepSpeed's top-k gate (3 experts per token or more)")
    window = data.get("sliding_window", 0)
    if not isinstance(window, int) or isinstance(window, bool) or window < 0:
        raise UsageError(f"{path}: sliding_window must be a non-negative integer, got {window!r}")
    fields = {k: data[k] for k in PRESET_FIELDS}
    for k in ("rope_theta", "norm_eps"):
        if not isinstance(fields[k], (int, float)) or fields[k] <= 0:
            raise UsageError(f"{path}: {k} must be a positive number, got {fields[k]!r}")
        fields[k] = float(fields[k])
    if layers is not None:
        fields["n_layers"] = layers
    return GptOssArgs(name=str(data.get("name", path.stem)), **fields, head_size=data["head_dim"],
                      sliding_window=window, num_experts=data["num_experts"],
                      experts_per_token=data["experts_per_token"], attn_bias=bool(data.get("attn_bias")),
                      attn_sinks=bool(data.get("attn_sinks")), moe_bias=bool(data.get("moe_bias")))


def yarn_rope_tables(head_dim: int, seq_len: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (seq_len, head_dim / 2) of gpt-oss's YaRN RoPE, scaled by YaRN's concentration (its reference
    RotaryEmbedding: NTK-by-parts interpolation between 1 / (factor * freq) and 1 / freq)."""
    freq = theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    concentration = 0.1 * math.log(YARN_FACTOR) + 1.0
    d_half = head_dim / 2
    low = d_half * math.log(YARN_INITIAL_CONTEXT / (YARN_BETA_FAST * 2 * math.pi)) / math.log(theta)
    high = d_half * math.log(YARN_INITIAL_CONTEXT / (YARN_BETA_SLOW * 2 * math.pi)) / math.log(theta)
    ramp = (torch.arange(d_half, dtype=torch.float32) - low) / (high - low)
    mask = 1 - ramp.clamp(0, 1)
    inv_freq = (1.0 / (YARN_FACTOR * freq)) * (1 - mask) + (1.0 / freq) * mask
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv_freq)
    return angles.cos() * concentration, angles.sin() * concentration


def apply_rope_halves(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (x[i], x[i + head_dim / 2]) of x (batch, seq, heads, head_dim), as gpt-oss does (not interleaved)."""
    x1, x2 = x.float().chunk(2, dim=-1)
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).type_as(x)


_BLOCK_MASKS: dict = {}
_FLEX = []


def flex_attention_fn():
    """flex_attention compiled (its fused kernels on a GPU; eager flex attention is a reference implementation)."""
    if not _FLEX:
        from torch.nn.attention.flex_attention import flex_attention
        _FLEX.append(torch.compile(flex_attention, dynamic=False))
    return _FLEX[0]


def block_mask(seq: int, window: int, device):
    """The causal block mask of `seq` tokens, banded to the last `window` keys when window > 0; one per shape."""
    key = (seq, window, str(device))
    if key not in _BLOCK_MASKS:
        from torch.nn.attention.flex_attention import create_block_mask

        def causal(b, h, q_idx, kv_idx):
            return q_idx >= kv_idx

        def sliding(b, h, q_idx, kv_idx):
            return (q_idx >= kv_idx) & (q_idx - kv_idx < window)

        _BLOCK_MASKS[key] = create_block_mask(sliding if window else causal, None, None, seq, seq, device=device)
    return _BLOCK_MASKS[key]


class GptOssAttention(nn.Module):
    """gpt-oss attention: grouped-query heads of the preset's head size, biased projections, YaRN RoPE, a causal mask
    (banded to `sliding_window` keys on even-numbered layers) and a learned sink logit per head.

    The sink s_h is one more logit in each query's softmax whose value carries nothing: the output is
    sum_j exp(x_j) v_j / (sum_j exp(x_j) + exp(s_h)) = O * sigmoid(lse - s_h), with O and lse = log sum_j exp(x_j)
    FlexAttention's output and log-sum-exp (gradients flow through both), as TorchTitan's gpt-oss applies it."""

    def __init__(self, layer_id: int, a: GptOssArgs):
        super().__init__()
        self.head_dim = a.head_dim
        self.gqa = a.n_kv_heads != a.n_heads
        self.window = a.sliding_window if layer_id % 2 == 0 else 0
        self.wq = nn.Linear(a.dim, a.n_heads * a.head_dim, bias=a.attn_bias)
        self.wk = nn.Linear(a.dim, a.n_kv_heads * a.head_dim, bias=a.attn_bias)
        self.wv = nn.Linear(a.dim, a.n_kv_heads * a.head_dim, bias=a.attn_bias)
        self.wo = nn.Linear(a.n_heads * a.head_dim, a.dim, bias=a.attn_bias)
        self.sinks = nn.Parameter(torch.zeros(a.n_heads)) if a.attn_sinks else None

    def forward(self, x, cos, sin):
        from torch.nn.attention.flex_attention import AuxRequest
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, -1, self.head_dim)
        k = self.wk(x).view(b, s, -1, self.head_dim)
        v = self.wv(x).view(b, s, -1, self.head_dim)
        q, k = apply_rope_halves(q, cos, sin), apply_rope_halves(k, cos, sin)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        mask = block_mask(s, self.window, x.device)
        if self.sinks is None:
            out = flex_attention_fn()(q, k, v, block_mask=mask, scale=self.head_dim ** -0.5, enable_gqa=self.gqa)
        else:
            out, aux = flex_attention_fn()(q, k, v, block_mask=mask, scale=self.head_dim ** -0.5,
                                           enable_gqa=self.gqa, return_aux=AuxRequest(lse=True))
            scale = torch.sigmoid(aux.lse - self.sinks.float().view(1, -1, 1))
            out = out * scale.unsqueeze(-1).to(out.dtype)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class GptOssExpert(nn.Module):
    """One gpt-oss expert: a biased projection to the interleaved gate and up halves (2 x moe_ffn_dim), the clamped
    SwiGLU gate * sigmoid(1.702 gate) * (up + 1), and a biased projection back."""

    def __init__(self, a: GptOssArgs):
        super().__init__()
        self.mlp1 = nn.Linear(a.dim, 2 * a.ffn_dim, bias=a.moe_bias)
        self.mlp2 = nn.Linear(a.ffn_dim, a.dim, bias=a.moe_bias)

    def forward(self, x):
        h = self.mlp1(x)
        gate = h[..., ::2].clamp(max=SWIGLU_LIMIT)
        up = h[..., 1::2].clamp(min=-SWIGLU_LIMIT, max=SWIGLU_LIMIT)
        return self.mlp2(gate * torch.sigmoid(SWIGLU_ALPHA * gate) * (up + 1))


def biased_gate(gate: nn.Module) -> nn.Module:
    """DeepSpeed's top-k gate (k >= 3) with a biased router, as gpt-oss's: DeepSpeed's `topkgating` of the logits
    W x + b (a softmax over the experts, the top k, their weights renormalised over the k: gpt-oss's softmax over the
    top-k logits), with its capacity, token dropping and auxiliary loss."""
    from deepspeed.moe.sharded_moe import TopKGate, topkgating

    class BiasedTopKGate(TopKGate):
        def forward(self, input, used_token=None, sparse_routes=False, use_tutel=False):
            logits = F.linear(input.float(), self.wg.weight.float(), self.wg.bias.float())
            capacity_factor = self.capacity_factor if self.training else self.eval_capacity_factor
            return topkgating(logits, self.k, capacity_factor, self.min_capacity, self.drop_tokens, self.ep_group,
                              sparse_routes=sparse_routes)

    new = BiasedTopKGate(gate.wg.in_features, gate.wg.out_features, k=gate.k, capacity_factor=gate.capacity_factor,
                         eval_capacity_factor=gate.eval_capacity_factor, min_capacity=gate.min_capacity,
                         drop_tokens=gate.drop_tokens)
    new.wg = nn.Linear(gate.wg.in_features, gate.wg.out_features, bias=True)
    return new


class GptOssBlock(nn.Module):
    def __init__(self, layer_id: int, a: GptOssArgs, moe: MoEArgs):
        super().__init__()
        self.attention_norm = nn.RMSNorm(a.dim, eps=a.norm_eps)
        self.attention = GptOssAttention(layer_id, a)
        self.ffn_norm = nn.RMSNorm(a.dim, eps=a.norm_eps)
        self.feed_forward = MoEFeedForward(a, moe, expert=GptOssExpert(a), router_bias=a.moe_bias)

    def forward(self, x, cos, sin):
        h = x + self.attention(self.attention_norm(x), cos, sin)
        return h + self.feed_forward(self.ffn_norm(h))


class GptOssLM(nn.Module):
    """gpt-oss: embedding, GptOssBlocks (each optionally checkpointed), RMSNorm, an untied head; the cross-entropy
    loss plus the gates' auxiliary losses at weight 0.01, as LlamaLM."""

    def __init__(self, a: GptOssArgs, seq: int, checkpoint, moe: MoEArgs):
        super().__init__()
        self.tok_embeddings = nn.Embedding(a.vocab_size, a.dim)
        self.layers = nn.ModuleDict({str(i): GptOssBlock(i, a, moe) for i in range(a.n_layers)})
        self.norm = nn.RMSNorm(a.dim, eps=a.norm_eps)
        self.output = nn.Linear(a.dim, a.vocab_size, bias=False)
        cos, sin = yarn_rope_tables(a.head_dim, seq, a.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.checkpoint = checkpoint

    def forward(self, tokens, labels):
        return decoder_loss(self, tokens, labels, self.checkpoint)


def gpt_oss_params(model: GptOssLM, a: GptOssArgs, moe: MoEArgs) -> tuple[int, int]:
    """(all parameters, active parameters without the input embedding) of the whole gpt-oss model, counted on the
    modules built: the rank's shared parameters plus its experts' (num_experts / ep of each layer's) times ep; a
    token runs experts_per_token experts of each layer."""
    from deepspeed.moe.utils import is_moe_param
    params = list(model.parameters())
    expert = sum(p.numel() for p in params if is_moe_param(p))
    shared = sum(p.numel() for p in params if not is_moe_param(p))
    total = shared + expert * moe.ep
    per_expert = expert // (a.n_layers * (moe.experts // moe.ep))
    active = total - a.n_layers * (moe.experts - moe.top_k) * per_expert
    return total, active - model.tok_embeddings.weight.numel()


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


def build_model(args, a: ModelArgs, config: dict, device: torch.device,
                moe: MoEArgs | None = None) -> LlamaLM | GptOssLM:
    import deepspeed

    checkpoint = None
    if args.ac == "full":
        deepspeed.checkpointing.configure(None, deepspeed_config=config)
        checkpoint = deepspeed.checkpointing.checkpoint
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float16
    if isinstance(a, GptOssArgs):
        with torch.device(device):
            model = GptOssLM(a, args.seq, checkpoint, moe)
        with torch.no_grad():
            model.rope_cos, model.rope_sin = (t.to(device) for t in (model.rope_cos, model.rope_sin))
        return model
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
    if isinstance(a, GptOssArgs):
        n_params, n_params_no_emb = gpt_oss_params(model, a, moe)
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
    if isinstance(a, GptOssArgs):
        pass                # counted on the modules built, above
    elif moe is None:
        n_params, n_params_no_emb = count_params(a)
    else:                   # every token runs top_k experts: FLOPs of the active parameters (TorchTitan's MoE rule)
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
              f"{args.offload_optimizer} (parameters {args.offload_param}), on {device_name}", flush=True)

    times, losses = [], []
    recorder = None
    for step in range(1, args.steps + 1):
        if args.kernel_profile and step == KERNEL_PROFILE_STEPS[0]:
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
            out = Path(args.kernel_profile) if rank == 0 else Path(args.kernel_profile) / f"rank{rank}"
            write_kernel_profile(recorder, out, times[-len(KERNEL_PROFILE_STEPS):], PROG)
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
                              "offload_optimizer": args.offload_optimizer, "offload_param": args.offload_param,
                              "torch_adam": args.torch_adam, "quantized_weights": args.quantized_weights,
                              "quantized_gradients": args.quantized_gradients, "hpz": args.hpz,
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
