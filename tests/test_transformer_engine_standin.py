"""The Transformer Engine stand-in (`phantora run --transformer-engine VERSION`) driven by a plain PyTorch script, as
TE's own examples use it: what each layer costs is checked against the work TE's kernels do, not against recorded
numbers.

- `te.pytorch.Linear` forward and backward: three GEMMs of 2·N·in·out FLOPs each (forward, dgrad, wgrad);
- `fuse_wgrad_accumulation`: the weight gradient lands in `weight.main_grad` (an fp32 add of out x in elements)
  and the hook-visible flag is set, as TE does for Megatron's gradient buffers;
- `te.pytorch.DotProductAttention` on sbhd inputs with grouped-query heads: one fused attention kernel (cuDNN, TE's
  default backend on Hopper) forward and one backward, no repeat of the key/value heads;
- every weight carries TE's tensor-parallel tags, split or not (Megatron's norm and zero counts read them);
- `GroupedLinear` refuses split sizes that do not add up to its input's rows, as TE's `torch.split` does;
- FP8 (`fp8_autocast(enabled=True)`) is refused with an error naming it, not simulated as bf16;
- without the option, `import transformer_engine` fails as on a machine without TE.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from phantora.trace.reader import TraceReader

SCRIPT = r'''
import torch
import transformer_engine as te
import transformer_engine.pytorch as tep

torch.cuda.set_device(0)
print("VERSION", te.__version__, flush=True)
N, IN, OUT = 2048, 1024, 4096
lin = tep.Linear(IN, OUT, bias=False, params_dtype=torch.bfloat16)
x = torch.randn(N // 2, 2, IN, device="cuda", dtype=torch.bfloat16, requires_grad=True)
torch.cuda.synchronize()
torch.cuda.nvtx.range_push("linear")
lin(x).sum().backward()
torch.cuda.nvtx.range_pop()

fused = tep.Linear(IN, OUT, bias=False, params_dtype=torch.bfloat16, fuse_wgrad_accumulation=True)
fused.weight.main_grad = torch.zeros(OUT, IN, device="cuda", dtype=torch.float32)
fused.weight.grad_added_to_main_grad = False
fused(x).sum().backward()
print("FUSED", fused.weight.grad_added_to_main_grad, flush=True)
grouped = tep.GroupedLinear(2, IN, OUT, bias=False, params_dtype=torch.bfloat16)
print("TAGS", lin.weight.tensor_model_parallel, lin.weight.partition_dim, grouped.weight0.tensor_model_parallel,
      flush=True)
rows = torch.randn(96, IN, device="cuda", dtype=torch.bfloat16)
print("GROUPED", tuple(grouped(rows, [64, 32]).shape), flush=True)
try:
    grouped(rows, [0, 0])            # split sizes that do not cover the input: TE's torch.split refuses them
except RuntimeError as exc:
    print("SPLITS REFUSED", exc, flush=True)

attn = tep.DotProductAttention(num_attention_heads=16, kv_channels=128, num_gqa_groups=4, attn_mask_type="causal")
q = torch.randn(1024, 2, 16, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
kv = torch.randn(1024, 2, 4, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
out = attn(q, kv, kv)
print("ATTN", tuple(out.shape), flush=True)
out.sum().backward()
try:
    with tep.fp8_autocast(enabled=True):
        lin(x)
except NotImplementedError as exc:
    print("REFUSED", exc, flush=True)
'''


def run(tmp: Path, cache: Path, *options: str) -> tuple[subprocess.CompletedProcess, Path]:
    (tmp / "te_script.py").write_text(SCRIPT)
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env["XDG_CACHE_HOME"] = str(cache)
    trace = tmp / "te.h5"
    proc = subprocess.run([sys.executable, "-m", "phantora.cli", "run", "--gpus-per-node", "1", "--trace", str(trace),
                           *options, "--", "python", "te_script.py"], capture_output=True, text=True, timeout=600,
                          cwd=str(tmp), env=env)
    return proc, trace


def test_layers_cost_the_work_of_te_kernels(tmp_path, stub_cache):
    proc, trace = run(tmp_path, stub_cache, "--transformer-engine", "2.9")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    out = proc.stdout
    assert "VERSION 2.9" in out
    assert "FUSED True" in out
    assert "TAGS True 0 True" in out
    assert f"GROUPED (96, {4096})" in out and "SPLITS REFUSED" in out and "split_sizes=[0, 0]" in out
    assert "ATTN (1024, 2, 2048)" in out
    assert "REFUSED" in out and "fp8_autocast" in out
    n, k, m = 2048, 1024, 4096
    with TraceReader(trace) as t:
        names, sigs = t.names, t.signatures
        ops = t.ops(0)
        kinds = [names[i] for i in ops["name"]]
        gemms = [o for o, name in zip(ops, kinds) if name == "aten.mm.default"]
        # the first Linear: forward, dgrad, wgrad; each 2·N·in·out FLOPs
        assert [int(g["flops"]) for g in gemms[:3]] == [2 * n * k * m] * 3
        # the fused wgrad: an fp32 add of the weight's elements into main_grad after the second Linear's GEMMs
        adds = [json.loads(sigs[o["sig"]]) for o, name in zip(ops, kinds) if name == "aten.add_.Tensor"]
        assert any(int(np.prod(s[1][0])) == m * k and s[2][0] == "float32" for s in adds), adds
        attention = [name for name in kinds if "attention" in name]
        assert attention == ["aten._scaled_dot_product_cudnn_attention.default",
                             "aten._scaled_dot_product_cudnn_attention_backward.default"], attention
        # grouped-query attention runs natively: no copy expands the 4 key/value heads to 16
        assert not any(name in ("aten.repeat_interleave.self_int", "aten.expand.default") for name in kinds)


def test_without_the_option_there_is_no_transformer_engine(tmp_path, stub_cache):
    proc, _ = run(tmp_path, stub_cache)
    assert proc.returncode != 0
    assert "No module named 'transformer_engine'" in proc.stdout + proc.stderr
