"""Host memory traffic of DeepSpeed's CPU Adam (the ZeRO-Offload optimizer step), for the host preset's
`cpu_adam_gbps`.

    OMP_NUM_THREADS=1 python groundtruth/deepspeed/cpu_adam_bench.py --elements 100000000

Times `DeepSpeedCPUAdam.step()` over one fp32 parameter of N elements (fp32 gradient and states), 3 warm-up steps (the
first builds or loads the compiled op; `--start-at` waits after it) and 5 timed, and prints one JSON line: the median
step time and the traffic the loop moves, 28 bytes per element (p, g, m, v read; p, m, v written) over that time.
"""

import argparse
import json
import os
import statistics
import time

import torch


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--elements", type=int, default=100_000_000)
    p.add_argument("--start-at", type=float, default=0.0,
                   help="wall-clock time (time.time()) to start timing at, after the set-up (processes started "
                        "together time together)")
    p.add_argument("--tag", default="", help="a label copied into each output line (which of several processes)")
    args = p.parse_args()
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    param = torch.nn.Parameter(torch.randn(args.elements))
    param.grad = torch.randn(args.elements)
    opt = DeepSpeedCPUAdam([param], lr=1e-4, adamw_mode=True)
    opt.step()                              # builds (or loads) the compiled op before the start
    late = max(0.0, time.time() - args.start_at) if args.start_at else 0.0   # set-up overran --start-at
    time.sleep(max(0.0, args.start_at - time.time()))
    times = []
    for i in range(7):
        t0 = time.perf_counter()
        opt.step()
        if i >= 2:
            times.append(time.perf_counter() - t0)
    median = statistics.median(times)
    print(json.dumps({"elements": args.elements, "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
                      "torch_threads": torch.get_num_threads(), "step_s": times, "median_step_s": median,
                      "gbps": 28 * args.elements / median / 1e9, "tag": args.tag, "late_s": late}), flush=True)


if __name__ == "__main__":
    main()
