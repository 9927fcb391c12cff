"""How much a GPU kernel slows down while NCCL runs beside it, and NCCL while the kernel runs (device tool).

    torchrun --nproc-per-node 2 -m phantora.probes.overlapprobe --out OUT.json [--seconds 0.5]

Every rank times each compute kernel (bf16 GEMMs, flash attention, HBM copy and add) on its own stream, alone and
while a collective (all-gather, reduce-scatter, all-reduce) runs back to back on a second stream for the whole
window, and the collective alone and while the kernel runs back to back beside it. Times are CUDA-event means over
a window of about `--seconds`; rank 0 writes them with the GPU, torch and NCCL versions and the NCCL_* settings of
the run (run it again under NCCL_MAX_NCHANNELS=... to see the effect of the channel count). Nothing is changed on
the GPU (no clock or power setting). docs/network-model.md ("Collectives and kernels sharing a GPU") summarizes
what it measured; the engine models the sharing with factors fitted in situ (groundtruth/insitu/sharing_fit.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def _kernels(torch, dev):
    bf16 = torch.bfloat16
    a = torch.randn(8192, 8192, device=dev, dtype=bf16)
    b = torch.randn(8192, 8192, device=dev, dtype=bf16)
    x = torch.randn(8192, 4096, device=dev, dtype=bf16)
    w = torch.randn(4096, 14336, device=dev, dtype=bf16)
    q = torch.randn(1, 32, 4096, 128, device=dev, dtype=bf16)
    src = torch.empty(1 << 29, device=dev, dtype=bf16).normal_()        # 1 GiB
    dst = torch.empty_like(src)
    y = torch.empty_like(src)
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def attn():
        from torch.nn.attention import SDPBackend, sdpa_kernel
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            sdpa(q, q, q, is_causal=True)

    return {
        "gemm_8192x8192x8192": (lambda: torch.mm(a, b), 2 * 8192 ** 3, 0),
        "gemm_8192x4096x14336": (lambda: torch.mm(x, w), 2 * 8192 * 4096 * 14336, 0),
        "flash_attn_fwd_s4096": (attn, 4 * 32 * 4096 * 4096 * 128 // 2, 0),
        "copy_1GiB": (lambda: dst.copy_(src), 0, 2 * src.numel() * 2),
        "add_1GiB": (lambda: torch.add(src, dst, out=y), 0, 3 * src.numel() * 2),
    }


def _collectives(torch, dist, dev, world):
    """Collectives as the current stream sees them: NCCL runs on the process group's own stream, and `wait()`
    makes the current stream wait for it (without blocking the host), so CUDA events on the current stream time
    them."""
    out = {}
    ag_in = torch.randn(32 << 20, device=dev, dtype=torch.bfloat16)            # 64 MiB per rank
    ag_out = torch.empty(ag_in.numel() * world, device=dev, dtype=torch.bfloat16)
    out["all_gather_bf16_64MiB"] = (lambda: dist.all_gather_into_tensor(ag_out, ag_in, async_op=True).wait(),
                                    ag_out.numel() * 2)
    rs_in = torch.randn(64 << 20, device=dev, dtype=torch.float32)             # 256 MiB in
    rs_out = torch.empty(rs_in.numel() // world, device=dev, dtype=torch.float32)
    out["reduce_scatter_fp32_256MiB"] = (lambda: dist.reduce_scatter_tensor(rs_out, rs_in, async_op=True).wait(),
                                         rs_in.numel() * 4)
    ar = torch.randn(64 << 20, device=dev, dtype=torch.bfloat16)               # 128 MiB
    out["all_reduce_bf16_128MiB"] = (lambda: dist.all_reduce(ar, async_op=True).wait(), ar.numel() * 2)
    return out


def _mean_ms(torch, stream, fn, n):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(stream):
        start.record(stream)
        for _ in range(n):
            fn()
        end.record(stream)
    return start, end


def main(argv: list[str] | None = None) -> int:
    import torch
    import torch.distributed as dist

    p = argparse.ArgumentParser(prog="python -m phantora.probes.overlapprobe", description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="JSON file rank 0 writes")
    p.add_argument("--seconds", type=float, default=0.5, help="length of each timed window (default 0.5)")
    args = p.parse_args(argv)

    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    dist.init_process_group("nccl", device_id=dev)
    rank, world = dist.get_rank(), dist.get_world_size()
    comp, comm = torch.cuda.Stream(), torch.cuda.Stream()
    kernels = _kernels(torch, dev)
    colls = _collectives(torch, dist, dev, world)

    def sync():
        torch.cuda.synchronize()
        dist.barrier()
        torch.cuda.synchronize()

    def alone(stream, fn, n):
        sync()
        s, e = _mean_ms(torch, stream, fn, n)
        torch.cuda.synchronize()
        return s.elapsed_time(e) / n

    def agreed(n: int) -> int:
        """The largest of the ranks' counts: every rank must launch the same number of collectives."""
        nt = torch.tensor([n], device=dev)
        dist.all_reduce(nt, op=dist.ReduceOp.MAX)
        return int(nt.item())

    def calibrate(stream, fn):
        for _ in range(3):
            with torch.cuda.stream(stream):
                fn()
        t = alone(stream, fn, 5)
        n = agreed(max(int(args.seconds * 1e3 / t), 5))
        return n, alone(stream, fn, n)

    def beside(stream, fn, n, other_stream, other_fn, n_other):
        """Mean ms of `fn` on `stream` while `other_fn` runs `n_other` times on `other_stream` (launched first),
        and how long the other ran in all."""
        sync()
        os_, oe = _mean_ms(torch, other_stream, other_fn, n_other)
        s_, e = _mean_ms(torch, stream, fn, n)
        torch.cuda.synchronize()
        return s_.elapsed_time(e) / n, os_.elapsed_time(oe)

    k_alone = {name: calibrate(comp, fn) for name, (fn, _, _) in kernels.items()}
    c_alone = {name: calibrate(comm, fn) for name, (fn, _) in colls.items()}
    rows = []
    for kname, (kfn, flops, nbytes) in kernels.items():
        nk, tk = k_alone[kname]
        for cname, (cfn, cbytes) in colls.items():
            nc, tc = c_alone[cname]
            # each timed while the other runs back to back for longer than its window (both ways round)
            k_with, c_cover = beside(comp, kfn, nk, comm, cfn, agreed(int(1.3 * nk * tk / tc) + 2))
            c_with, _ = beside(comm, cfn, nc, comp, kfn, agreed(int(1.3 * nc * tc / tk) + 2))
            rows.append({"kernel": kname, "collective": cname, "kernel_ms": tk, "kernel_with_collective_ms": k_with,
                         "collective_ms": tc, "collective_with_kernel_ms": c_with,
                         "kernel_slowdown": k_with / tk, "collective_slowdown": c_with / tc,
                         "covered": c_cover >= nk * k_with, "kernel_flops": flops, "kernel_bytes": nbytes,
                         "collective_bytes": cbytes})
            if rank == 0:
                print(f"{kname:>22} | {cname:>26}: kernel {tk:8.3f} -> {k_with:8.3f} ms (x{k_with / tk:.3f}), "
                      f"collective {tc:8.3f} -> {c_with:8.3f} ms (x{c_with / tc:.3f})", flush=True)
    gathered = [None] * world
    dist.all_gather_object(gathered, rows)
    if rank == 0:
        props = torch.cuda.get_device_properties(dev)
        info = {"gpu": torch.cuda.get_device_name(dev), "sms": props.multi_processor_count, "world": world,
                "torch": torch.__version__, "cuda": torch.version.cuda,
                "nccl": ".".join(map(str, torch.cuda.nccl.version())),
                "env": {k: v for k, v in os.environ.items() if k.startswith("NCCL_")},
                "command": "python -m phantora.probes.overlapprobe " + " ".join(sys.argv[1:])}
        with open(args.out, "w") as f:
            json.dump({"info": info, "ranks": gathered}, f, indent=1)
            f.write("\n")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
