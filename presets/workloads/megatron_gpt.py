#!/usr/bin/env python
"""A Megatron-core GPT/Llama trainer in the style of Megatron-LM's `examples/run_simple_mcore_train_loop.py`.

    torchrun --nproc-per-node 2 presets/workloads/megatron_gpt.py --model llama3.2-1b --tp 2
    phantora run --gpus-per-node 8 -- python presets/workloads/megatron_gpt.py --model llama3-8b --tp 2 --pp 2

It imports nothing from Phantora: the same file measures ground truth on real GPUs under torchrun and is simulated
under `phantora run`. What it does, with Megatron-core's own pieces only:

- `parallel_state.initialize_model_parallel(tp, pp, vpp)` and `model_parallel_cuda_manual_seed`;
- `GPTModel` with a Llama shape from a model preset TOML (RMSNorm, SwiGLU, RoPE, grouped-query attention, untied
  output head), built with `get_gpt_layer_local_spec()` (`--spec local`, Megatron-core's own modules) or
  `get_gpt_layer_with_transformer_engine_spec()` (`--spec te`, needs Transformer Engine: under `phantora run`,
  `--transformer-engine 2.9`);
- bf16 through `Float16Module`, Megatron's `DistributedDataParallel` (`--overlap-grad-reduce`,
  `--overlap-param-gather`) or, with `--torch-fsdp2`, its `TorchFullyShardedDataParallel` (PyTorch's FSDP2, as
  Megatron-LM's `--use-torch-fsdp2` wires it), and `get_megatron_optimizer` (Adam, `--distributed-optimizer`,
  `--clip-grad`);
- `get_forward_backward_func()`: no pipelining, 1F1B, or interleaved 1F1B with `--vpp N`;
- `--recompute none|full|selective`, `--sequence-parallel` (with the TE spec);
- random tokens; rank 0 prints one line per step and a final `SUMMARY {json}` line (the same keys as
  presets/workloads/llama.py's).

Bad arguments end the run with one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
import tomllib
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

PROG = "megatron_gpt"
sys.path.insert(0, str(Path(__file__).resolve().parent))     # workload_common.py, however this file is loaded
from workload_common import (KERNEL_PROFILE_STEPS, ModelArgs, Parser, UsageError, cuda_main,  # noqa: E402
                             flops_per_token, lm_step_line, lm_summary, load_model_args, peak_tflops_for,
                             resolve_model_path, start_kernel_profile, write_kernel_profile, write_summary)


@dataclass(frozen=True)
class MoEShape:
    """The mixture-of-experts fields of a model preset (every layer's MLP is an MoE block)."""

    num_experts: int = 0
    experts_per_token: int = 0
    moe_ffn_dim: int = 0


UNBUILT = ("qk_norm", "attn_sinks", "sliding_window", "attn_bias", "shared_experts", "moe_bias")
"""Model preset fields of layers this script does not build (a preset that sets one is refused, not approximated)."""


def load_moe_shape(spec: str) -> MoEShape:
    """The preset's experts; refuses a preset whose layers this script would build differently (query-key norms,
    attention sinks or biases, sliding windows, shared experts, expert biases, a head size other than dim / heads)."""
    with open(resolve_model_path(spec), "rb") as f:
        data = tomllib.load(f)
    unbuilt = [k for k in UNBUILT if data.get(k)]
    if unbuilt:
        raise UsageError(f"{spec}: this script does not build {', '.join(unbuilt)}")
    if data.get("head_dim") and data["head_dim"] * data["n_heads"] != data["dim"]:
        raise UsageError(f"{spec}: head size {data['head_dim']} x {data['n_heads']} heads differs from dim "
                         f"{data['dim']}; this script builds heads of dim / n_heads")
    if not data.get("num_experts"):
        return MoEShape()
    return MoEShape(int(data["num_experts"]), int(data["experts_per_token"]), int(data["moe_ffn_dim"]))


def count_params(a: ModelArgs, moe: MoEShape = MoEShape(), active: bool = False) -> tuple[int, int]:
    """(all parameters, parameters without the input embedding), from the shapes; `active`: the parameters one
    token uses (top-k of the experts), for the FLOPs."""
    kv = a.n_kv_heads * a.head_dim
    mlp = 3 * a.dim * a.ffn_dim
    if moe.num_experts:
        experts = moe.experts_per_token if active else moe.num_experts
        mlp = experts * 3 * a.dim * moe.moe_ffn_dim + a.dim * moe.num_experts     # experts and the router
    block = a.dim * (a.dim + 2 * kv) + a.dim * a.dim + mlp + 2 * a.dim
    body = a.n_layers * block + a.dim + a.vocab_size * a.dim          # blocks, final norm, output head
    return body + a.vocab_size * a.dim, body


def parse_args(argv=None) -> argparse.Namespace:
    p = Parser(prog=PROG, description="Megatron-core GPT/Llama training loop (random data).")
    p.add_argument("--model", default="llama3.2-1b", help="preset name in presets/models/ or a path to a .toml")
    p.add_argument("--layers", type=int, default=None, help="override n_layers of the preset")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel degree")
    p.add_argument("--ep", type=int, default=1, help="expert-parallel degree (mixture-of-experts models)")
    p.add_argument("--moe-dispatcher", choices=("alltoall", "allgather"), default="alltoall",
                   help="MoE token dispatcher")
    p.add_argument("--moe-grouped-gemm", action="store_true",
                   help="the experts' GEMMs as one grouped GEMM (with --spec te: TE's GroupedLinear)")
    p.add_argument("--pp", type=int, default=1, help="pipeline-parallel degree")
    p.add_argument("--vpp", type=int, default=None, help="virtual pipeline stages per rank (interleaved 1F1B)")
    p.add_argument("--micro-batch", type=int, default=1, help="micro-batch size")
    p.add_argument("--global-batch", type=int, default=None,
                   help="global batch (default: micro-batch x data-parallel size; pp x that under PP)")
    p.add_argument("--seq", type=int, default=2048, help="sequence length")
    p.add_argument("--steps", type=int, default=10, help="training steps")
    p.add_argument("--recompute", choices=("none", "full", "selective"), default="none",
                   help="activation recompute: none, full (uniform, every layer) or selective (core attention)")
    p.add_argument("--sequence-parallel", action="store_true", help="sequence parallelism (with --tp > 1)")
    p.add_argument("--distributed-optimizer", action="store_true", help="shard the optimizer state over DP")
    p.add_argument("--overlap-grad-reduce", action="store_true", help="overlap the DP gradient reduction")
    p.add_argument("--overlap-param-gather", action="store_true",
                   help="overlap the parameter all-gather (with --distributed-optimizer)")
    p.add_argument("--torch-fsdp2", action="store_true",
                   help="shard parameters, gradients and optimizer state over DP with PyTorch's FSDP2 through "
                        "Megatron-core's TorchFullyShardedDataParallel (Megatron-LM's --use-torch-fsdp2) in place of "
                        "its DistributedDataParallel")
    p.add_argument("--clip-grad", type=float, default=1.0, help="gradient clipping norm (0 disables)")
    p.add_argument("--spec", choices=("local", "te"), default="local",
                   help="layer spec: Megatron-core's own modules, or Transformer Engine's")
    p.add_argument("--no-batch-p2p", action="store_true", help="pipeline p2p without batch_isend_irecv")
    p.add_argument("--lr", type=float, default=3e-4, help="Adam learning rate")
    p.add_argument("--seed", type=int, default=1234, help="seed")
    p.add_argument("--json-out", default=None, help="also write the SUMMARY json to this file (rank 0)")
    p.add_argument("--kernel-profile", default=None, metavar="DIR",
                   help="on a real GPU: record steps 3-4 with torch.profiler and write the in-situ kernel times to DIR "
                        "(rank 0; as presets/workloads/llama.py)")
    args = p.parse_args(argv)
    for name in ("tp", "ep", "pp", "micro_batch", "seq", "steps"):
        if getattr(args, name) <= 0:
            raise UsageError(f"--{name.replace('_', '-')} must be positive")
    if args.vpp is not None and (args.vpp < 2 or args.pp < 2):
        raise UsageError("--vpp needs --pp >= 2 and a value >= 2")
    if args.sequence_parallel and args.tp == 1:
        raise UsageError("--sequence-parallel needs --tp > 1")
    if args.sequence_parallel and args.spec != "te":
        raise UsageError("--sequence-parallel needs --spec te (Megatron-core's torch norms refuse sequence "
                         "parallelism)")
    if args.kernel_profile and args.steps < KERNEL_PROFILE_STEPS[-1]:
        raise UsageError("--kernel-profile records steps 3-4: it needs --steps 4 or more")
    if args.moe_grouped_gemm and args.spec != "te":
        raise UsageError("--moe-grouped-gemm needs --spec te (Megatron-core's own grouped GEMM needs the "
                         "grouped_gemm package)")
    if args.overlap_param_gather and not args.distributed_optimizer:
        raise UsageError("--overlap-param-gather needs --distributed-optimizer")
    if args.torch_fsdp2:
        ddp_only = [f"--{n.replace('_', '-')}" for n in ("distributed_optimizer", "overlap_grad_reduce")
                    if getattr(args, n)]
        if ddp_only:
            raise UsageError(f"--torch-fsdp2 shards with FSDP2: {', '.join(ddp_only)} belong to Megatron's "
                             f"DistributedDataParallel and its buffers")
    return args


def check_layout(args, a: ModelArgs, world: int, moe: MoEShape = MoEShape()) -> int:
    """The data-parallel size; errors for layouts Megatron would refuse later with an assertion."""
    if world % (args.tp * args.pp):
        raise UsageError(f"world size {world} is not divisible by tp x pp = {args.tp * args.pp}")
    if args.ep > 1 and not moe.num_experts:
        raise UsageError(f"--ep {args.ep}: {a.name} is not a mixture-of-experts model")
    if moe.num_experts % args.ep:
        raise UsageError(f"--ep {args.ep} does not divide the {moe.num_experts} experts")
    if (world // (args.tp * args.pp)) % args.ep:
        raise UsageError(f"--ep {args.ep} does not divide the data-parallel size {world // (args.tp * args.pp)}")
    chunks = args.pp * (args.vpp or 1)
    if a.n_layers % chunks:
        raise UsageError(f"{a.n_layers} layers do not split into {chunks} pipeline chunks")
    if a.n_heads % args.tp or a.n_kv_heads % args.tp:
        raise UsageError(f"--tp {args.tp} does not divide the heads ({a.n_heads}, kv {a.n_kv_heads})")
    if args.sequence_parallel and args.seq % args.tp:
        raise UsageError(f"--seq {args.seq} is not divisible by --tp {args.tp}")
    return world // (args.tp * args.pp)


def build_model(args, a: ModelArgs, moe: MoEShape):
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    recompute = {"none": {}, "full": dict(recompute_granularity="full", recompute_method="uniform",
                                          recompute_num_layers=1),
                 "selective": dict(recompute_granularity="selective")}[args.recompute]
    config = TransformerConfig(
        num_layers=a.n_layers, hidden_size=a.dim, ffn_hidden_size=a.ffn_dim, num_attention_heads=a.n_heads,
        num_query_groups=a.n_kv_heads, kv_channels=a.head_dim, normalization="RMSNorm", layernorm_epsilon=a.norm_eps,
        gated_linear_unit=True, activation_func=F.silu, add_bias_linear=False, hidden_dropout=0.0,
        attention_dropout=0.0, bf16=True, params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16,
        tensor_model_parallel_size=args.tp, pipeline_model_parallel_size=args.pp,
        virtual_pipeline_model_parallel_size=args.vpp, sequence_parallel=args.sequence_parallel,
        batch_p2p_comm=not args.no_batch_p2p, variable_seq_lengths=False,
        # as Megatron-LM's --transformer-impl sets it with the spec; TorchFullyShardedDataParallel reads it (with
        # "local" it does not shard Megatron's own linear layers apart from the transformer layers holding them)
        transformer_impl="local" if args.spec == "local" else "transformer_engine",
        **recompute, **moe_config(args, moe))
    if args.spec == "te":
        if importlib.util.find_spec("transformer_engine") is None:
            raise UsageError("--spec te needs Transformer Engine (under phantora run: --transformer-engine 2.9)")
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec
        spec = get_gpt_layer_with_transformer_engine_spec(num_experts=moe.num_experts or None,
                                                          moe_grouped_gemm=args.moe_grouped_gemm)
    else:
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
        spec = get_gpt_layer_local_spec(num_experts=moe.num_experts or None, moe_grouped_gemm=args.moe_grouped_gemm,
                                        normalization="RMSNorm")
    chunks = []
    for vp in range(args.vpp or 1):
        vp_stage = vp if args.vpp else None
        chunk = GPTModel(config=config, transformer_layer_spec=spec, vocab_size=a.vocab_size,
                         max_sequence_length=args.seq,
                         pre_process=ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage),
                         post_process=ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage),
                         share_embeddings_and_output_weights=False, position_embedding_type="rope",
                         rotary_base=int(a.rope_theta), vp_stage=vp_stage)
        chunks.append(chunk)
    return config, chunks


def moe_config(args, moe: MoEShape) -> dict:
    """TransformerConfig's mixture-of-experts fields (Mixtral's: top-k softmax router with the auxiliary
    load-balancing loss, no shared experts)."""
    if not moe.num_experts:
        return {}
    return dict(num_moe_experts=moe.num_experts, moe_router_topk=moe.experts_per_token,
                moe_ffn_hidden_size=moe.moe_ffn_dim, expert_model_parallel_size=args.ep,
                moe_token_dispatcher_type=args.moe_dispatcher, moe_grouped_gemm=args.moe_grouped_gemm,
                moe_router_load_balancing_type="aux_loss", moe_aux_loss_coeff=1e-2)


def fsdp2_wrapper():
    """Megatron-core's TorchFullyShardedDataParallel. In 0.16.1 its `finish_grad_sync` takes no argument while
    `finalize_model_grads` passes `force_all_reduce` (a TypeError at the first step, on GPUs too; later releases
    take it): accepted here. There is nothing to finish: FSDP2 reduce-scatters the gradients in its backward hooks."""
    import inspect

    from megatron.core.distributed import TorchFullyShardedDataParallel

    if "force_all_reduce" in inspect.signature(TorchFullyShardedDataParallel.finish_grad_sync).parameters:
        return TorchFullyShardedDataParallel

    class TorchFSDP2(TorchFullyShardedDataParallel):
        def finish_grad_sync(self, force_all_reduce: bool = False):
            return super().finish_grad_sync()

    return TorchFSDP2


def train(args, a: ModelArgs, moe: MoEShape, dp: int, rank: int, local_rank: int) -> None:
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import (DistributedDataParallel, DistributedDataParallelConfig,
                                           TorchFullyShardedDataParallelConfig)
    from megatron.core.distributed.finalize_model_grads import finalize_model_grads
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.pipeline_parallel.schedules import get_forward_backward_func
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer.module import Float16Module

    torch.cuda.set_device(local_rank)
    torch.distributed.init_process_group(backend="nccl")
    ps.initialize_model_parallel(tensor_model_parallel_size=args.tp, pipeline_model_parallel_size=args.pp,
                                 virtual_pipeline_model_parallel_size=args.vpp, expert_model_parallel_size=args.ep)
    model_parallel_cuda_manual_seed(args.seed)

    config, chunks = build_model(args, a, moe)
    if args.torch_fsdp2:
        wrapper, ddp_config = fsdp2_wrapper(), TorchFullyShardedDataParallelConfig(reshard_after_forward=True)
    else:
        wrapper, ddp_config = DistributedDataParallel, DistributedDataParallelConfig(
            grad_reduce_in_fp32=True, overlap_grad_reduce=args.overlap_grad_reduce,
            overlap_param_gather=args.overlap_param_gather, use_distributed_optimizer=args.distributed_optimizer)
    model = []
    for i, chunk in enumerate(chunks):
        chunk.cuda(torch.cuda.current_device())
        chunk = Float16Module(config, chunk)
        model.append(wrapper(config=config, ddp_config=ddp_config, module=chunk, disable_bucketing=i > 0))
    optimizer = get_megatron_optimizer(
        OptimizerConfig(optimizer="adam", lr=args.lr, weight_decay=0.1, adam_beta1=0.9, adam_beta2=0.95, bf16=True,
                        params_dtype=torch.bfloat16, use_distributed_optimizer=args.distributed_optimizer,
                        clip_grad=args.clip_grad),
        model)

    # As Megatron-LM's training loop wires them.
    if args.overlap_grad_reduce:
        config.no_sync_func = [m.no_sync for m in model] if len(model) > 1 else model[0].no_sync
    config.finalize_model_grads_func = finalize_model_grads
    config.grad_scale_func = optimizer.scale_loss

    global_batch = args.global_batch or args.micro_batch * dp * (args.pp if args.pp > 1 else 1)
    if global_batch % (args.micro_batch * dp):
        raise UsageError(f"--global-batch {global_batch} is not a multiple of micro-batch x dp = "
                         f"{args.micro_batch * dp}")
    microbatches = global_batch // (args.micro_batch * dp)
    device = torch.device("cuda", torch.cuda.current_device())
    generator = torch.Generator(device=device)
    generator.manual_seed(args.seed + ps.get_data_parallel_rank())

    def batches():
        while True:
            tokens = torch.randint(0, a.vocab_size, (args.micro_batch, args.seq + 1), device=device,
                                   generator=generator)
            position_ids = torch.arange(args.seq, device=device).unsqueeze(0).expand(args.micro_batch, -1)
            yield {"tokens": tokens[:, :-1].contiguous(), "labels": tokens[:, 1:].contiguous(),
                   "position_ids": position_ids, "loss_mask": torch.ones(args.micro_batch, args.seq, device=device)}

    def loss_func(loss_mask, output_tensor):
        losses = output_tensor.float().view(-1)
        mask = loss_mask.view(-1)
        loss = torch.sum(losses * mask)
        tokens = mask.sum().clone().detach().to(torch.int)
        return loss, tokens, {"lm loss": torch.cat([loss.clone().detach().view(1), tokens.float().view(1)])}

    def forward_step(data_iterator, chunk):
        batch = next(data_iterator)
        output = chunk(batch["tokens"], batch["position_ids"], None, labels=batch["labels"])
        return output, partial(loss_func, batch["loss_mask"])

    iterators = [batches() for _ in model] if len(model) > 1 else batches()
    forward_backward = get_forward_backward_func()
    n_params, _ = count_params(a, moe)
    fpt = flops_per_token(a, args.seq, count_params(a, moe, active=True)[1])
    world = torch.distributed.get_world_size()
    tokens_per_step = global_batch * args.seq
    device_name = torch.cuda.get_device_name(device)
    peak = peak_tflops_for(device_name)
    log = rank == 0
    if log:
        ep = f" (ep {args.ep})" if moe.num_experts else ""
        print(f"{PROG}: model {a.name} ({n_params:,} parameters, {a.n_layers} layers), world {world} = "
              f"tp {args.tp} x pp {args.pp} x dp {dp}{ep}, vpp {args.vpp or 1}, micro-batch {args.micro_batch}, "
              f"global batch {global_batch} ({microbatches} microbatches), seq {args.seq}, recompute "
              f"{args.recompute}, spec {args.spec}, on {device_name}", flush=True)

    times, losses = [], []
    recorder = None
    for step in range(1, args.steps + 1):
        if args.kernel_profile and log and step == KERNEL_PROFILE_STEPS[0]:
            recorder = start_kernel_profile()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for m in model:
            m.zero_grad_buffer()
        optimizer.zero_grad()
        reduced = forward_backward(forward_step_func=forward_step, data_iterator=iterators, model=model,
                                   num_microbatches=microbatches, seq_length=args.seq,
                                   micro_batch_size=args.micro_batch, decoder_seq_length=args.seq,
                                   forward_only=False)
        update_ok, grad_norm, _ = optimizer.step()
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        times.append(dt)
        if recorder is not None and step == KERNEL_PROFILE_STEPS[-1]:
            write_kernel_profile(recorder, Path(args.kernel_profile), times[-len(KERNEL_PROFILE_STEPS):], PROG)
            recorder = None
        loss_value = float("nan")          # on the last pipeline stage only: the others print "loss n/a"
        if reduced and ps.is_pipeline_last_stage(ignore_virtual=True):
            total = torch.stack([r["lm loss"] for r in reduced]).sum(0)
            loss_value = (total[0] / total[1]).item()
        losses.append(loss_value)
        if log:
            tps = tokens_per_step / dt / world
            print(lm_step_line(step, loss_value, dt, tps, fpt, peak,
                               torch.cuda.max_memory_allocated(device) / 2**30, grad_norm), flush=True)

    if log:
        summary = lm_summary("megatron_gpt", a, count_params(a, moe), fpt, tokens_per_step, times, losses, world, peak,
                             torch.cuda.max_memory_allocated(device) / 2**30, device_name,
                             {"world_size": world, "tp": args.tp, "pp": args.pp, "vpp": args.vpp, "dp": dp,
                              "micro_batch": args.micro_batch, "global_batch": global_batch, "seq": args.seq,
                              "recompute": args.recompute, "sequence_parallel": args.sequence_parallel,
                              "distributed_optimizer": args.distributed_optimizer,
                              "overlap_grad_reduce": args.overlap_grad_reduce,
                              "overlap_param_gather": args.overlap_param_gather, "clip_grad": args.clip_grad,
                              "torch_fsdp2": args.torch_fsdp2,
                              "spec": args.spec, "steps": args.steps, "ep": args.ep,
                              "num_experts": moe.num_experts, "moe_grouped_gemm": args.moe_grouped_gemm})
        write_summary(summary, args.json_out)
    ps.destroy_model_parallel()
    torch.distributed.destroy_process_group()


def main(argv=None) -> int:
    def parse():
        args = parse_args(argv)
        moe = load_moe_shape(args.model)        # first: it names the layers this script does not build
        return args, load_model_args(args.model, args.layers), moe

    def start(parsed, world: int, rank: int, local_rank: int) -> None:
        args, a, moe = parsed
        train(args, a, moe, check_layout(args, a, world, moe), rank, local_rank)

    return cuda_main(PROG, parse, start)


if __name__ == "__main__":
    sys.exit(main())
