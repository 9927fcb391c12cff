"""GPU memory a process holds outside PyTorch's caching allocator, stage by stage.

Run on a GPU host:  torchrun --standalone --nproc-per-node N groundtruth/devmem/probe.py OUT.json
At each stage the device's used memory (cudaMemGetInfo: total - free, which counts every process on the device: run
it alone) is compared with torch.cuda.memory_reserved(); the difference is the CUDA context, the libraries'
workspaces and NCCL's buffers. Stages: context, a bf16 GEMM (cuBLAS/cuBLASLt), SDPA (cuDNN / flash), the process
group's first collective (NCCL communicator), more communicators (new_group), and a batched send/recv.
"""
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F


def main() -> None:
    out = sys.argv[1]
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    rows = []

    def stage(name: str) -> None:
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info()
        used = total - free
        res = torch.cuda.memory_reserved()
        rows.append({"stage": name, "used": used, "reserved": res, "outside": used - res})

    torch.zeros(1, device="cuda")
    stage("context")
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    (a @ a).sum()
    stage("gemm_bf16")
    b = torch.randn(4096, 4096, device="cuda", dtype=torch.float32)
    (b @ b).sum()
    stage("gemm_fp32")
    q = torch.randn(2, 32, 4096, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    o = F.scaled_dot_product_attention(q, q, q, is_causal=True)
    o.sum().backward()
    stage("sdpa_fwd_bwd")
    if world > 1:
        dist.init_process_group("nccl")
        t = torch.ones(1 << 20, device="cuda")
        dist.all_reduce(t)
        stage("nccl_world_allreduce")
        dist.all_gather_into_tensor(torch.empty(world << 20, device="cuda"), t)
        dist.reduce_scatter_tensor(torch.empty(1 << 20, device="cuda"), torch.ones(world << 20, device="cuda"))
        stage("nccl_world_ag_rs")
        groups = []
        for i in range(4):
            g = dist.new_group(list(range(world)))
            dist.all_reduce(t, group=g)
            groups.append(g)
            stage(f"nccl_groups_{i + 2}")
        peer = (rank + 1) % world
        ops = [dist.P2POp(dist.isend, t, peer), dist.P2POp(dist.irecv, torch.empty_like(t), (rank - 1) % world)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        stage("nccl_p2p")
        dist.barrier()
    env = {k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "CUDA_", "PYTORCH_"))}
    rec = {"rank": rank, "world": world, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "nccl": ".".join(map(str, torch.cuda.nccl.version())), "env": env, "stages": rows}
    with open(out.replace(".json", f".rank{rank}.json"), "w") as f:
        json.dump(rec, f, indent=1)
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
