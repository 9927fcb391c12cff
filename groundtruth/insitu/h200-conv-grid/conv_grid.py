"""Convolution forward and backward time over the layers of ResNet-50, a Stable Diffusion UNet and a depthwise
network, in bf16 and fp32 (TF32 allowed, cuDNN's default), NCHW and channels-last: one JSON line per case with the
mean forward and backward (input and weight gradients) in ms, CUDA events around 10 calls after 2 warm-up calls
(cuDNN's benchmark mode off, its default). The same script runs on a GPU host and under `phantora run
--gpus-per-node 1`.
"""
import json

import torch
import torch.nn.functional as F

REPS = 10
# name, batch, in channels, size, out channels, kernel, stride, groups
LAYERS = [
    ("r50-stem", 32, 3, 224, 64, 7, 2, 1),
    ("r50-1x1-64-256", 32, 64, 56, 256, 1, 1, 1),
    ("r50-3x3-64", 32, 64, 56, 64, 3, 1, 1),
    ("r50-3x3-128", 32, 128, 28, 128, 3, 1, 1),
    ("r50-3x3-256", 32, 256, 14, 256, 3, 1, 1),
    ("r50-3x3-512", 32, 512, 7, 512, 3, 1, 1),
    ("r50-1x1-2048-512", 32, 2048, 7, 512, 1, 1, 1),
    ("r50-1x1-s2-512-1024", 32, 512, 28, 1024, 1, 2, 1),
    ("unet-in-4-320", 8, 4, 64, 320, 3, 1, 1),
    ("unet-3x3-320", 8, 320, 64, 320, 3, 1, 1),
    ("unet-3x3-640", 8, 640, 32, 640, 3, 1, 1),
    ("unet-3x3-1280-16", 8, 1280, 16, 1280, 3, 1, 1),
    ("unet-3x3-1280-8", 8, 1280, 8, 1280, 3, 1, 1),
    ("unet-down-s2-320", 8, 320, 64, 320, 3, 2, 1),
    ("dw-3x3-144", 32, 144, 56, 144, 3, 1, 144),
    ("dw-3x3-576", 32, 576, 14, 576, 3, 1, 576),
]


def timed(fn, reps=REPS):
    for _ in range(2):
        fn()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / reps


def main():
    torch.manual_seed(0)
    for name, n, cin, hw, cout, k, s, g in LAYERS:
        for dtype in (torch.bfloat16, torch.float32):
            for layout in ("nchw", "channels_last"):
                fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
                x = torch.randn(n, cin, hw, hw, device="cuda", dtype=dtype).to(memory_format=fmt).requires_grad_()
                w = torch.randn(cout, cin // g, k, k, device="cuda", dtype=dtype).to(memory_format=fmt)
                w.requires_grad_()
                f = lambda: F.conv2d(x, w, None, s, k // 2, 1, g)
                with torch.no_grad():
                    fwd = timed(f)
                y = f()
                gy = torch.ones_like(y)
                bwd = timed(lambda: torch.autograd.grad(y, (x, w), gy, retain_graph=True))
                print(json.dumps({"layer": name, "dtype": str(dtype).split(".")[1], "layout": layout,
                                  "shape": [n, cin, hw, hw, cout, k, s, g],
                                  "fwd_ms": round(fwd, 4), "bwd_ms": round(bwd, 4)}), flush=True)
                del x, w, y, gy


if __name__ == "__main__":
    main()
