"""PyTorch's fused inference fast paths: `nn.TransformerEncoderLayer` (`_transformer_encoder_layer_fwd`) and
`nn.MultiheadAttention` (`_native_multi_head_attention`) in eval mode without gradients. Each is one aten op that
launches several kernels on a GPU: the input projection's GEMM, the attention's score and value products, the
output projection's GEMM (and, for the encoder layer, the two layer norms and the feed-forward GEMMs). Costed as
the FLOPs of those products on tensor cores, the bytes of the inputs, weights and output, over those launches.
"""

from __future__ import annotations

from ..signature import Signature
from .common import MATMUL, Work, _bytes_in, _packet, itemsize, numel, peak_key

FAST_PATHS = ("_transformer_encoder_layer_fwd", "_native_multi_head_attention")
# schema positions: the encoder layer's src (batch..., T, D) and ffn_weight_1 (F, D); attention's query and key
_ENCODER_SRC, _ENCODER_FFN_1 = 0, 14
_MHA_QUERY, _MHA_KEY = 0, 1


def _fast_path(sig: Signature, family: str) -> Work:
    _, name, _ = _packet(sig.op)
    if name == "_native_multi_head_attention":
        q, k = sig.tensor(_MHA_QUERY), sig.tensor(_MHA_KEY)
        *batch, t, d = q[0]
        s = k[0][-2]
        b = numel(tuple(batch))
        # q, k and v projections, scores and values (2 x 2·b·t·s·d), output projection
        flops = 2.0 * b * t * d * d + 2.0 * 2 * b * s * d * d + 4.0 * b * t * s * d + 2.0 * b * t * d * d
        dtype, launches = q[1], 5
    else:
        src, ffn = sig.tensor(_ENCODER_SRC), sig.tensor(_ENCODER_FFN_1)
        *batch, t, d = src[0]
        b = numel(tuple(batch))
        f = ffn[0][0]
        n = b * t
        # qkv projection, scores and values, output projection, the feed-forward's two GEMMs
        flops = 2.0 * n * 3 * d * d + 4.0 * b * t * t * d + 2.0 * n * d * d + 4.0 * n * d * f
        dtype, launches = src[1], 10
    out = b * t * d * itemsize(dtype)
    return Work(MATMUL, flops, _bytes_in(sig) + out, peak_key(dtype), True, launches=launches)
