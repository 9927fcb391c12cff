"""FLOP and byte counts of op families against hand computation from first principles."""

import pytest
import torch

from phantora.costmodel import families as fam
from phantora.costmodel.families import classify, work
from phantora.costmodel.signature import Signature, signature_of

aten = torch.ops.aten
BF, F32 = torch.bfloat16, torch.float32


def T(*shape, dtype=BF):
    return torch.empty(shape, dtype=dtype, device="meta")


def L(*shape):
    return torch.empty(shape, dtype=torch.int64, device="meta")


def W(op, *args, **kwargs):
    return work(signature_of(op, args, kwargs))


# ---- matmul --------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("m,k,n", [(128, 256, 64), (4096, 4096, 4096), (8192, 4096, 14336), (7, 3, 5)])
def test_mm_is_2mnk(m, k, n):
    w = W(aten.mm.default, T(m, k), T(k, n))
    # each of the m*n outputs is a k-long dot product: k multiplies + k adds
    assert w.flops == 2 * m * n * k
    assert w.nbytes == 2 * (m * k + k * n + m * n)            # bf16: read A and B once, write C once
    assert w.family == fam.MATMUL and w.tensor_core and w.dtype == "bf16"


def test_mm_transposed_operand_same_work():
    a = W(aten.mm.default, T(512, 1024), T(1024, 256))
    b = W(aten.mm.default, T(512, 1024), T(256, 1024).t())
    assert a.flops == b.flops and a.nbytes == b.nbytes


def test_bmm_baddbmm_addmm_linear():
    assert W(aten.bmm.default, T(8, 64, 32), T(8, 32, 16)).flops == 2 * 8 * 64 * 16 * 32
    # baddbmm adds the input: one more add per output element
    assert W(aten.baddbmm.default, T(8, 64, 16), T(8, 64, 32), T(8, 32, 16)).flops == 2 * 8 * 64 * 16 * 32 + 8 * 64 * 16
    assert W(aten.addmm.default, T(16), T(64, 32), T(32, 16)).flops == 2 * 64 * 16 * 32 + 64 * 16
    # linear: input (batch, seq, in) x weight (out, in)^T
    assert W(aten.linear.default, T(2, 10, 32), T(48, 32)).flops == 2 * 20 * 48 * 32
    assert W(aten.addmm_.default, T(64, 16), T(64, 32), T(32, 16)).flops == 2 * 64 * 16 * 32 + 64 * 16


def test_fp32_matmul_peak_depends_on_tf32_setting():
    old = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        strict = W(aten.mm.default, T(64, 64, dtype=F32), T(64, 64, dtype=F32))
        torch.set_float32_matmul_precision("high")
        relaxed = W(aten.mm.default, T(64, 64, dtype=F32), T(64, 64, dtype=F32))
    finally:
        torch.set_float32_matmul_precision(old)
    assert strict.dtype == "fp32" and relaxed.dtype == "tf32"
    assert strict.flops == relaxed.flops == 2 * 64 ** 3


def test_scaled_mm_runs_at_fp8():
    e4 = torch.float8_e4m3fn
    w = W(aten._scaled_mm.default, T(256, 512, dtype=e4), T(128, 512, dtype=e4).t(), T(dtype=F32), T(dtype=F32),
          out_dtype=BF)
    assert w.dtype == "fp8" and w.flops == 2 * 256 * 128 * 512


# ---- convolution ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("stride,pad,out_hw", [(1, 1, 56), (2, 1, 28), (1, 0, 54)])
def test_convolution(stride, pad, out_hw):
    n, cin, cout, hw, k = 8, 64, 128, 56, 3
    # output size by hand: floor((56 + 2p - 3) / s) + 1
    assert (hw + 2 * pad - k) // stride + 1 == out_hw
    w = W(aten.convolution.default, T(n, cin, hw, hw), T(cout, cin, k, k), None, [stride] * 2, [pad] * 2, [1, 1],
          False, [0, 0], 1)
    assert w.flops == 2 * n * cout * out_hw * out_hw * cin * k * k
    assert w.family == fam.CONV


def test_grouped_convolution_divides_work():
    full = W(aten.convolution.default, T(4, 64, 32, 32), T(64, 64, 3, 3), None, [1, 1], [1, 1], [1, 1], False,
             [0, 0], 1)
    grouped = W(aten.convolution.default, T(4, 64, 32, 32), T(64, 16, 3, 3), None, [1, 1], [1, 1], [1, 1], False,
                [0, 0], 4)
    assert grouped.flops * 4 == full.flops


# ---- attention -----------------------------------------------------------------------------------------------------

B, H, S, D = 2, 16, 1024, 128


def _qkv():
    return T(B, H, S, D), T(B, H, S, D), T(B, H, S, D)


def test_flash_attention_forward_is_4bhs2d():
    q, k, v = _qkv()
    full = W(aten._scaled_dot_product_flash_attention.default, q, k, v)
    # QK^T: 2*S*S*D per head; P@V: 2*S*S*D per head
    assert full.flops == 4 * B * H * S * S * D
    causal = W(aten._scaled_dot_product_flash_attention.default, q, k, v, 0.0, True)
    assert causal.flops == full.flops / 2
    assert full.family == fam.ATTN_FWD and full.tensor_core


def test_attention_backward_is_2_5x_forward():
    q, k, v = _qkv()
    lse = T(B, H, S, dtype=F32)
    fwd = W(aten._scaled_dot_product_flash_attention.default, q, k, v, 0.0, True)
    bwd = W(aten._scaled_dot_product_flash_attention_backward.default, q, q, k, v, q, lse, L(0), L(0), S, S, 0.0,
            True, L(2), L(0))
    # FlashAttention-2 counts 5 S x S x D matmuls backward vs 2 forward
    assert bwd.flops == 2.5 * fwd.flops and bwd.family == fam.ATTN_BWD


def test_efficient_and_cudnn_attention_match_flash_count():
    q, k, v = _qkv()
    eff = W(aten._scaled_dot_product_efficient_attention.default, q, k, v, None, True, 0.0, False)
    cud = W(aten._scaled_dot_product_cudnn_attention.default, q, k, v, None, True, 0.0, False)
    assert eff.flops == cud.flops == 4 * B * H * S * S * D


def test_gqa_counts_query_heads():
    q = T(1, 32, 512, 128)
    kv = T(1, 8, 512, 128)
    sig = Signature("higher_order.flex_attention", (q.shape, kv.shape, kv.shape), ("bfloat16",) * 3)
    assert work(sig).flops == 4 * 32 * 512 * 512 * 128


def test_flex_attention_density_scales_flops():
    shapes = ((1, 8, 2048, 64),) * 3
    dense = work(Signature("higher_order.flex_attention", shapes, ("bfloat16",) * 3))
    sparse = work(Signature("higher_order.flex_attention", shapes, ("bfloat16",) * 3, scalars=(("density", 0.25),)))
    assert dense.flops == 4 * 8 * 2048 * 2048 * 64 and sparse.flops == dense.flops / 4
    bwd = work(Signature("higher_order.flex_attention_backward", shapes * 2, ("bfloat16",) * 6,
                         scalars=(("density", 0.25),)))
    assert bwd.flops == 2.5 * sparse.flops


# ---- memory-bound families -----------------------------------------------------------------------------------------

def test_elementwise_add_bytes():
    n = 1 << 20
    w = W(aten.add.Tensor, T(n), T(n))
    assert w.nbytes == 3 * 2 * n and w.flops == n and not w.tensor_core


def test_broadcast_input_is_read_once():
    rows, d = 1024, 4096
    w = W(aten.mul.Tensor, T(rows, d), T(d))
    assert w.nbytes == 2 * (rows * d + d + rows * d)
    # an explicitly expanded (stride 0) input stores d elements, not rows*d
    e = W(aten.mul.Tensor, T(rows, d), T(d).expand(rows, d))
    assert e.nbytes == w.nbytes


def test_inplace_and_write_only_ops():
    n = 4096
    assert W(aten.add_.Tensor, T(n), T(n)).nbytes == 3 * 2 * n           # read self, other; write self
    assert W(aten.fill_.Scalar, T(n), 1.0).nbytes == 2 * n                 # write only
    assert W(aten.zeros.default, [n], dtype=F32).nbytes == 4 * n


def test_comparison_writes_bools():
    n = 1000
    assert W(aten.eq.Tensor, T(n, dtype=F32), T(n, dtype=F32)).nbytes == 4 * n * 2 + n


def test_copies_and_casts():
    n = 1 << 16
    assert W(aten._to_copy.default, T(n), dtype=F32).nbytes == n * (2 + 4)
    assert W(aten.copy_.default, T(n, dtype=F32), T(n)).nbytes == n * (2 + 4)
    assert W(aten.clone.default, T(n)).nbytes == 2 * 2 * n


def test_reductions():
    rows, d = 512, 4096
    w = W(aten.sum.dim_IntList, T(rows, d), [-1])
    assert w.nbytes == 2 * (rows * d + rows) and w.flops == rows * d
    everything = W(aten.sum.default, T(rows, d, dtype=F32))
    assert everything.nbytes == 4 * (rows * d + 1)
    col = W(aten.amax.default, T(rows, d), [0])
    assert col.nbytes == 2 * (rows * d + d)


def test_norms_read_input_once_write_output_once():
    rows, d = 8192, 4096
    rms = W(aten._fused_rms_norm.default, T(rows, d), [d], T(d), 1e-5)
    # x and weight in, y out (bf16), one fp32 rstd per row
    assert rms.nbytes == 2 * rows * d + 2 * d + 2 * rows * d + 4 * rows
    ln = W(aten.native_layer_norm.default, T(rows, d), [d], T(d), T(d), 1e-5)
    assert ln.nbytes == 2 * rows * d + 2 * 2 * d + 2 * rows * d + 2 * 4 * rows
    assert rms.family == ln.family == fam.NORM


def test_softmax_bytes():
    rows, d = 1024, 32000
    assert W(aten._softmax.default, T(rows, d), -1, False).nbytes == 2 * 2 * rows * d
    assert W(aten._softmax.default, T(rows, d), -1, True).nbytes == (2 + 4) * rows * d      # half_to_float
    assert W(aten._log_softmax_backward_data.default, T(rows, d, dtype=F32), T(rows, d, dtype=F32), 1,
             F32).nbytes == 3 * 4 * rows * d


def test_embedding_and_its_backward():
    vocab, d, tokens = 128256, 4096, 8192
    fwd = W(aten.embedding.default, T(vocab, d), L(tokens))
    # read the indices, read one row per token, write one row per token
    assert fwd.nbytes == 8 * tokens + 2 * 2 * tokens * d
    bwd = W(aten.embedding_dense_backward.default, T(tokens, d), L(tokens), vocab, -1, False)
    assert bwd.nbytes >= 2 * vocab * d + 2 * tokens * d        # at least: write the weight grad, read the grads
    assert bwd.flops == tokens * d


def test_nll_loss_pieces():
    rows, vocab = 8192, 128256
    fwd = W(aten.nll_loss_forward.default, T(rows, vocab, dtype=F32), L(rows), None, 1, -100)
    assert fwd.nbytes < 1e6                                   # reads one logit per row, not the whole matrix
    bwd = W(aten.nll_loss_backward.default, T(dtype=F32), T(rows, vocab, dtype=F32), L(rows), None, 1, -100,
            T(dtype=F32))
    assert bwd.nbytes >= 4 * rows * vocab                     # writes the whole gradient matrix


def test_fused_adamw_reads_four_and_writes_three_states():
    shapes = [(4096, 4096)] * 10 + [(4096,)] * 4
    ps = [T(*s, dtype=F32) for s in shapes]
    steps = [T(dtype=F32) for _ in shapes]
    w = W(aten._fused_adamw_.default, ps, ps, ps, ps, [], steps, lr=1e-3, beta1=0.9, beta2=0.95,
          weight_decay=0.1, eps=1e-8, amsgrad=False, maximize=False)
    p = 10 * 4096 * 4096 + 4 * 4096
    # read param, grad, exp_avg, exp_avg_sq; write param, exp_avg, exp_avg_sq (fp32); read the step counters
    assert w.nbytes == 7 * 4 * p + 4 * len(shapes)
    assert w.family == fam.OPTIMIZER and w.launches >= 1


def test_foreach_ops():
    ps = [T(1000, dtype=F32) for _ in range(5)]
    assert W(aten._foreach_add_.List, ps, ps).nbytes == 3 * 4 * 5000
    assert W(aten._foreach_mul_.Scalar, ps, 0.5).nbytes == 2 * 4 * 5000
    assert W(aten._foreach_norm.Scalar, ps, 2).nbytes == 4 * 5000 + 4 * 5


def test_multi_tensor_apply_launches_grow_with_tensor_count():
    few = W(aten._foreach_mul_.Scalar, [T(64, dtype=F32)] * 10, 0.5)
    many = W(aten._foreach_mul_.Scalar, [T(64, dtype=F32)] * 1000, 0.5)
    assert few.launches == 1 and many.launches > 1


def test_cat_index_gather():
    a, b = T(100, 64), T(100, 32)
    assert W(aten.cat.default, [a, b], -1).nbytes == 2 * 2 * (100 * 64 + 100 * 32)
    assert W(aten.index_select.default, T(1000, 64), 0, L(10)).nbytes == 8 * 10 + 2 * 2 * 10 * 64
    assert W(aten.gather.default, T(100, 64), 1, L(100, 8)).nbytes == 8 * 800 + 2 * 2 * 800
    assert W(aten.index.Tensor, T(1000, 64), [L(10)]).nbytes == 8 * 10 + 2 * 2 * 10 * 64
    # x[:, idx] keeps dim 0 and gathers 5 columns of each of the 1000 rows
    assert W(aten.index.Tensor, T(1000, 64), [None, L(5)]).nbytes == 8 * 5 + 2 * 2 * 1000 * 5


def test_baddbmm_with_beta_zero_does_not_read_c():
    # Megatron's attention scores: baddbmm(buffer, q, k^T, beta=0, alpha=scale). cuBLAS skips C when beta is 0.
    c, q, k = T(64, 2048, 2048), T(64, 2048, 64), T(64, 64, 2048)
    read = W(aten.baddbmm.default, c, q, k)
    skip = W(aten.baddbmm.default, c, q, k, beta=0.0, alpha=0.125)
    assert read.nbytes - skip.nbytes == c.numel() * c.element_size()
    assert skip.nbytes == W(aten.bmm.default, q, k).nbytes           # then it moves what a bmm moves
    assert signature_of(aten.baddbmm.default, (c, q, k), {"beta": 0.0}).scalar("beta") == 0.0
    assert signature_of(aten.baddbmm.default, (c, q, k), {"beta": 1.0}).scalar("beta") is None   # keys unchanged


def test_index_put_with_a_mask_touches_at_most_the_tensor():
    # x[mask] = v with a [1, 4096] bool mask over the first two dims of a [1, 4096, 4096] tensor (Megatron's
    # attention-mask build): the write covers at most the tensor itself, plus the mask read, plus the copy of
    # the out-of-place form (2 passes)
    x = T(1, 4096, 4096)
    mask = torch.empty((1, 4096), dtype=torch.bool, device="meta")
    value = T()
    w = W(aten.index_put.default, x, [mask], value)
    tensor_bytes = x.numel() * x.element_size()
    assert tensor_bytes <= w.nbytes <= 3 * tensor_bytes + mask.numel() + value.element_size()
    # an index of rows: 10 rows of 4096 x 4096 written, in place
    w = W(aten.index_put_.default, x.view(4096, 4096), [L(10)], T(10, 4096))
    assert w.nbytes == 8 * 10 + 2 * 10 * 4096 + 2 * 10 * 4096


# ---- views ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("op,args", [
    (aten.view.default, (T(4, 6), [24])), (aten.t.default, (T(4, 6),)), (aten.transpose.int, (T(4, 6), 0, 1)),
    (aten.permute.default, (T(2, 3, 4), [2, 0, 1])), (aten.expand.default, (T(1, 6), [4, 6])),
    (aten.slice.Tensor, (T(4, 6), 0, 0, 2)), (aten.select.int, (T(4, 6), 0, 1)),
    (aten.as_strided.default, (T(4, 6), [2, 2], [6, 1])), (aten.detach.default, (T(4, 6),)),
    (aten.alias.default, (T(4, 6),)), (aten.unsqueeze.default, (T(4, 6), 0)), (aten.squeeze.dim, (T(4, 1), 1)),
    (aten.split.Tensor, (T(4, 6), 2)), (aten.split_with_sizes.default, (T(4, 6), [1, 3])),
    (aten._unsafe_view.default, (T(4, 6), [24])), (aten.reshape.default, (T(4, 6), [24])),
    (aten.empty.memory_format, ([1 << 20],)),
])
def test_views_and_metadata_cost_nothing(op, args):
    w = W(op, *args)
    assert w.is_view and w.flops == 0 and w.nbytes == 0


def test_reshape_of_non_contiguous_input_is_a_copy():
    x = T(64, 32).t()
    w = W(aten.reshape.default, x, [2048])
    assert not w.is_view and w.nbytes == 2 * 2 * 2048


def test_unknown_op_uses_generic_rule():
    sig = Signature("myns.frobnicate.default", ((100, 10), (10,)), ("float32", "float32"), ((10, 1), (1,)))
    w = work(sig)
    # inputs read once (1000 + 10 elements), one output like the largest input written once
    assert w.family == fam.OTHER and w.nbytes == 4 * (1000 + 10 + 1000) and w.flops == 1000


@pytest.mark.parametrize("name,family", [
    ("aten.mm.default", fam.MATMUL), ("aten.addmm_.default", fam.MATMUL), ("aten.silu.default", fam.ELEMENTWISE),
    ("aten.gelu_backward.default", fam.ELEMENTWISE), ("aten.silu_backward.default", fam.ELEMENTWISE),
    ("aten.where.self", fam.ELEMENTWISE), ("aten.copy_.default", fam.COPY), ("aten._to_copy.default", fam.COPY),
    ("aten.mean.dim", fam.REDUCTION), ("aten.linalg_vector_norm.default", fam.REDUCTION),
    ("aten._fused_rms_norm_backward.default", fam.NORM), ("aten.native_layer_norm_backward.default", fam.NORM),
    ("aten._log_softmax.default", fam.SOFTMAX), ("aten.embedding_dense_backward.default", fam.EMBEDDING),
    ("aten.nll_loss_backward.default", fam.LOSS), ("aten._foreach_addcdiv_.Scalar", fam.OPTIMIZER),
    ("aten._fused_adam_.default", fam.OPTIMIZER), ("aten.index_put_.default", fam.INDEX),
    ("aten.stack.default", fam.CAT), ("higher_order.flex_attention_backward", fam.ATTN_BWD),
    ("_c10d_functional.all_reduce.default", fam.COLLECTIVE), ("aten.convolution_backward.default", fam.CONV),
])
def test_classification(name, family):
    assert classify(name) == family


# ---- fused inference fast paths ------------------------------------------------------------------------------------

def test_the_encoder_layer_fast_path_does_the_work_of_the_kernels_it_stands_for():
    """nn.TransformerEncoderLayer's inference fast path is one op; its FLOPs are those of the GEMMs and attention
    the unfused layer runs (qkv projection, scores and values, output projection, the feed-forward's two GEMMs)."""
    b, t, d, h, f = 2, 512, 256, 4, 1024
    x = T(b, t, d)
    fast = W(aten._transformer_encoder_layer_fwd.default, x, d, h, T(3 * d, d), T(3 * d), T(d, d), T(d), False,
             False, 1e-5, T(d), T(d), T(d), T(d), T(f, d), T(f), T(d, f), T(d))
    q = T(b, h, t, d // h)
    parts = [W(aten.linear.default, x, T(3 * d, d)), W(aten._scaled_dot_product_flash_attention.default, q, q, q),
             W(aten.linear.default, x, T(d, d)), W(aten.linear.default, x, T(f, d)),
             W(aten.linear.default, T(b, t, f), T(d, f))]
    assert fast.flops == sum(p.flops for p in parts)
    assert fast.family == fam.MATMUL and fast.tensor_core and fast.dtype == "bf16"
    assert fast.nbytes >= 2 * (b * t * d * 2 + 3 * d * d + d * d + 2 * f * d)     # in, out and the weights, once


def test_the_attention_fast_path_does_the_work_of_the_kernels_it_stands_for():
    b, t, s, d, h = 2, 256, 384, 512, 8
    fast = W(aten._native_multi_head_attention.default, T(b, t, d), T(b, s, d), T(b, s, d), d, h, T(3 * d, d),
             T(3 * d), T(d, d), T(d))
    parts = [W(aten.linear.default, T(b, t, d), T(d, d)), W(aten.linear.default, T(b, s, d), T(2 * d, d)),
             W(aten._scaled_dot_product_flash_attention.default, T(b, h, t, d // h), T(b, h, s, d // h),
               T(b, h, s, d // h)), W(aten.linear.default, T(b, t, d), T(d, d))]
    assert fast.flops == sum(p.flops for p in parts)
