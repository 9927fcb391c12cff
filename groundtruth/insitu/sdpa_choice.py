"""Which backend `F.scaled_dot_product_attention` runs, over a grid of inputs, on the GPU it runs on.

For every case the script asks torch, for the case's query, key and value:
- which backend SDPA picks (`torch._fused_sdp_choice`, the function SDPA itself calls);
- whether each fused backend would accept the inputs (`torch.backends.cuda.can_use_*_attention`);
- and, to check the two against what really runs, the aten ops of one forward (and backward, when the inputs need
  gradients) under a dispatch mode.

The grid crosses dtypes, head sizes, causal and non-causal attention, masks, dropout, grouped-query attention,
non-square and odd sequence lengths, gradients or none, and the two memory layouts training code hands to SDPA
(heads-major as allocated, or a transposed (batch, seq, heads, dim) tensor). It prints one JSON document:

    python groundtruth/insitu/sdpa_choice.py > sdpa_choice.json

tests/test_sdpa_choice.py replays each case through the stubs' SDPA routing and compares the backends.
"""

from __future__ import annotations

import itertools
import json
import sys
import warnings

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

NAMES = {"FLASH_ATTENTION": "flash", "EFFICIENT_ATTENTION": "efficient", "CUDNN_ATTENTION": "cudnn",
         "MATH": "math", "OVERRIDEABLE": "overrideable", "ERROR": "error"}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def cases():
    """The grid: a base case (bf16, 2 x 16 heads x 1024 x 128, causal, heads-major, gradients) and variations."""
    base = dict(dtype="bf16", batch=2, heads=16, kv_heads=16, q_len=1024, kv_len=1024, head_dim=128, v_dim=None,
                causal=True, mask="none", dropout=0.0, gqa=False, layout="bhsd", grad=True)
    yield dict(base)
    for dtype, head_dim, causal, layout, grad in itertools.product(
            DTYPES, (64, 80, 96, 128, 192, 256), (True, False), ("bhsd", "bshd"), (True, False)):
        yield dict(base, dtype=dtype, head_dim=head_dim, causal=causal, layout=layout, grad=grad)
    for dtype, mask, grad in itertools.product(DTYPES, ("bool", "float", "bool_broadcast"), (True, False)):
        yield dict(base, dtype=dtype, causal=False, mask=mask, grad=grad)
    for dtype, dropout, grad in itertools.product(("bf16", "fp16"), (0.1,), (True, False)):
        yield dict(base, dtype=dtype, dropout=dropout, grad=grad)
    for kv_heads, gqa, grad, layout in itertools.product((4, 1), (True,), (True, False), ("bhsd", "bshd")):
        yield dict(base, kv_heads=kv_heads, gqa=gqa, grad=grad, layout=layout)
    for q_len, kv_len, causal, grad in itertools.product((1, 128, 1000), (1024, 1000), (True, False),
                                                         (True, False)):
        yield dict(base, q_len=q_len, kv_len=kv_len, causal=causal, grad=grad)
    for batch, heads in ((1, 1), (8, 32), (1, 64)):
        yield dict(base, batch=batch, heads=heads, kv_heads=heads)
    for dtype, head_dim, grad in itertools.product(("bf16", "fp32"), (36, 100, 264, 320), (True, False)):
        yield dict(base, dtype=dtype, head_dim=head_dim, grad=grad)
    for head_dim, v_dim, grad in itertools.product((192, 128), (128, 64), (True, False)):
        if v_dim != head_dim:
            yield dict(base, head_dim=head_dim, v_dim=v_dim, grad=grad)
    for dtype, grad in itertools.product(DTYPES, (True, False)):
        yield dict(base, dtype=dtype, gqa=True, grad=grad)                 # enable_gqa with equal heads
        yield dict(base, dtype=dtype, q_len=128, causal=True, grad=grad)   # causal, fewer queries than keys


def tensors(case):
    dtype = DTYPES[case["dtype"]]

    def make(heads, length, dim):
        if case["layout"] == "bshd":
            t = torch.randn(case["batch"], length, heads, dim, device="cuda", dtype=dtype).transpose(1, 2)
        else:
            t = torch.randn(case["batch"], heads, length, dim, device="cuda", dtype=dtype)
        return t.requires_grad_(case["grad"])

    q = make(case["heads"], case["q_len"], case["head_dim"])
    k = make(case["kv_heads"], case["kv_len"], case["head_dim"])
    v = make(case["kv_heads"], case["kv_len"], case["v_dim"] or case["head_dim"])
    mask = None
    if case["mask"] == "bool":
        mask = torch.rand(case["batch"], case["heads"], case["q_len"], case["kv_len"], device="cuda") > 0.1
    elif case["mask"] == "bool_broadcast":
        mask = torch.ones(case["q_len"], case["kv_len"], device="cuda", dtype=torch.bool).tril()
    elif case["mask"] == "float":
        mask = torch.zeros(case["batch"], 1, case["q_len"], case["kv_len"], device="cuda", dtype=dtype)
    return q, k, v, mask


class AttentionOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names = []
        self.args = None           # the first attention op's arguments: tensors as [dtype, shape], the rest as is

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket.__name__)
        if "attention" in name or name in ("bmm", "_softmax", "_softmax_backward_data", "baddbmm"):
            if name not in self.names:
                self.names.append(name)
            if self.args is None and "attention" in name:
                self.args = [[str(a.dtype).replace("torch.", ""), list(a.shape)] if isinstance(a, torch.Tensor)
                             else a for a in args]
        return func(*args, **(kwargs or {}))


def backend_of(value) -> str:
    members = {int(v): name for name, v in torch.nn.attention.SDPBackend.__members__.items()}
    return NAMES.get(members.get(int(value), ""), str(value))


def run(case):
    q, k, v, mask = tensors(case)
    args = dict(attn_mask=mask, dropout_p=case["dropout"], is_causal=case["causal"], enable_gqa=case["gqa"])
    row = {"case": case}
    try:
        row["choice"] = backend_of(torch._fused_sdp_choice(q, k, v, args["attn_mask"], args["dropout_p"],
                                                           args["is_causal"], scale=None,
                                                           enable_gqa=case["gqa"]))
    except Exception as e:                                  # noqa: BLE001 - recorded, not hidden
        row["choice"] = f"raises {type(e).__name__}"
    params = torch.backends.cuda.SDPAParams(q, k, v, mask, case["dropout"], case["causal"], case["gqa"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        row["can_use"] = {name: bool(getattr(torch.backends.cuda, f"can_use_{name}_attention")(params, False))
                          for name in ("flash", "efficient", "cudnn")}
    mode = AttentionOps()
    try:
        with mode:
            out = F.scaled_dot_product_attention(q, k, v, **args)
            if case["grad"]:
                out.backward(torch.ones_like(out))
        torch.cuda.synchronize()
        row["ops"] = mode.names
        row["args"] = mode.args
    except Exception as e:                                  # noqa: BLE001
        row["ops"] = mode.names
        row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    return row


def main() -> int:
    rows = [run(c) for c in cases()]
    doc = {"torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
           "gpu": torch.cuda.get_device_name(), "capability": list(torch.cuda.get_device_capability()),
           "priority": [backend_of(int(i)) for i in torch._C._get_sdp_priority_order()], "rows": rows}
    json.dump(doc, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
