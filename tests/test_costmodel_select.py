"""Which profiles cost a GPU's kernels (phantora/costmodel/select.py)."""

import pytest

from phantora.costmodel.families import work
from phantora.gpus import load_gpu
def test_a_signature_missing_from_a_gpus_own_profile_comes_from_its_architecture_peer():
    """An H200 kernel its own database lacks but the H100's has is the H100's time scaled by the two GPUs' roofline
    ratio (CROSS_GPU), not a roofline estimate; and the other way round."""
    from phantora.costmodel.profiledb import ProfileDB
    from phantora.costmodel.select import default_cost_model, profiles_dir
    from phantora.costmodel.signature import Signature
    from phantora.engine.ops import CostSource

    for gpu, peer in (("h200-sxm-141gb", "h100-sxm-80gb"), ("h100-sxm-80gb", "h200-sxm-141gb")):
        own = ProfileDB.open(profiles_dir() / f"{gpu}.h5")
        other = ProfileDB.open(profiles_dir() / f"{peer}.h5")
        # (GEMMs missing from the own profile may be interpolated from its neighbours first: take other ops)
        missing = [(k, r) for k, r in other.items()
                   if k not in own and not k.startswith(('["aten.mm', '["aten.addmm', '["aten.bmm'))]
        assert missing, f"every signature of {peer} is in {gpu}'s profile"
        model = default_cost_model(load_gpu(gpu))
        key, rec = missing[0]
        cost = model.estimate(Signature.from_key(key))
        assert cost.source == CostSource.CROSS_GPU
        ratio = model.roofline.duration(work(Signature.from_key(key))) / \
            model.fallback_roofline.duration(work(Signature.from_key(key)))
        # the peer's event time less what events add on the peer (its preset), scaled
        peer_us = rec.median_us - load_gpu(peer).event_overhead_us
        assert cost.duration_s == pytest.approx(peer_us * 1e-6 * ratio, rel=1e-9)
