"""A plain PyTorch script exercising device queries, attention, events, host reads and the clock.

Prints one JSON object; the attention kernels it ran are visible in the op log.
"""

import json
import time

import torch
import torch.nn.functional as F

out = {}
out["is_available"] = torch.cuda.is_available()
out["device_count"] = torch.cuda.device_count()
out["device_name"] = torch.cuda.get_device_name()
props = torch.cuda.get_device_properties(0)
out["capability"] = list(torch.cuda.get_device_capability())
out["sm_count"] = props.multi_processor_count
out["total_memory"] = props.total_memory
out["bf16"] = torch.cuda.is_bf16_supported()

# attention: bf16 without a mask (flash), fp32 with a boolean mask (memory-efficient), and under inference mode
q = torch.randn(2, 8, 512, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
F.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
torch.cuda.synchronize()
q32 = torch.randn(2, 8, 128, 64, device="cuda")
mask = torch.ones(128, 128, device="cuda", dtype=torch.bool).tril()
F.scaled_dot_product_attention(q32, q32, q32, attn_mask=mask)
torch.cuda.synchronize()
with torch.inference_mode():
    F.scaled_dot_product_attention(q.detach(), q.detach(), q.detach())
torch.cuda.synchronize()

# flex attention (its eager path runs as a higher-order op)
from torch.nn.attention.flex_attention import create_block_mask, flex_attention


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


fq = torch.randn(1, 2, 256, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
flex_attention(fq, fq, fq, block_mask=create_block_mask(causal, 1, 1, 256, 256, device="cuda")).sum().backward()
torch.cuda.synchronize()

# modules moved with swap_tensors, streams and record_stream
m = torch.nn.Linear(16, 16, device="meta").to_empty(device="cuda")
torch.__future__.set_swap_module_params_on_conversion(True)
m2 = torch.nn.Linear(16, 16).cuda()
torch.__future__.set_swap_module_params_on_conversion(False)
out["moved_devices"] = sorted({str(p.device) for p in [*m.parameters(), *m2.parameters()]})
side = torch.cuda.Stream()
with torch.cuda.stream(side):
    z = m2(torch.randn(4, 16, device="cuda"))
    z.record_stream(side)
torch.cuda.current_stream().wait_stream(side)
out["side_stream"] = side.stream_id

# events against perf_counter around GPU-bound work
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
torch.cuda.synchronize()
t0 = time.perf_counter()
start.record()
for _ in range(10):
    b = a @ a
end.record()
torch.cuda.synchronize()
t1 = time.perf_counter()
out["event_ms"] = start.elapsed_time(end)
out["perf_ms"] = (t1 - t0) * 1e3
out["n_matmul"] = 10
out["matmul_n"] = 8192

# host reads
small = torch.tensor([1.5, 2.0, 4.0], device="cuda")
out["small_sum"] = (small * 2).sum().item()
out["small_list"] = (small + 1).tolist()
out["unknown_item"] = b.sum().item()
out["unknown_int"] = b.argmax().item()
out["nonzero_known"] = list(torch.nonzero(small > 1.8).shape)
out["nonzero_unknown"] = list(torch.nonzero(b[:3, :5]).shape)

# an op with no fake implementation
lib = torch.library.Library("phantora_test", "DEF")
lib.define("twice(Tensor x) -> Tensor")
lib.impl("twice", lambda x: x * 2, "CPU")
try:
    torch.ops.phantora_test.twice(small)  # UNSUPPORTED-LINE
    out["unsupported_error"] = None
except Exception as exc:  # noqa: BLE001
    out["unsupported_error"] = [type(exc).__name__, str(exc)]

# triton on a CPU-only torch
def double(t):
    return t * 2
try:
    import triton
    out["triton"] = {"stub": bool(getattr(triton, "__phantora_stub__", False)), "cdiv": triton.cdiv(10, 4)}
    # what torch's flop counter and autotuned kernels do with triton imported first (DeepSpeed, Megatron-core)
    from triton.runtime.jit import JITFunction
    import torch.utils.flop_counter  # noqa: F401
    out["triton"]["isinstance"] = isinstance(double, JITFunction)
    out["triton"]["config"] = type(triton.Config({"BLOCK": 128}, num_warps=4)).__name__
except ImportError:
    out["triton"] = None

# the clock
t0 = time.perf_counter()
wall0 = time.time()
time.sleep(30.0)
out["sleep_perf_s"] = time.perf_counter() - t0
out["sleep_time_s"] = time.time() - wall0
print(json.dumps(out))
