"""The convolution entries of the Hopper efficiency table (phantora/costmodel/roofline.py) from measured profiles.

Groups the convolution kernels of a profile database by op (forward, backward) and variant (depthwise, narrow,
ordinary; channels-last or not: `conv_variant` in phantora/costmodel/families/gemm.py), and prints each group's
median of measured time over the time the family entry `conv` alone predicts, and the entry that divides both of
that entry's efficiencies by the median.

    python groundtruth/insitu/h200-conv-grid/conv_variants.py presets/profiles/h200-sxm-141gb.h5
"""
import statistics
import sys
from collections import defaultdict

from phantora.costmodel import families as fam
from phantora.costmodel.profiledb import ProfileDB
from phantora.costmodel.roofline import EfficiencyTable, FamilyEfficiency, RooflineModel, default_table
from phantora.costmodel.signature import Signature
from phantora.gpus import load_gpu


def main(path, gpu_name="h200-sxm-141gb"):
    gpu = load_gpu(gpu_name)
    base = default_table(gpu)
    conv = base.get(fam.CONV)
    plain = RooflineModel(gpu, EfficiencyTable({fam.CONV: conv, fam.OTHER: base.get(fam.OTHER)}, base.latency_s,
                                               base.pcie_efficiency, "", {}, base.event_overhead_s))
    groups = defaultdict(list)
    for key, rec in ProfileDB.open(path).items():
        sig = Signature.from_key(key)
        if sig.name not in ("convolution", "convolution_backward"):
            continue
        w = fam.work(sig)
        groups[(w.op, w.variant)].append(rec.median_us * 1e-6 / plain.duration(w))
    for (op, variant), ratios in sorted(groups.items()):
        m = statistics.median(ratios)
        key = f"op:{op}.{variant}" if variant else f"op:{op}"
        print(f'    "{key}": ({conv.compute / m:.3g}, {conv.memory / m:.3g}, {conv.w0_flops:.3g}, '
              f'{conv.b0_bytes:.3g}),  # {len(ratios)} kernels, median {m:.2f} x the conv entry '
              f'(range {min(ratios):.2f}-{max(ratios):.2f})')


if __name__ == "__main__":
    main(*sys.argv[1:])
