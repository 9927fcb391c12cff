"""What one op costs the host, by kind of op: the same loops timed on a GPU host and under `phantora run`.

Each case is a loop that issues one kind of op on tiny CUDA tensors (a view, an element-wise op with two or three
operands, a bf16 GEMM and convolution, a factory, a foreach op over 16 tensors, an op that autograd records, a backward
pass, a reduction, a norm, a cast, `torch.isfinite`, DeepSpeed's per-gradient overflow check (one check: 13 ops), a
module call, an optimizer step...), so small that every kernel finishes before the host has issued the next:
the loop's time is the host's. Each case's time per op is the median of repeats of `time.perf_counter` around the
loop and a `torch.cuda.synchronize()`. Under `phantora run` the clock is the rank's simulated one, so the same script
prints what the modelled host CPU charges for each op (docs/host-cpu.md).

    python groundtruth/hostcpu/op_costs.py OUT.json                       # on a GPU host
    phantora run --gpus-per-node 1 --quiet --no-trace -- python groundtruth/hostcpu/op_costs.py SIM.json
    python groundtruth/hostcpu/op_costs.py --compare OUT.json SIM.json    # the two side by side
"""

from __future__ import annotations

import json
import statistics
import sys
import time

N = 400              # ops per timed loop
REPEATS = 9          # timed loops per case (the median is kept), after one untimed


def _cases() -> dict:
    import torch
    import torch.nn.functional as F

    dev = "cuda"
    x, y, z = (torch.full((256,), v, device=dev) for v in (1.0, 2.0, 3.0))
    out = torch.empty(256, device=dev)
    a, b = (torch.randn(64, 64, device=dev, dtype=torch.bfloat16) for _ in range(2))
    img = torch.randn(1, 8, 16, 16, device=dev, dtype=torch.bfloat16)
    w = torch.randn(8, 8, 3, 3, device=dev, dtype=torch.bfloat16)
    xs = [torch.ones(64, device=dev) for _ in range(16)]
    ys = [torch.ones(64, device=dev) for _ in range(16)]
    wg = torch.ones(256, device=dev, requires_grad=True)
    lin = torch.nn.Linear(64, 64, device=dev)
    ln = torch.nn.LayerNorm(64, device=dev)
    h = torch.randn(8, 64, device=dev)
    params = [torch.nn.Parameter(torch.randn(64, device=dev)) for _ in range(16)]
    for p in params:
        p.grad = torch.randn_like(p)
    adamw = torch.optim.AdamW(params, lr=1e-3, foreach=True)
    idx = torch.arange(0, 256, 2, device=dev)
    xb = torch.ones(256, device=dev, dtype=torch.bfloat16)
    flag = torch.zeros(1, device=dev)

    def view(n):
        for _ in range(n):
            x.view(16, 16)

    def transpose(n):
        for _ in range(n):
            a.t()

    def slice_(n):
        for _ in range(n):
            x[1:]

    def add_inplace(n):
        for _ in range(n):
            x.add_(y)

    def add(n):
        for _ in range(n):
            x + y

    def addcmul(n):
        for _ in range(n):
            torch.addcmul(x, y, z)

    def mul_out(n):
        for _ in range(n):
            torch.mul(x, y, out=out)

    def relu(n):
        for _ in range(n):
            torch.relu(x)

    def sum_(n):
        for _ in range(n):
            x.sum()

    def copy(n):
        for _ in range(n):
            out.copy_(x)

    def empty(n):
        for _ in range(n):
            torch.empty(256, device=dev)

    def zeros(n):
        for _ in range(n):
            torch.zeros(256, device=dev)

    def index_select(n):
        for _ in range(n):
            x.index_select(0, idx)

    def cat(n):
        for _ in range(n):
            torch.cat((x, y, z))

    def mm(n):
        for _ in range(n):
            torch.mm(a, b)

    def conv2d(n):
        for _ in range(n):
            F.conv2d(img, w, padding=1)

    def foreach_add16(n):
        for _ in range(n):
            torch._foreach_add_(xs, ys)

    def recorded_mul(n):                 # autograd records a node per op
        for _ in range(n):
            wg * x

    def backward_chain(n):               # n recorded muls, then their backward pass: per op, forward and backward
        t = wg
        for _ in range(n):
            t = t * y
        t.sum().backward()

    def amax(n):
        for _ in range(n):
            xb.amax()

    def vector_norm(n):
        for _ in range(n):
            torch.linalg.vector_norm(xb, 2.0)

    def to_float(n):                     # a cast: aten._to_copy
        for _ in range(n):
            xb.float()

    def isfinite(n):                     # composite in C++: four kernels (eq, abs, ne, mul)
        for _ in range(n):
            torch.isfinite(xb)

    def overflow_check(n):               # the per-gradient check of DeepSpeed's ZeRO 1/2 step, as plain torch
        for _ in range(n):
            flag.add_(torch.isfinite(xb.amax()).logical_and(torch.isfinite(xb.amin())).logical_not())

    def linear_module(n):
        with torch.no_grad():
            for _ in range(n):
                lin(h)

    def layer_norm_module(n):
        with torch.no_grad():
            for _ in range(n):
                ln(h)

    def adamw_step16(n):                 # one foreach AdamW step over 16 parameters
        for _ in range(n):
            adamw.step()

    return {f.__name__.rstrip("_"): f for f in (
        view, transpose, slice_, add_inplace, add, addcmul, mul_out, relu, sum_, copy, empty, zeros, index_select,
        cat, mm, conv2d, foreach_add16, recorded_mul, backward_chain, amax, vector_norm, to_float, isfinite,
        overflow_check, linear_module, layer_norm_module, adamw_step16)}


def _time(fn, n: int) -> float:
    import torch
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn(n)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n


def measure() -> dict:
    import torch
    from conversions_bench import cpu_model      # this folder's (the script's own folder is on sys.path)
    out = {}
    for name, fn in _cases().items():
        n = N // 8 if name in ("adamw_step16", "overflow_check") else N
        _time(fn, n)
        times = [_time(fn, n) for _ in range(REPEATS)]
        out[name] = {"us_per_op": statistics.median(times) * 1e6, "min_us": min(times) * 1e6,
                     "max_us": max(times) * 1e6, "ops": n, "repeats": REPEATS}
        print(f"{name:20s} {out[name]['us_per_op']:8.2f} us per op", flush=True)
    return {"cases": out, "torch": torch.__version__, "python": sys.version.split()[0],
            "gpu": torch.cuda.get_device_name(0), "cpu": cpu_model()}


def compare(real_path: str, sim_path: str) -> None:
    real = json.load(open(real_path))["cases"]
    sim = json.load(open(sim_path))["cases"]
    print(f"{'case':20s} {'measured us':>12s} {'simulated us':>13s} {'sim/real':>9s}")
    ratios = []
    for name, r in real.items():
        s = sim.get(name)
        if s is None:
            continue
        ratio = s["us_per_op"] / r["us_per_op"]
        ratios.append(ratio)
        print(f"{name:20s} {r['us_per_op']:12.2f} {s['us_per_op']:13.2f} {ratio:9.2f}")
    print(f"median sim/real {statistics.median(ratios):.2f}, range {min(ratios):.2f}-{max(ratios):.2f}")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--compare":
        compare(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 2:
        result = measure()
        with open(sys.argv[1], "w") as f:
            json.dump(result, f, indent=1)
    else:
        sys.exit(__doc__)
