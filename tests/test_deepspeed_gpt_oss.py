"""presets/workloads/deepspeed_gpt.py on the gpt-oss-20b preset (2 of its 24 layers, sequence 512) with DeepSpeed's
MoE layer, EP 2 and ZeRO 2 on 2 simulated GPUs: what the trace and the SUMMARY say of the model it built.

- the parameters counted on the modules built are the preset's arithmetic (phantora.models counts it independently:
  biases of q/k/v/o, a sink per head, the biased router, experts with a 2 x ffn gate/up projection and biases);
- attention runs on heads of 64 (not dim / heads = 45): 64 query and 8 KV heads, the queries 4096 wide for a model
  width of 2880; layer 0 attends within a band of 128 keys (FlexAttention's mask density is the band's share of the
  score matrix), layer 1 causally (density 0.5);
- every attention is followed by its sinks: sigmoid(lse - sink) over (batch, heads, seq) in fp32, the sink operand
  one value per head;
- the projections carry biases (addmm with a bias of the output's width), the router too, in fp32 as DeepSpeed's
  gate computes it;
- each MoE all-to-all moves DeepSpeed's capacity-bound buffer: experts x ceil(top_k x tokens / experts) x dim bf16
  values (top-4 at capacity factor 1), over the expert-parallel group of ranks 0 and 1, four per layer and step
  (dispatch and combine, forward and backward); the experts' gate/up GEMMs take ep x capacity tokens each.

And on the CPU, with real numbers: the attention (FlexAttention, its output rescaled by sigmoid(lse - sink)) equals a
softmax over the masked scores with the sink appended as one more column, banded or causal, and so does the sink's
gradient.
"""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("deepspeed")

from phantora.models import load_model  # noqa: E402
from phantora.trace.reader import TraceReader  # noqa: E402
from test_framework_recipes import load_script  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "presets" / "workloads" / "deepspeed_gpt.py"
LAYERS, SEQ, STEPS, EP = 2, 512, 2, 2
SPEC = dataclasses.replace(load_model("gpt-oss-20b"), n_layers=LAYERS)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gpt-oss")
    summary, trace = tmp / "summary.json", tmp / "gpt-oss.h5"
    cmd = [sys.executable, "-m", "phantora.cli", "run", "--nodes", "1", "--gpus-per-node", "2", "--quiet",
           "--trace", str(trace), "--", "python", str(SCRIPT), "--model", "gpt-oss-20b", "--layers", str(LAYERS),
           "--ep", str(EP), "--zero", "2", "--seq", str(SEQ), "--steps", str(STEPS), "--json-out", str(summary)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=str(ROOT))
    assert proc.returncode == 0, proc.stderr[-3000:]
    with TraceReader(str(trace)) as r:
        names, sigs, groups = r.names, r.signatures, r.groups
        kernels = []                        # (name, shapes, dtypes, scalars) of rank 0's kernels, in program order
        collectives = []                    # (name, nbytes, group ranks) of rank 0's collectives
        for o in r.ops(0):
            if o["kind"] == 0 and o["sig"] >= 0:
                _, shapes, dtypes, _, scalars, *_ = json.loads(sigs[o["sig"]])
                kernels.append((names[o["name"]], shapes, dtypes, dict(scalars)))
            elif o["kind"] == 2:
                collectives.append((names[o["name"]], int(o["nbytes"]), groups[int(o["group"])][1]))
    return json.loads(summary.read_text()), kernels, collectives


def test_parameters_are_the_presets(run):
    summary, _, _ = run
    assert summary["params"] == SPEC.num_params()
    assert summary["params_without_embedding"] == SPEC.num_active_params() - SPEC.embedding_params()
    assert summary["flops_per_token"] == SPEC.flops_per_token(SEQ)


def band_density(seq: int, window: int) -> float:
    """Share of the seq x seq score matrix a causal band of `window` keys keeps."""
    return sum(min(q + 1, window) for q in range(seq)) / seq ** 2


def test_attention_has_heads_of_64_and_a_sliding_window_on_even_layers(run):
    _, kernels, _ = run
    flex = [k for k in kernels if k[0] == "flex_attention"]
    assert len(flex) == STEPS * LAYERS
    hd = SPEC.head_size
    assert hd == 64 and SPEC.dim // SPEC.n_heads == 45
    for _, shapes, dtypes, _ in flex:
        assert shapes[:3] == [[1, SPEC.n_heads, SEQ, hd], [1, SPEC.n_kv_heads, SEQ, hd], [1, SPEC.n_kv_heads, SEQ, hd]]
        assert dtypes[:3] == ["bfloat16"] * 3
    densities = [k[3]["density"] for k in flex]
    window = band_density(SEQ, SPEC.sliding_window)
    assert window < 0.3
    for i, d in enumerate(densities):         # layers 0, 1, 0, 1: banded, causal
        expect = window if i % LAYERS % 2 == 0 else 0.5
        assert abs(d - expect) <= 0.011, densities
    backward = [k[3]["density"] for k in kernels if k[0] == "flex_attention_backward"]
    assert sorted(backward) == sorted(densities)


def test_each_attention_is_rescaled_by_its_sinks(run):
    _, kernels, _ = run
    heads = SPEC.n_heads
    lse = [1, heads, SEQ]
    sinks = [k for k in kernels if k[0] == "aten.sub.Tensor" and k[1][:2] == [lse, [1, heads, 1]]
             and k[2][:2] == ["float32", "float32"]]
    sigmoid = [k for k in kernels if k[0] == "aten.sigmoid.default" and k[1][0] == lse]
    assert len(sinks) == len(sigmoid) == STEPS * LAYERS
    flex_at = [i for i, k in enumerate(kernels) if k[0] == "flex_attention"]
    for i in flex_at:                          # the rescale follows its attention, before the output projection
        after = [k[0] for k in kernels[i + 1:i + 8]]
        assert "aten.sigmoid.default" in after, after


def test_projections_and_router_carry_biases(run):
    _, kernels, _ = run
    addmm = Counter((json.dumps(k[1][:3]), k[2][0]) for k in kernels if k[0] == "aten.addmm.default")
    dim, q, kv, experts = SPEC.dim, SPEC.n_heads * SPEC.head_size, SPEC.n_kv_heads * SPEC.head_size, SPEC.num_experts
    per_run = STEPS * LAYERS
    assert addmm[(json.dumps([[q], [SEQ, dim], [dim, q]]), "bfloat16")] == per_run                # wq
    assert addmm[(json.dumps([[kv], [SEQ, dim], [dim, kv]]), "bfloat16")] == 2 * per_run          # wk, wv
    assert addmm[(json.dumps([[dim], [SEQ, q], [q, dim]]), "bfloat16")] == per_run                # wo
    assert addmm[(json.dumps([[experts], [SEQ, dim], [dim, experts]]), "float32")] == per_run      # router


def test_moe_all_to_all_moves_the_top4_capacity_buffer(run):
    _, kernels, collectives = run
    capacity = math.ceil(SPEC.experts_per_token * SEQ / SPEC.num_experts)      # DeepSpeed's _capacity, factor 1
    a2a = [c for c in collectives if c[0] == "all_to_all"]
    assert len(a2a) == 4 * STEPS * LAYERS
    assert {c[1] for c in a2a} == {SPEC.num_experts * capacity * SPEC.dim * 2}
    assert all(c[2] == [0, 1] for c in a2a)
    # each local expert's gate/up projection (2 x ffn wide) runs on the ep x capacity tokens it received
    gate_up = [k for k in kernels if k[0] == "aten.mm.default"
               and k[1][:2] == [[EP * capacity, SPEC.dim], [SPEC.dim, 2 * SPEC.moe_ffn_dim]]]
    assert len(gate_up) == STEPS * LAYERS * SPEC.num_experts // EP


@pytest.mark.parametrize("layer", [0, 1])
def test_sinks_join_the_softmax_denominator(layer):
    import torch
    from torch.nn.attention.flex_attention import flex_attention

    mod = load_script(SCRIPT)
    mod._FLEX.append(flex_attention)          # eager flex attention (forward only on the CPU)
    a = dataclasses.replace(mod.load_model_args("gpt-oss-20b", 2), dim=64, n_heads=4, n_kv_heads=2, head_size=16,
                            sliding_window=8)
    torch.manual_seed(0)
    att = mod.GptOssAttention(layer, a).double()
    assert att.window == (8 if layer == 0 else 0)
    with torch.no_grad():
        att.sinks.normal_()
    for name, p in att.named_parameters():     # q, k, v need no gradient: FlexAttention has no CPU backward
        p.requires_grad_(name == "sinks")
    b, s, hd = 2, 32, 16
    x = torch.randn(b, s, a.dim, dtype=torch.float64)
    cos, sin = (t.double() for t in mod.yarn_rope_tables(hd, s, a.rope_theta))
    out = att(x, cos, sin)

    q = mod.apply_rope_halves(att.wq(x).view(b, s, -1, hd), cos, sin).transpose(1, 2)
    k = mod.apply_rope_halves(att.wk(x).view(b, s, -1, hd), cos, sin).transpose(1, 2).repeat_interleave(2, 1)
    v = att.wv(x).view(b, s, -1, hd).transpose(1, 2).repeat_interleave(2, 1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(hd)
    i = torch.arange(s)
    keep = i[:, None] >= i[None, :]
    if layer == 0:
        keep &= i[:, None] - i[None, :] < 8
    scores = scores.masked_fill(~keep, float("-inf"))
    sink = att.sinks.view(1, -1, 1, 1).expand(b, -1, s, 1)
    probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
    ref = att.wo((probs @ v).transpose(1, 2).reshape(b, s, -1))
    assert torch.allclose(out, ref, atol=1e-6)
    grad, = torch.autograd.grad(out.square().sum(), att.sinks)
    grad_ref, = torch.autograd.grad(ref.square().sum(), att.sinks)
    assert torch.allclose(grad, grad_ref, atol=1e-5)
    assert grad.abs().min() > 0
