"""Which BatchNorm dtype mixes a CUDA GPU accepts, forward and backward (python groundtruth/deepspeed/bn_dtypes.py on a
GPU; result in h200x2/bn_dtypes.txt): the simulation refuses what the GPU refuses (stubs/phantora_stubs/cuda_checks.py)."""
import torch
torch.cuda.set_device(0)
x = torch.randn(2, 8, 4, 4, device="cuda")


def case(name, weight_dtype, input_dtype):
    bn = torch.nn.BatchNorm2d(8).cuda()
    for p in bn.parameters():
        p.data = p.data.to(weight_dtype)
    inp = x.to(input_dtype).requires_grad_()
    try:
        bn(inp)
        fwd = "ok"
    except RuntimeError as e:
        fwd = str(e).splitlines()[0]
    try:
        bn(inp).float().sum().backward()
        bwd = "ok"
    except RuntimeError as e:
        bwd = str(e).splitlines()[0]
    print("CASE", name, "forward:", fwd, "| backward:", bwd, flush=True)


case("fp32 weights, fp32 input", torch.float32, torch.float32)
case("fp32 weights, bf16 input", torch.float32, torch.bfloat16)
case("bf16 weights, bf16 input, fp32 stats", torch.bfloat16, torch.bfloat16)
case("fp16 weights, fp16 input, fp32 stats", torch.float16, torch.float16)
