"""The cluster's GPU-sharing factors are what the in-situ timelines of real two-GPU FSDP steps give.

groundtruth/insitu/sharing_fit.py matches every kernel launch of a two-GPU step (2 x H200, FSDP 2) to the same
kernel in the same per-GPU step on one GPU of that host; the engine's factor of a class is the one that gives the
two-GPU steps their whole extra kernel time over the time NCCL overlapped (docs/network-model.md).
"""

import pytest

from phantora.cluster import NcclSpec
from phantora.paths import groundtruth_dir

from groundtruth_scripts import load_script

PAIRS = [("h200x2-nccl/g1", "h200x2-nccl/g2-default"), ("h200x2-fsdp/1b-g1-s2048-b8", "h200x2-fsdp/1b-fsdp2-s2048-b8"),
         ("h200x2-fsdp/3b-g1-s4096-b2-sel", "h200x2-fsdp/3b-fsdp2-s4096-b2-sel")]


def test_default_sharing_factors_are_the_in_situ_fit():
    fit = load_script("insitu/sharing_fit.py")
    root = groundtruth_dir() / "insitu"
    pooled = {True: [], False: []}
    for one, two in PAIRS:
        got = fit.samples(str(root / one / "timeline.json"), str(root / two / "timeline.json"))
        for cls in pooled:
            assert len(got[cls]) > 100
            pooled[cls] += got[cls]
    nccl = NcclSpec()
    compute, memory = fit.engine_factor(pooled[True]), fit.engine_factor(pooled[False])
    assert nccl.sharing_compute == pytest.approx(compute, abs=0.01)
    assert nccl.sharing_memory == pytest.approx(memory, abs=0.01)
    # the two-GPU steps' compute kernels ran longer than the one-GPU steps' in total: the factors slow, not speed
    assert compute > 1.0 and memory > 1.0
