"""A small mixture-of-experts trainer in plain PyTorch, with expert parallelism, for ground truth.

Each of `--layers` blocks is `x + MoE(RMSNorm(x))`: a linear router with a softmax over `--experts` experts, the
top `--top-k` picked per token, SwiGLU experts run as three `torch._grouped_mm` over the tokens sorted by expert
(as TorchTitan's GroupedExperts), the outputs weighted by the router scores and added back per token. With
`--ep N` (the world size) each rank holds experts/N of them: the per-expert counts are exchanged with an
all-to-all, the split lists read on the host, the tokens sent to their experts' ranks with `all_to_all_single` and
those split sizes (differentiable, torch.distributed.nn) and back after the experts, as TorchTitan's
AllToAllTokenDispatcher does. The loss is the mean square of the output; AdamW updates the router and the experts.

`--route topk` routes by the router's top-k (what a simulation assumes a distribution for: `phantora run
--routing`); `--route balanced` forces every expert the same number of picks (round robin, as TorchTitan's
`_debug_force_load_balance`); `--route zipf:S` forces the picks of a Zipf skew over the expert index (the counts of
`phantora.routing`, imported for that mode only). Forced routes make a real GPU route as the simulation assumes.

One JSON line per step (`{"step", "time_s", "mem_gib"}`) and a `SUMMARY {...}` line with the median step time of
the steps after `--warmup`. Run with torchrun (ground truth) or phantora run (simulated); `--device cpu` with gloo
checks the script (no grouped GEMM there: per-expert matmuls).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--dim", type=int, default=2048)
    p.add_argument("--ffn", type=int, default=2048, help="SwiGLU hidden size of each expert")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--tokens", type=int, default=16384, help="tokens per rank per step")
    p.add_argument("--ep", type=int, default=1, help="expert-parallel degree: 1 or the world size")
    p.add_argument("--route", default="topk", help="topk | balanced | zipf:S")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--device", default="cuda")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def forced_ids(route: str, tokens: int, k: int, experts: int, device) -> torch.Tensor:
    """(tokens, k) expert ids whose per-expert counts are those of the forced route; each token's k distinct."""
    if route == "balanced":
        counts = [tokens * k // experts + (1 if e < tokens * k % experts else 0) for e in range(experts)]
    else:
        from phantora.routing import expert_counts, parse
        counts = expert_counts(parse(route), tokens, k, experts)
    flat = torch.repeat_interleave(torch.arange(experts), torch.tensor(counts))   # sorted by expert
    # pick p goes to token p % tokens, slot p // tokens: an expert's picks are a run of at most `tokens`
    return flat.view(k, tokens).t().contiguous().to(device)


class MoELayer(torch.nn.Module):
    def __init__(self, a, local_experts: int, dtype):
        super().__init__()
        self.a, self.local = a, local_experts
        self.norm = torch.nn.RMSNorm(a.dim, dtype=dtype)
        self.router = torch.nn.Linear(a.dim, a.experts, bias=False, dtype=dtype)
        self.w1 = torch.nn.Parameter(torch.randn(local_experts, a.ffn, a.dim, dtype=dtype) * 0.02)
        self.w3 = torch.nn.Parameter(torch.randn(local_experts, a.ffn, a.dim, dtype=dtype) * 0.02)
        self.w2 = torch.nn.Parameter(torch.randn(local_experts, a.dim, a.ffn, dtype=dtype) * 0.02)

    def experts(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        if x.device.type != "cuda":
            outs, start = [], 0
            for e, c in enumerate(counts):
                h = x[start:start + c]
                outs.append((F.silu(h @ self.w1[e].t()) * (h @ self.w3[e].t())) @ self.w2[e].t())
                start += c
            return torch.cat(outs)
        offs = torch.tensor(counts, dtype=torch.int32).cumsum(0, dtype=torch.int32).to(x.device)
        h = F.silu(torch._grouped_mm(x, self.w1.transpose(-2, -1), offs=offs))
        h = h * torch._grouped_mm(x, self.w3.transpose(-2, -1), offs=offs)
        return torch._grouped_mm(h, self.w2.transpose(-2, -1), offs=offs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, T = self.a, x.shape[0]
        h = self.norm(x)
        scores = torch.softmax(self.router(h).float(), dim=-1)
        if a.route == "topk":
            top, ids = torch.topk(scores, a.top_k, dim=-1)
        else:
            ids = forced_ids(a.route, T, a.top_k, a.experts, x.device)
            top = scores.gather(-1, ids)
        routing_map = torch.zeros_like(scores, dtype=torch.bool).scatter_(-1, ids, True)
        counts = routing_map.sum(dim=0)                                        # tokens per expert, this rank
        order = torch.argsort(ids.view(-1), stable=True)
        token = order // a.top_k
        routed = h[token]
        if a.ep == 1:
            y = self.experts(routed, counts.tolist())
        else:
            y = self._expert_parallel(routed, counts)
        y = y * top.view(-1)[order].unsqueeze(-1).to(y.dtype)
        return x + torch.zeros_like(x).index_add(0, token, y)

    def _expert_parallel(self, routed: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        import torch.distributed.nn.functional as dnn
        ep, local = self.a.ep, self.local
        received = torch.empty_like(counts)
        dist.all_to_all_single(received, counts)                             # [source][local expert] counts
        send = counts.view(ep, local).sum(dim=1).tolist()
        recv_counts = received.view(ep, local).tolist()
        recv = [sum(r) for r in recv_counts]
        out = routed.new_empty(sum(recv), routed.shape[1])
        tokens = dnn.all_to_all_single(out, routed, recv, send)
        # regroup the received rows (by source, then local expert) by local expert for the grouped GEMMs
        starts, pos = [], 0
        for row in recv_counts:
            starts.append(pos)
            pos += sum(row)
        index, per_expert = [], []
        for e in range(local):
            n = 0
            for s, row in enumerate(recv_counts):
                begin = starts[s] + sum(row[:e])
                index.extend(range(begin, begin + row[e]))
                n += row[e]
            per_expert.append(n)
        index_t = torch.tensor(index, dtype=torch.long).to(routed.device)
        y = self.experts(tokens[index_t], per_expert)
        back = torch.empty_like(y).index_copy(0, index_t, y)
        out2 = routed.new_empty(routed.shape[0], y.shape[1])
        return dnn.all_to_all_single(out2, back, send, recv)


def main(argv=None) -> int:
    a = parse_args(argv)
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    if a.ep not in (1, world):
        raise SystemExit(f"--ep {a.ep}: give 1 or the world size ({world})")
    if a.experts % a.ep:
        raise SystemExit(f"--experts {a.experts} must divide by --ep {a.ep}")
    on_cuda = a.device == "cuda"
    if on_cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    device = torch.device(a.device, torch.cuda.current_device()) if on_cuda else torch.device("cpu")
    if world > 1:
        dist.init_process_group("nccl" if on_cuda else "gloo")
    dtype = torch.bfloat16 if on_cuda else torch.float32
    torch.manual_seed(a.seed + rank)
    with torch.device(device):
        layers = torch.nn.ModuleList(MoELayer(a, a.experts // a.ep, dtype) for _ in range(a.layers))
    opt = torch.optim.AdamW(layers.parameters(), lr=1e-4, foreach=True)
    x0 = torch.randn(a.tokens, a.dim, device=device, dtype=dtype)
    times, mems = [], []
    for step in range(1, a.steps + 1):
        if on_cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        x = x0
        for layer in layers:
            x = layer(x)
        x.float().pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if on_cuda:
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        mem = torch.cuda.max_memory_reserved() / 2**30 if on_cuda else 0.0
        times.append(dt)
        mems.append(mem)
        if rank == 0:
            print(json.dumps({"step": step, "time_s": dt, "mem_gib": mem}), flush=True)
    if rank == 0:
        timed = times[a.warmup:] or times
        print("SUMMARY " + json.dumps({"workload": "moe", "median_step_s": statistics.median(timed),
                                       "step_times_s": times, "peak_mem_gib": max(mems), "world_size": world,
                                       "config": vars(a)}), flush=True)
    if world > 1:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
