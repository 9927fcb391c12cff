"""signature_of on fake and meta tensors; Signature key round trips."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from phantora.costmodel.signature import Signature, mask_density, signature_of
from phantora.errors import TraceError

aten = torch.ops.aten


@pytest.fixture
def fake():
    with FakeTensorMode() as m:
        yield m


def test_fake_tensor_shapes_dtypes_strides(fake):
    a = torch.empty(128, 256, dtype=torch.bfloat16)
    b = torch.empty(64, 256, dtype=torch.bfloat16).t()        # transposed view: strides (1, 256)
    s = signature_of(aten.mm.default, (a, b), {})
    assert s.op == "aten.mm.default"
    assert s.shapes == ((128, 256), (256, 64))
    assert s.dtypes == ("bfloat16", "bfloat16")
    assert s.strides == ((256, 1), (1, 256))
    assert s.tensor(1) == ((256, 64), "bfloat16", (1, 256))


def test_meta_tensors_work_like_fake_ones():
    a = torch.empty(32, 16, device="meta", dtype=torch.float16)
    s = signature_of(aten.add.Tensor, (a, a), {})
    assert s.shapes == ((32, 16), (32, 16)) and s.dtypes == ("float16", "float16")


def test_positional_and_keyword_calls_agree(fake):
    x = torch.empty(8, 4096, dtype=torch.bfloat16)
    by_pos = signature_of(aten.sum.dim_IntList, (x, [1], True), {})
    by_kw = signature_of(aten.sum.dim_IntList, (x,), {"dim": [1], "keepdim": True})
    assert by_pos == by_kw and by_pos.key() == by_kw.key()
    default_keepdim = signature_of(aten.sum.dim_IntList, (x, [1]), {})
    explicit = signature_of(aten.sum.dim_IntList, (x, [1], False), {})
    assert default_keepdim == explicit                        # defaults are filled in
    assert by_pos.scalar("dim") == (1,) and by_pos.scalar("keepdim") is True


def test_values_are_dropped_work_scalars_kept(fake):
    q = torch.empty(2, 8, 256, 64, dtype=torch.bfloat16)
    op = aten._scaled_dot_product_flash_attention.default
    s1 = signature_of(op, (q, q, q), {"is_causal": True, "scale": 0.125})
    s2 = signature_of(op, (q, q, q), {"is_causal": True, "scale": 0.5})
    s3 = signature_of(op, (q, q, q), {"is_causal": False, "scale": 0.125})
    assert s1 == s2                          # the softmax scale does not change the work
    assert s1 != s3                          # causality does
    a = torch.empty(4, 4)
    assert signature_of(aten.add.Tensor, (a, a), {"alpha": 2}) == signature_of(aten.add.Tensor, (a, a), {})


def test_to_copy_keeps_target_dtype(fake):
    x = torch.empty(4, 4, dtype=torch.bfloat16)
    s = signature_of(aten._to_copy.default, (x,), {"dtype": torch.float32})
    assert s.scalar("dtype") == "float32"


def test_tensor_lists_are_compact(fake):
    params = [torch.empty(4096, 4096) for _ in range(250)] + [torch.empty(4096) for _ in range(50)]
    s = signature_of(aten._foreach_add_.List, (params, params), {})
    entries = s.tensor_list(0)
    assert len(entries) == 2                                  # two distinct shapes, not 300 entries
    assert sum(n for _, _, n in entries) == 300
    assert dict(((sh, n) for sh, _, n in entries)) == {(4096, 4096): 250, (4096,): 50}
    assert len(s.key()) < 400


def test_key_round_trip_with_lists_and_scalars(fake):
    x = torch.empty(16, 32, dtype=torch.bfloat16)
    sigs = [
        signature_of(aten.cat.default, ([x, x, torch.empty(16, 8, dtype=torch.bfloat16)], -1), {}),
        signature_of(aten.index.Tensor, (x, [None, torch.empty(5, dtype=torch.long)]), {}),
        signature_of(aten.sum.dim_IntList, (x, [0, 1]), {"dtype": torch.float32}),
        signature_of(aten.mm.default, (x, x.t()), {}),
    ]
    for s in sigs:
        back = Signature.from_key(s.key())
        assert back == s and hash(back) == hash(s) and back.key() == s.key()


def test_old_five_field_keys_still_parse():
    s = Signature.from_key('["aten.mm.default",[[2,3],[3,4]],["float32","float32"],[[3,1],[4,1]],[]]')
    assert s.shapes == ((2, 3), (3, 4)) and s.lists == ()


@pytest.mark.parametrize("bad", ["", "nonsense", "[1,2,3]", '["aten.mm.default"]', '{"op": 1}'])
def test_malformed_keys_raise_trace_error(bad):
    with pytest.raises(TraceError):
        Signature.from_key(bad)


def _fake_cuda(*shape):
    """A FakeTensor that says it lives on cuda:0 (works with a CPU-only torch)."""
    from torch._subclasses.fake_tensor import FakeTensor

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    return FakeTensor(mode, torch.empty(*shape, device="meta"), torch.device("cuda", 0))


def test_host_device_copies_are_marked():
    gpu, host = _fake_cuda(8, 8), torch.empty(8, 8)
    assert signature_of(aten.copy_.default, (gpu, host)).scalar("xfer") == "h2d"      # copy_(dst, src)
    assert signature_of(aten.copy_.default, (host, gpu)).scalar("xfer") == "d2h"
    assert signature_of(aten._to_copy.default, (gpu,), {"device": torch.device("cpu")}).scalar("xfer") == "d2h"
    assert signature_of(aten._to_copy.default, (host,), {"device": torch.device("cuda")}).scalar("xfer") == "h2d"
    assert signature_of(aten.copy_.default, (gpu, gpu)).scalar("xfer") is None
    assert signature_of(aten.copy_.default, (host, torch.empty(8, 8, device="meta"))).scalar("xfer") is None


def _causal(b, h, q, kv):
    return q >= kv


def _window(b, h, q, kv):
    return (q >= kv) & (q - kv < 256)


def test_flex_attention_density_from_mask_function():
    from torch._higher_order_ops.flex_attention import flex_attention
    from torch.nn.attention.flex_attention import create_block_mask

    seq = 2048
    with FakeTensorMode():
        q = torch.empty(1, 8, seq, 64, dtype=torch.bfloat16)
        causal = create_block_mask(_causal, None, None, seq, seq, device="cpu")     # fake block tensors
        window = create_block_mask(_window, None, None, seq, seq, device="cpu")
        s_causal = signature_of(flex_attention, (q, q, q, lambda s, *_: s, causal.as_tuple(), 0.125, {}), {})
        s_window = signature_of(flex_attention, (q, q, q, lambda s, *_: s, window.as_tuple(), 0.125, {}), {})
    # first principles: a causal mask keeps (S^2 + S)/2 of S^2 pairs; a window of w keeps ~ (w*S - w^2/2) / S^2
    assert s_causal.scalar("density") == pytest.approx(0.5, abs=0.01)
    assert s_window.scalar("density") == pytest.approx((256 * seq - 256 ** 2 / 2) / seq ** 2, abs=0.01)
    assert s_causal.shapes[0] == (1, 8, seq, 64)


def test_mask_density_from_real_block_counts_when_mask_fails():
    from torch.nn.attention.flex_attention import create_block_mask

    seq, block = 1024, 128
    bm = create_block_mask(_causal, None, None, seq, seq, device="cpu", BLOCK_SIZE=block)
    items = list(bm.as_tuple())
    items[-1] = lambda *a: (_ for _ in ()).throw(RuntimeError("opaque mask"))   # a mask the sampler cannot run
    n = seq // block
    d = mask_density(tuple(items), seq, seq)
    # block granularity: the n diagonal blocks are computed whole, so n(n+1)/2 of n^2 blocks
    assert d == pytest.approx(n * (n + 1) / 2 / n ** 2, abs=0.01)


def test_pickling_drops_the_per_process_hash():
    import pickle

    s = Signature("aten.mm.default", ((2, 3), (3, 4)), ("float32", "float32"))
    hash(s)
    back = pickle.loads(pickle.dumps(s))
    assert "_hash" not in back.__dict__ and back == s and hash(back) == hash(s)
