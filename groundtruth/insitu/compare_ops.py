"""Compare the GPU time of a simulated trace's ops with an in-situ profile of the same run, op by op.

    python groundtruth/insitu/compare_ops.py TRACE.h5 RANK OPS.json [--shapes OP]

OPS.json is what a workload's `--kernel-profile DIR` writes (presets/workloads/workload_common.py): per (op, input
shapes) the GPU time the op launched itself over the recorded steps (3-4). The trace's side is the same number of
iterations of RANK after its first (its kernels' costed durations). Prints each op's total, simulated against in
situ, largest first (and, where a timeline.json is beside OPS.json, all kernels but NCCL's); with `--shapes OP` (e.g. aten.mm) that op per shape of its first two inputs, and the
ratio over the shapes found in both, weighted by the in-situ time.

In-situ call counts include op events that launched no kernel: where non-reentrant activation checkpointing stops
its recomputation early, the last op's event is recorded (the profiler enters it before autograd saves its inputs
and stops) but nothing runs; with full checkpointing the FFN's down projection shows 4 calls per layer and step in
ops.json against 3 kernels in launchers.json (and in the simulation), so the in-situ mean per call of that shape is
low by a quarter. Totals are not affected.

The in-situ times are of profiled steps: torch.profiler slows the host, which lowers the GPU's duty, and with it its
power, and can raise its clock (groundtruth/deepspeed/README.md, "The pipeline engine's rows").
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

from phantora.engine.ops import OpKind
from phantora.trace.reader import TraceReader

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare_kernels import kernels  # noqa: E402


def simulated(trace: str, rank: int, steps: int) -> tuple[dict, dict]:
    with TraceReader(trace) as r:
        ops, names, sigs = r.ops(rank), r.names, r.signatures
        marks = r.iterations(rank, ops)
    if len(marks) < steps + 2:
        raise SystemExit(f"{trace}: rank {rank} has {len(marks)} iteration marks; {steps + 2} are needed")
    rows = ops[(ops["kind"] == int(OpKind.KERNEL)) & (ops["start"] >= marks[1]) & (ops["start"] < marks[1 + steps])]
    by_op: dict[str, list] = defaultdict(lambda: [0, 0.0])
    by_shape: dict[tuple, list] = defaultdict(lambda: [0, 0.0])
    for row in rows:
        name = ".".join(names[row["name"]].split(".")[:2])     # aten.mul.Tensor -> aten.mul, as the profiler names it
        by_op[name][0] += 1
        by_op[name][1] += float(row["duration"]) * 1e6
        shapes = json.loads(sigs[row["sig"]])[1][:2]
        by_shape[(name, json.dumps(shapes))][0] += 1
        by_shape[(name, json.dumps(shapes))][1] += float(row["duration"]) * 1e6
    return by_op, by_shape


def in_situ(path: str) -> tuple[int, dict, dict]:
    data = json.loads(open(path).read())
    by_op: dict[str, list] = defaultdict(lambda: [0, 0.0])
    by_shape: dict[tuple, list] = defaultdict(lambda: [0, 0.0])
    for o in data["ops"]:
        name = o["op"].replace("aten::", "aten.")
        by_op[name][0] += o["count"]
        by_op[name][1] += o["self_device_us"]
        by_shape[(name, json.dumps(o["shapes"][:2]))][0] += o["count"]
        by_shape[(name, json.dumps(o["shapes"][:2]))][1] += o["self_device_us"]
    return int(data["steps"]), by_op, by_shape


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("trace")
    p.add_argument("rank", type=int)
    p.add_argument("ops_json")
    p.add_argument("--shapes", default=None, metavar="OP", help="also compare this op (e.g. aten.mm) per input shape")
    p.add_argument("--top", type=int, default=20)
    a = p.parse_args(argv)
    steps, real_op, real_shape = in_situ(a.ops_json)
    sim_op, sim_shape = simulated(a.trace, a.rank, steps)
    print(f"{steps} steps; GPU time in ms: simulated (calls) / in situ (calls)")
    timeline = Path(a.ops_json).with_name("timeline.json")
    if timeline.exists():            # every kernel, also those no aten op launched (a C++ extension's)
        tl = json.loads(timeline.read_text())
        real_total = sum(d for n, _st, _s, d in kernels(tl) if "nccl" not in tl["names"][n].lower())
        print(f"  {'all kernels but NCCL (timeline.json)':58s} {sum(t for _c, t in sim_op.values()) / 1e3:9.2f}"
              f"          / {real_total / 1e3:9.2f}")
    keys = sorted(set(sim_op) | set(real_op), key=lambda k: -max(sim_op.get(k, [0, 0])[1], real_op.get(k, [0, 0])[1]))
    for k in keys[:a.top]:
        (sc, st), (rc, rt) = sim_op.get(k, [0, 0.0]), real_op.get(k, [0, 0.0])
        print(f"  {k[:58]:58s} {st / 1e3:9.2f} ({sc:6d}) / {rt / 1e3:9.2f} ({rc:6d})")
    if a.shapes:
        op = ".".join(a.shapes.replace("::", ".").split(".")[:2])
        num = den = 0.0
        print(f"{op} per shape: mean µs simulated / in situ")
        for (name, shapes), (sc, st) in sorted(sim_shape.items(), key=lambda kv: -kv[1][1]):
            if name != op:
                continue
            rc, rt = real_shape.get((name, shapes), [0, 0.0])
            ratio = f"{(st / sc) / (rt / rc):.3f}" if rc else "-"
            print(f"  {shapes:40s} {st / sc:9.1f} / {rt / rc if rc else 0:9.1f}  x{ratio}")
            if rc:
                num += st / sc * rc
                den += rt
        if den:
            print(f"  over the shapes in both: simulated / in situ = {num / den:.3f}")


if __name__ == "__main__":
    main()
