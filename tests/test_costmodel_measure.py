"""Live measurement: clear errors without CUDA, input construction on CPU, physics checks on a real GPU."""

import pytest
import torch

from phantora.costmodel.families import work
from phantora.costmodel.measure import build_inputs, cuda_available, measure_signature, resolve_op
from phantora.costmodel.profiledb import ProfileDB
from phantora.costmodel.signature import Signature, signature_of
from phantora.errors import PhantoraError
from phantora.probes.calibrate import profile_signatures

from test_costmodel_gpus import H100

aten = torch.ops.aten
BF, F32 = torch.bfloat16, torch.float32
needs_cuda = pytest.mark.skipif(not cuda_available(), reason="needs a CUDA GPU")
no_cuda = pytest.mark.skipif(cuda_available(), reason="checks the CPU-only behaviour")


def T(*shape, dtype=BF):
    return torch.empty(shape, dtype=dtype, device="meta")


def L(*shape):
    return torch.empty(shape, dtype=torch.int64, device="meta")


def S(op, *args, **kwargs):
    return signature_of(op, args, kwargs)


@no_cuda
def test_measurement_without_cuda_is_a_clear_error(tmp_path):
    sig = S(aten.mm.default, T(64, 64), T(64, 64))
    with pytest.raises(PhantoraError, match="CUDA"):
        measure_signature(sig)
    db = ProfileDB.create(tmp_path / "p.h5", gpu="h100-sxm-80gb")
    with pytest.raises(PhantoraError, match="CUDA"):
        profile_signatures([sig], db)


def test_unknown_op_is_reported():
    with pytest.raises(PhantoraError, match="unknown op"):
        resolve_op("aten.no_such_op_anywhere.default")


ROUND_TRIP = [
    (aten.mm.default, (T(64, 32), T(32, 16)), {}),
    (aten.mm.default, (T(64, 32), T(16, 32).t()), {}),                  # strides survive
    (aten.add.Tensor, (T(8, 16), T(16)), {}),
    (aten.sum.dim_IntList, (T(8, 16), [-1], True), {}),
    (aten._to_copy.default, (T(8, 16),), {"dtype": F32}),
    (aten.native_layer_norm.default, (T(8, 16, dtype=F32), [16], T(16, dtype=F32), T(16, dtype=F32), 1e-5), {}),
    (aten._softmax.default, (T(8, 16), -1, False), {}),
    (aten.cat.default, ([T(4, 8), T(4, 8), T(4, 2)], 1), {}),
    (aten.embedding.default, (T(100, 8), L(4, 5)), {}),
    (aten.index.Tensor, (T(50, 8), [None, L(3)]), {}),
    (aten._foreach_add_.List, ([T(10, dtype=F32)] * 3, [T(10, dtype=F32)] * 3), {}),
    (aten._fused_adamw_.default, ([T(10, dtype=F32)] * 2, [T(10, dtype=F32)] * 2, [T(10, dtype=F32)] * 2,
                                  [T(10, dtype=F32)] * 2, [], [T(dtype=F32)] * 2),
     dict(lr=1e-3, beta1=0.9, beta2=0.95, weight_decay=0.1, eps=1e-8, amsgrad=False, maximize=False)),
    (aten.nll_loss_forward.default, (T(16, 10, dtype=F32), L(16), None, 1, -100), {}),
    # the scalars of a ScalarList are numbers, dropped from the signature: one is rebuilt per tensor
    (aten._foreach_div_.ScalarList, ([T(4, dtype=F32), T(3, 2, dtype=F32)], [0.5, 0.25]), {}),
    (aten._foreach_addcdiv_.ScalarList, ([T(4, dtype=F32)] * 2, [T(4, dtype=F32)] * 2, [T(4, dtype=F32)] * 2,
                                         [0.5, 0.25]), {}),
]


@pytest.mark.parametrize("op,args,kwargs", ROUND_TRIP, ids=lambda x: str(x)[:40] if not isinstance(x, tuple) else "")
def test_built_inputs_reproduce_the_signature_and_run(op, args, kwargs):
    sig = signature_of(op, args, kwargs)
    real_args, real_kwargs = build_inputs(sig, "cpu")
    assert signature_of(op, real_args, real_kwargs) == sig
    op(*real_args, **real_kwargs)                        # the op accepts them (index bounds respected, etc.)


def test_index_tensors_stay_within_bounds():
    emb = build_inputs(S(aten.embedding.default, T(37, 8), L(1000)), "cpu")[0]
    assert int(emb[1].min()) >= 0 and int(emb[1].max()) < 37
    g = build_inputs(S(aten.gather.default, T(10, 13), 1, L(10, 500)), "cpu")[0]
    assert int(g[2].max()) < 13
    nll = build_inputs(S(aten.nll_loss_forward.default, T(64, 7, dtype=F32), L(64), None, 1, -100), "cpu")[0]
    assert int(nll[1].max()) < 7
    dense = build_inputs(S(aten.embedding_dense_backward.default, T(50, 8), L(50), 11, -1, False), "cpu")[0]
    assert int(dense[1].max()) < 11


def test_inputs_of_log_are_positive_and_values_sane():
    x = build_inputs(S(aten.log.default, T(10000, dtype=F32)), "cpu")[0][0]
    assert float(x.min()) > 0
    y = build_inputs(S(aten.add.Tensor, T(10000, dtype=F32), T(10000, dtype=F32)), "cpu")[0][0]
    assert torch.isfinite(y).all() and 0.1 < float(y.std()) < 10 and float(y.min()) < 0


def test_broadcast_strides_are_rebuilt():
    sig = S(aten.mul.Tensor, T(8, 16), T(16).expand(8, 16))
    args = build_inputs(sig, "cpu")[0]
    assert args[1].stride() == (0, 1)


def test_flex_attention_is_not_measured_live():
    sig = Signature("higher_order.flex_attention", ((1, 2, 64, 16),) * 3, ("bfloat16",) * 3)
    with pytest.raises(PhantoraError, match="flex_attention"):
        build_inputs(sig, "cpu")


# ---- on a real GPU ---------------------------------------------------------------------------------------------------

def _local_spec():
    name = torch.cuda.get_device_name()
    if "H100" in name:
        return H100
    if "H200" in name:                        # H200 SXM: H100's compute, 4.8 TB/s HBM3e (NVIDIA H200 datasheet)
        from dataclasses import replace
        return replace(H100, name="h200-sxm-141gb", hbm_bandwidth_gbyte_per_s=4800.0)
    pytest.skip(f"no datasheet figures for {name} in this test")


GPU_CASES = [
    (aten.mm.default, (T(4096, 4096), T(4096, 4096)), {}),
    (aten.mm.default, (T(8192, 4096), T(14336, 4096).t()), {}),
    (aten.add.Tensor, (T(1 << 26), T(1 << 26)), {}),
    (aten._to_copy.default, (T(1 << 26),), {"dtype": F32}),
    (aten._softmax.default, (T(8192, 32000), -1, False), {}),
    (aten._scaled_dot_product_flash_attention.default, (T(1, 32, 4096, 128),) * 3, {"is_causal": True}),
]


@needs_cuda
@pytest.mark.parametrize("op,args,kwargs", GPU_CASES, ids=lambda x: str(x)[:40] if not isinstance(x, tuple) else "")
def test_measured_durations_respect_the_datasheet_roofline(op, args, kwargs):
    gpu = _local_spec()
    sig = signature_of(op, args, kwargs)
    w = work(sig)
    samples = measure_signature(sig, repeats=10)
    assert len(samples) >= 3 and all(s > 0 for s in samples)
    median = sorted(samples)[len(samples) // 2] * 1e-6
    # no kernel beats the densest peak of the chip nor its DRAM bandwidth (L2 is flushed between runs)
    floor = max(w.flops / (max(gpu.peak_tflops.values()) * 1e12), w.nbytes / gpu.hbm_bytes_per_s)
    assert median >= floor
    assert median < 100 * floor + 50e-6        # and the measurement is not absurdly slow either


@needs_cuda
def test_measured_matmul_time_grows_with_size():
    small = measure_signature(S(aten.mm.default, T(1024, 1024), T(1024, 1024)), repeats=10)
    big = measure_signature(S(aten.mm.default, T(4096, 4096), T(4096, 4096)), repeats=10)
    assert sorted(big)[len(big) // 2] > 8 * sorted(small)[len(small) // 2]


@needs_cuda
def test_live_cost_model_reports_measured_source():
    from phantora.costmodel.model import CostModel
    from phantora.engine.ops import CostSource

    model = CostModel(_local_spec(), measure_live=True, allow_other_live_gpu=True)
    c = model.estimate(S(aten.mm.default, T(2048, 2048), T(2048, 2048)))
    assert c.source == CostSource.MEASURED and c.duration_s > 0


def test_fsdp_copy_in_members_follow_their_split_sizes():
    """A signature keeps a tensor list grouped by shape; FSDP's all_gather_copy_in also takes the members' sizes
    in order, and its CPU kernel refuses members out of that order."""
    import torch.distributed.fsdp._fully_shard._fsdp_collectives  # noqa: F401  (registers torch.ops.fsdp)

    sizes = [8, 2, 8, 2, 5]                     # interleaved, as a block's q, k, v, o, ... weights are
    world, rank = 2, 1
    numel = sum(sizes)
    args = ([T(n) for n in sizes], T(numel * world), sizes, numel, rank)
    sig = signature_of(torch.ops.fsdp.all_gather_copy_in.default, args, {})
    real_args, real_kwargs = build_inputs(sig, "cpu")
    assert [t.numel() for t in real_args[0]] == sizes
    assert signature_of(torch.ops.fsdp.all_gather_copy_in.default, real_args, real_kwargs) == sig
    _, out = torch.ops.fsdp.all_gather_copy_in(*real_args, **real_kwargs)
    assert torch.equal(out[rank * numel:(rank + 1) * numel], torch.cat(real_args[0]))


@pytest.mark.parametrize("op,args", [(aten.add.Tensor, (T(2, 64, 1, dtype=F32), 1e-6)),     # RMSNorm's `+ eps`
                                     (aten.mul.Tensor, (T(64, dtype=F32), 0.5)),
                                     (aten.clamp.default, (T(dtype=F32), 1e-6, None)),        # both bounds numbers
                                     (aten.clamp.default, (T(8, dtype=F32), None, 1.0))])
def test_ops_with_number_operands_are_measurable(op, args):
    """Numbers are dropped from signatures as values; the op must still be rebuilt with some number there."""
    sig = signature_of(op, args, {})
    real_args, real_kwargs = build_inputs(sig, "cpu")
    assert signature_of(op, real_args, real_kwargs) == sig
    out = op(*real_args, **real_kwargs)
    assert out.shape == args[0].shape


def test_fsdp_copy_out_members_follow_their_split_sizes():
    """FSDP's split_with_sizes_copy writes each `out` member from its slice of the gathered buffer: members out of
    the split sizes' order would be resized by the op on every call, which is not the kernel that was recorded."""
    import warnings

    import torch.distributed.fsdp._fully_shard._fsdp_collectives  # noqa: F401  (registers torch.ops.fsdp)

    sizes, world = [8, 2, 8, 2, 5], 2
    op = torch.ops.fsdp.split_with_sizes_copy.default
    sig = signature_of(op, (T(world, sum(sizes)), sizes), {"dim": 1, "out": [T(world, n) for n in sizes]})
    real_args, real_kwargs = build_inputs(sig, "cpu")
    assert [t.shape[1] for t in real_kwargs["out"]] == sizes
    assert signature_of(op, real_args, real_kwargs) == sig
    with warnings.catch_warnings():
        warnings.simplefilter("error")                     # "An output ... was resized" must not happen
        op(*real_args, **real_kwargs)
    assert torch.equal(torch.cat(real_kwargs["out"], dim=1), real_args[0])


@pytest.mark.parametrize("a_shape,b_shape,ragged", [((4096, 256), (8, 256, 512), 4096),    # tokens x experts' weights
                                                     ((256, 4096), (4096, 512), 4096)])    # the weight gradient
def test_grouped_gemm_offsets_are_offsets(a_shape, b_shape, ragged):
    """The measured grouped GEMM gets valid group ends (non-decreasing, the last at the ragged dimension's size):
    random integers make the CUDA kernel stop on a device-side assert."""
    offs = torch.tensor([512 * (g + 1) for g in range(8)], dtype=torch.int32)
    sig = signature_of(aten._grouped_mm.default, (T(*a_shape), T(*b_shape), offs), {})
    real_args, real_kwargs = build_inputs(sig, "cpu", seed=3)
    built = (real_args[2] if len(real_args) > 2 else real_kwargs["offs"]).tolist()
    assert len(built) == 8 and built == sorted(built) and built[-1] == ragged and built[0] > 0
    assert signature_of(aten._grouped_mm.default, real_args, real_kwargs) == sig
    aten._grouped_mm.default(*real_args, **real_kwargs)


def test_repeat_interleave_repeats_add_up_to_the_output_size():
    """With `output_size` the CUDA kernel asserts that the repeats sum to it: the built repeats must."""
    args, kwargs = (T(128, dtype=torch.int64),), {"output_size": 65536}
    sig = signature_of(aten.repeat_interleave.Tensor, args, kwargs)
    real_args, real_kwargs = build_inputs(sig, "cpu", seed=1)
    assert int(real_args[0].sum()) == 65536 and real_kwargs["output_size"] == 65536
    assert aten.repeat_interleave.Tensor(*real_args, **real_kwargs).numel() == 65536
