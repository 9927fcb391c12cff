"""A synthetic FSDP training step as op streams, for testing the engine, traces and replay without a framework.

Per iteration and layer: the layer's parameters are all-gathered on a communication stream (bf16), the compute
stream waits for them and runs the layer's matmuls and attention; backward all-gathers again, runs twice the matmul
work and reduce-scatters fp32 gradients; an optimizer step closes the iteration. Matmul kernels carry real
signatures (aten.mm), so a replay on another GPU re-costs them. Durations here come from a plain roofline
(`flops / (peak * 0.7)` or `bytes / (HBM * 0.8)`, plus 3 us), which is enough to exercise the engine.
"""

from __future__ import annotations

from dataclasses import dataclass

from .cluster import ClusterSpec
from .costmodel.signature import Signature
from .engine.ops import CostSource, Op, OpKind as K

COMPUTE, COMM = 0, 1


@dataclass
class SyntheticModel:
    dim: int = 1024
    layers: int = 4
    ffn: int = 2816
    vocab: int = 32000
    seq: int = 2048
    batch: int = 1

    @property
    def layer_params(self) -> int:
        return 4 * self.dim * self.dim + 3 * self.dim * self.ffn

    @property
    def params(self) -> int:
        return self.layers * self.layer_params + 2 * self.vocab * self.dim

    def flops_per_token(self) -> float:
        return 6 * self.layers * self.layer_params + 6 * self.vocab * self.dim + 12 * self.layers * self.dim * self.seq


def fsdp_streams(spec: ClusterSpec, model: SyntheticModel, iterations: int = 3, ranks: list[int] | None = None,
                 cpu_per_op_s: float = 20e-6):
    """(streams by rank, signature keys, meta) for FSDP over the whole world."""
    gpu = spec.gpu_spec()
    world = spec.world_size
    peak, bw = gpu.peak_flops("bf16") * 0.7, gpu.hbm_bytes_per_s * 0.8
    sigs: list[str] = []
    sig_ids: dict[str, int] = {}

    def mm(m: int, k: int, n: int) -> Op:
        s = Signature("aten.mm.default", ((m, k), (k, n)), ("bfloat16", "bfloat16"), ((k, 1), (n, 1)), ()).key()
        if s not in sig_ids:
            sig_ids[s] = len(sigs)
            sigs.append(s)
        flops = 2.0 * m * k * n
        nbytes = 2 * (m * k + k * n + m * n)
        dur = max(flops / peak, nbytes / bw) + 3e-6
        return Op(K.KERNEL, stream=COMPUTE, name="aten::mm", sig=sig_ids[s], duration=dur, flops=flops,
                  nbytes=nbytes, cpu_delta=cpu_per_op_s, source=CostSource.ROOFLINE)

    def linear(m: int, k: int, n: int, backward: bool) -> list[Op]:
        """x[m,k] @ W[k,n] forward; backward its two GEMMs, grad_x = grad[m,n] @ W^T and grad_W = x^T @ grad."""
        return [mm(m, n, k), mm(k, m, n)] if backward else [mm(m, k, n)]

    def elementwise(numel: int, name: str) -> Op:
        nbytes = 3 * 2 * numel
        return Op(K.KERNEL, stream=COMPUTE, name=name, duration=nbytes / bw + 3e-6, nbytes=nbytes,
                  cpu_delta=cpu_per_op_s, source=CostSource.ROOFLINE)

    tokens = model.batch * model.seq
    d, f = model.dim, model.ffn
    shard_bf16 = model.layer_params * 2 // world
    shard_fp32 = model.layer_params * 4
    attn_flops = 4 * model.batch * model.seq * model.seq * d / 2
    event = [0]

    def layer(ops: list[Op], backward: bool) -> None:
        ops.append(Op(K.COLLECTIVE, stream=COMM, name="all_gather", group=0, nbytes=shard_bf16, cpu_delta=cpu_per_op_s))
        event[0] += 1
        ops.append(Op(K.EVENT_RECORD, stream=COMM, arg=event[0]))
        ops.append(Op(K.STREAM_WAIT, stream=COMPUTE, arg=event[0]))
        mult = 2.0 if backward else 1.0
        ops += [*linear(tokens, d, 3 * d, backward),
                Op(K.KERNEL, stream=COMPUTE, name="flash_attention", duration=attn_flops * mult / peak + 5e-6,
                   flops=attn_flops * mult, cpu_delta=cpu_per_op_s, source=CostSource.ROOFLINE),
                *linear(tokens, d, d, backward), elementwise(tokens * d, "aten::add"),
                *linear(tokens, d, 2 * f, backward), elementwise(tokens * f, "aten::silu"),
                *linear(tokens, f, d, backward)]
        if backward:
            event[0] += 1
            ops.append(Op(K.EVENT_RECORD, stream=COMPUTE, arg=event[0]))
            ops.append(Op(K.STREAM_WAIT, stream=COMM, arg=event[0]))
            ops.append(Op(K.COLLECTIVE, stream=COMM, name="reduce_scatter", group=0, nbytes=shard_fp32,
                          cpu_delta=cpu_per_op_s))

    streams = {}
    for r in (ranks if ranks is not None else range(world)):
        event[0] = 0
        ops: list[Op] = [Op(K.ALLOC, arg=0, nbytes=model.params * 16 // world)]
        for _ in range(iterations):
            for _ in range(model.layers):
                layer(ops, backward=False)
            ops += linear(tokens, d, model.vocab, backward=False)
            ops += linear(tokens, d, model.vocab, backward=True)
            for _ in range(model.layers):
                layer(ops, backward=True)
            ops.append(Op(K.SYNC_DEVICE))
            ops.append(elementwise(model.params * 4 // world, "aten::_fused_adamw_"))
            ops.append(Op(K.ITER_MARK))
        ops.append(Op(K.SYNC_DEVICE))
        streams[r] = ops
    meta = {"tokens_per_iteration": tokens * world, "flops_per_token": model.flops_per_token(),
            "workload": f"synthetic FSDP {model}"}
    return streams, sigs, meta
