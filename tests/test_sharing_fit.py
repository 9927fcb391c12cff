"""The cluster's GPU-sharing factors are what the in-situ timelines of real two-GPU FSDP steps give.

groundtruth/insitu/sharing_fit.py matches every kernel launch of a two-GPU step (2 x H200, FSDP 2) to the same
kernel in the same per-GPU step on one GPU of that host; the engine's factor of a class is the one that gives the
two-GPU steps their whole extra kernel time over the time the engine's collectives overlap in the same steps
simulated with the sharing off (h200x2-engine/; docs/network-model.md).
"""

import pytest

from phantora.cluster import NcclSpec
from phantora.paths import groundtruth_dir

from groundtruth_scripts import load_script

PAIRS = [("h200x2-nccl/g1", "h200x2-nccl/g2-default"), ("h200x2-fsdp/1b-g1-s2048-b8", "h200x2-fsdp/1b-fsdp2-s2048-b8"),
         ("h200x2-fsdp/3b-g1-s4096-b2-sel", "h200x2-fsdp/3b-fsdp2-s4096-b2-sel")]
SIMULATED = ["h200x2-engine/8b-l8-s4096-b2-none.h5", "h200x2-engine/1b-s2048-b8-none.h5",
             "h200x2-engine/3b-s4096-b2-sel.h5"]


def test_default_sharing_factors_are_the_in_situ_fit():
    fit = load_script("insitu/sharing_fit.py")
    root = groundtruth_dir() / "insitu"
    pairs = {True: [], False: []}
    for (one, two), sim in zip(PAIRS, SIMULATED):
        got = fit.samples(str(root / one / "timeline.json"), str(root / two / "timeline.json"))
        share = fit.simulated_overlap(str(root / sim))
        for cls in pairs:
            assert len(got[cls]) > 100 and 0.0 < share[cls] < 0.5
            pairs[cls].append((got[cls], share[cls]))
    nccl = NcclSpec()
    compute, memory = fit.engine_terms_factor(pairs[True]), fit.engine_terms_factor(pairs[False])
    assert nccl.sharing_compute == pytest.approx(compute, abs=0.01)
    assert nccl.sharing_memory == pytest.approx(memory, abs=0.01)
    # the two-GPU steps' kernels ran longer than the one-GPU steps' in total: the factors slow, not speed
    assert compute > 1.0 and memory > 1.0


def test_the_engine_overlaps_less_than_the_real_nccl_kernels():
    """The simulated collectives, shorter than the NCCL kernels (which hold each rank's wait for the other), overlap
    less of the compute: factors fitted over the real overlap would give these steps less than their extra time."""
    fit = load_script("insitu/sharing_fit.py")
    root = groundtruth_dir() / "insitu"
    real, sim = 0.0, 0.0
    for (one, two), trace in zip(PAIRS, SIMULATED):
        rows = fit.samples(str(root / one / "timeline.json"), str(root / two / "timeline.json"))[True]
        base = sum(r[2] for r in rows)
        real += sum(r[0] * r[2] for r in rows)
        sim += fit.simulated_overlap(str(root / trace))[True] * base
    assert sim < real


def test_memory_bound_kernels_share_hbm_with_fsdp_s_copies():
    """Two memory-bound kernels on two streams share the GPU's HBM: in every pair the element-wise kernels beside
    FSDP's copy kernels run slower than alone, and no more than about twice as slow (two streams, one bandwidth,
    plus the L2 they evict for each other); the sharing the engine does not model (docs/cost-model.md)."""
    fit = load_script("insitu/sharing_fit.py")
    root = groundtruth_dir() / "insitu"
    for one, two in PAIRS:
        rows = fit.samples_copies(str(root / one / "timeline.json"), str(root / two / "timeline.json"))[False]
        assert sum(r[1] * r[3] for r in rows) > 0          # some launches ran beside a copy
        _a, _s, c = fit.fit_copies(rows)
        assert 1.2 < c < 2.5
