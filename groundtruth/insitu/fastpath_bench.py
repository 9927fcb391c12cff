"""Step time of PyTorch's fused inference fast paths on a GPU, or under `phantora run` (the same script):
`nn.TransformerEncoderLayer` (`_transformer_encoder_layer_fwd`) and `nn.MultiheadAttention`
(`_native_multi_head_attention`) in eval mode under `torch.inference_mode()`, bf16, batch-first. Median of 20 timed
calls after 5 warm-ups, each between two `torch.cuda.synchronize()`. Writes JSON to $OUT/fastpath.json (or stdout).

    OUT=DIR python groundtruth/insitu/fastpath_bench.py
    phantora run --cluster h200-1gpu --no-trace -- python groundtruth/insitu/fastpath_bench.py
"""
import json
import os
import statistics
import time

import torch
import torch.nn as nn

CASES = [(8, 2048, 1024, 8), (4, 4096, 2048, 16), (16, 512, 1024, 16)]     # batch, sequence, model dim, heads


def timed(fn, x) -> float:
    for _ in range(5):
        fn(x)
    times = []
    for _ in range(20):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn(x)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cases": []}
    for b, t, d, h in CASES:
        enc = nn.TransformerEncoderLayer(d, h, 4 * d, batch_first=True).cuda().to(torch.bfloat16).eval()
        mha = nn.MultiheadAttention(d, h, batch_first=True).cuda().to(torch.bfloat16).eval()
        x = torch.randn(b, t, d, device="cuda", dtype=torch.bfloat16)
        with torch.inference_mode():
            e = timed(enc, x)
            m = timed(lambda y: mha(y, y, y, need_weights=False), x)
        flops_enc = 2 * b * t * (3 * d * d + d * d + 8 * d * d) + 4 * b * t * t * d
        flops_mha = 2 * b * t * 4 * d * d + 4 * b * t * t * d
        out["cases"].append({"batch": b, "seq": t, "dim": d, "heads": h, "encoder_s": e, "mha_s": m,
                             "encoder_tflops": flops_enc / e / 1e12, "mha_tflops": flops_mha / m / 1e12})
        print(out["cases"][-1], flush=True)
    text = json.dumps(out, indent=1)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "fastpath.json"), "w") as fh:
            fh.write(text)
    print(text)


if __name__ == "__main__":
    main()
