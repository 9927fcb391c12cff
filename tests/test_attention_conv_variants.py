"""Attention and convolution kernels without a profile, costed by the roofline model, against kernels measured on
H200 and H100 GPUs (`phantora profile`'s timing of each kernel alone).

- SDPA (groundtruth/insitu/h200-sdpa-grid/kernels-h200.h5): cuDNN attention forward and backward on one H200 over
  sequence length, head dimension 64/128/256, causal / no mask / a mask over queries and keys / a key-padding
  mask, and dropout 0 or 0.1. A variant's time is 0.9 to 6 times that of the plain kernel of equal FLOPs.
- Convolutions: the H200 profile's (ResNet-50, SD 1.5 UNet, depthwise layers; NCHW and channels-last; bf16 and
  fp32) and the H100 profile's, whose calibration convolutions are no part of the H200 fit.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import pytest

from phantora.costmodel import families as fam
from phantora.costmodel.families import attention
from phantora.costmodel.profiledb import ProfileDB
from phantora.costmodel.roofline import RooflineModel, default_table
from phantora.costmodel.signature import Signature
from phantora.errors import PhantoraError
from phantora.gpus import load_gpu

ROOT = Path(__file__).resolve().parent.parent
SDPA_KERNELS = ROOT / "groundtruth" / "insitu" / "h200-sdpa-grid" / "kernels-h200.h5"
PROFILES = ROOT / "presets" / "profiles"


def _ratios(db_path, gpu_name, names, keep=lambda sig: True):
    gpu = load_gpu(gpu_name)
    model = RooflineModel(gpu, default_table(gpu))
    out = []
    for key, rec in ProfileDB.open(db_path).items():
        sig = Signature.from_key(key)
        if sig.name in names and keep(sig):
            out.append((sig, rec.median_us * 1e-6 / model.duration(fam.work(sig))))
    return out


def _long(sig):
    q = sig.tensor(1 if sig.name.endswith("_backward") else 0)
    return q[0][2] >= 2048


def test_sdpa_variants_cost_what_an_h200_measured():
    names = ("_scaled_dot_product_cudnn_attention", "_scaled_dot_product_cudnn_attention_backward")
    rs = _ratios(SDPA_KERNELS, "h200-sxm-141gb", names, _long)
    assert len(rs) >= 200
    kinds = {(attention.mask_kind(s, s.name), (s.scalar("dropout_p") or 0) > 0) for s, _ in rs}
    assert len(kinds) == 8                      # four masks, with and without dropout
    worst = max(rs, key=lambda x: abs(math.log(x[1])))
    assert abs(math.log(worst[1])) < math.log(1.25), f"{worst[0].key}: measured {worst[1]:.2f} x the model"
    assert statistics.median(abs(math.log(r)) for _, r in rs) < math.log(1.08)


def test_head_dimension_and_dropout_move_the_cost_as_measured():
    # the same FLOPs at head dimension 64 and 128: the measured kernels' ratio, not the model's, decides
    rs = {(s.tensor(0)[0][3], attention.mask_kind(s, s.name), (s.scalar("dropout_p") or 0) > 0, s.tensor(0)[0][2]):
          r for s, r in _ratios(SDPA_KERNELS, "h200-sxm-141gb", ("_scaled_dot_product_cudnn_attention",), _long)}
    assert rs, "no forward kernels in the measured profile"
    for (d, kind, drop, t), r in rs.items():
        assert 0.8 < r < 1.25, (d, kind, drop, t, r)


def test_the_variant_table_is_read_with_clear_errors(tmp_path, monkeypatch):
    bad = tmp_path / "sdpa-variants.toml"
    bad.write_text('head_dims = [64, 128]\n[forward]\nnone = [1.0]\n[backward]\nnone = [1.0, 1.0]\n')
    monkeypatch.setattr(attention, "variants_path", lambda: bad)
    attention.variant_table.cache_clear()
    try:
        with pytest.raises(PhantoraError, match="sdpa-variants.toml"):
            attention.variant_table()
    finally:
        attention.variant_table.cache_clear()


@pytest.mark.parametrize("gpu_name", ["h200-sxm-141gb", "h100-sxm-80gb"])
def test_convolutions_cost_what_the_gpus_measured(gpu_name):
    rs = _ratios(PROFILES / f"{gpu_name}.h5", gpu_name, ("convolution", "convolution_backward"))
    assert len(rs) >= 10
    med = statistics.median(abs(math.log(r)) for _, r in rs)
    assert med < math.log(1.4), f"median |log(measured / model)| {math.exp(med):.2f}"
    # channel-starved convolutions (an RGB stem, a 4-channel latent, depthwise) were 4-11 times their cost
    narrow = [(s, r) for s, r in rs if fam.work(s).variant.split(".")[0] in ("narrow", "depthwise")]
    assert narrow
    for s, r in narrow:
        assert r < 3.2, f"{s.key}: measured {r:.2f} x the model"


def test_channels_last_convolutions_are_told_apart():
    from phantora.costmodel.families.gemm import conv_variant
    x_nchw = ((8, 64, 32, 32), "bfloat16", (65536, 1024, 32, 1))
    x_cl = ((8, 64, 32, 32), "bfloat16", (65536, 1, 2048, 64))
    w = ((64, 64, 3, 3), "bfloat16", None)
    assert conv_variant(x_nchw, w, 1, False) == ""
    assert conv_variant(x_cl, w, 1, False) == "channels_last"
    assert conv_variant(x_cl, ((64, 1, 3, 3), "bfloat16", None), 64, False) == "depthwise.channels_last"
    assert conv_variant(((8, 3, 32, 32), "bfloat16", (3072, 1024, 32, 1)), ((64, 3, 7, 7), "bfloat16", None), 1,
                        False) == "narrow"
    # a transposed convolution's weight is (in, out / groups, k, k): depthwise when each group has one input
    assert conv_variant(x_nchw, ((64, 1, 2, 2), "bfloat16", None), 64, True) == "depthwise"
    assert conv_variant(x_nchw, ((64, 32, 2, 2), "bfloat16", None), 1, True) == ""
