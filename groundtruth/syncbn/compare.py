"""The cost model's times for SyncBatchNorm's kernels against their measured times (syncbn_kernels.py's JSON).

    python groundtruth/syncbn/compare.py groundtruth/syncbn/h200/syncbn-kernels-h200.json [--gpu h200-sxm-141gb]

Builds each measured call's signature on meta tensors (as a simulated rank's interceptor does), costs it with the
roofline of the GPU preset (no kernel profile) as the stream time of back-to-back calls (docs/cost-model.md, "Stream
time"), which is what the measurement times, and prints measured / costed per kernel."""
import argparse
import json

import torch

from phantora.costmodel.model import CostModel
from phantora.costmodel.signature import signature_of
from phantora.gpus import load_gpu

aten = torch.ops.aten


def calls(shape, dtype, world):
    m = dict(device="meta")
    x = torch.empty(shape, dtype=dtype, **m)
    c = shape[1]
    v = torch.empty(c, **m)
    wc = torch.empty(world, c, **m)
    counts = torch.empty(world, **m)
    return {
        "batch_norm_stats": (aten.batch_norm_stats.default, (x, 1e-5)),
        "batch_norm_gather_stats_with_counts": (aten.batch_norm_gather_stats_with_counts.default,
                                                (x, wc, wc, v, v, 0.1, 1e-5, counts)),
        "batch_norm_elemt": (aten.batch_norm_elemt.default, (x, v, v, v, v, 1e-5)),
        "batch_norm_backward_reduce": (aten.batch_norm_backward_reduce.default, (x, x, v, v, v, True, True, True)),
        "batch_norm_backward_elemt": (aten.batch_norm_backward_elemt.default,
                                      (x, x, v, v, v, v, v, torch.empty(world, dtype=torch.int32, **m))),
    }


def main():
    p = argparse.ArgumentParser()
    p.add_argument("measured")
    p.add_argument("--gpu", default="h200-sxm-141gb")
    a = p.parse_args()
    data = json.load(open(a.measured))
    model = CostModel(load_gpu(a.gpu))              # no profile: the roofline, as a stream time
    print(f"{data['gpu']} (torch {data['torch']}) against the {a.gpu} roofline")
    print(f"{'kernel':38s} {'shape':20s} {'dtype':9s} {'measured':>9s} {'costed':>8s} {'ratio':>6s}")
    for r in data["rows"]:
        func, args = calls(tuple(r["shape"]), getattr(torch, r["dtype"]), data["world"])[r["op"]]
        costed = model.estimate(signature_of(func, args)).duration_us
        print(f"{r['op']:38s} {str(r['shape']):20s} {r['dtype']:9s} {r['us']:8.1f}u {costed:7.1f}u "
              f"{r['us'] / costed:6.2f}")


if __name__ == "__main__":
    main()
