"""A standard set of kernel signatures spanning every family and a wide range of sizes, for fitting efficiencies.

`calibration_signatures()` builds them from meta tensors (no GPU needed). Profiling them on a GPU and running
`fit_efficiencies` on the result gives that GPU's efficiency table:

    db = ProfileDB.create("h100.h5", gpu="h100-sxm-80gb", ...)
    profile_signatures(calibration_signatures(), db); db.save()
    table = fit_efficiencies(db, load_gpu("h100-sxm-80gb"))

Shapes are those of Llama-style training (hidden 4096, FFN 14336, vocabulary 128256, sequence 1k-8k tokens) plus
square GEMMs from 128 to 8192 and elementwise ops from 1 element to 256 M elements, so that both the saturation
constants and the asymptotic efficiencies are measured.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from ..costmodel import families as fam
from ..costmodel.measure import DEFAULT_REPEATS, DEFAULT_WARMUP, measure_signature, require_cuda
from ..costmodel.signature import Signature, signature_of
from ..errors import PhantoraError


def calibration_signatures() -> list[Signature]:
    import torch

    aten = torch.ops.aten
    bf, f32 = torch.bfloat16, torch.float32

    def T(*shape: int, dtype: Any = bf) -> Any:
        return torch.empty(shape, dtype=dtype, device="meta")

    def L(*shape: int) -> Any:
        return torch.empty(shape, dtype=torch.int64, device="meta")

    out: list[Signature] = []

    def add(op: Any, *args: Any, **kwargs: Any) -> None:
        out.append(signature_of(op, args, kwargs))

    def with_tf32(flag: bool, fn: Callable[[], None]) -> None:
        old = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision("high" if flag else "highest")
        try:
            fn()
        finally:
            torch.set_float32_matmul_precision(old)

    # ---- matmul ----
    for n in (128, 256, 512, 1024, 2048, 4096, 8192):
        add(aten.mm.default, T(n, n), T(n, n))
    for m, k, n in ((8192, 4096, 4096), (8192, 4096, 14336), (8192, 14336, 4096), (8192, 4096, 1024),
                    (8192, 4096, 128256), (16384, 4096, 6144), (2048, 4096, 4096), (1024, 4096, 14336),
                    (64, 4096, 4096), (16, 8192, 8192), (4096, 128, 4096), (256, 8192, 1024)):
        add(aten.mm.default, T(m, k), T(k, n))
        add(aten.mm.default, T(m, k), T(n, k).t())                     # x @ W^T (weights stored [out, in])
    for m, k, n in ((4096, 8192, 4096), (14336, 8192, 4096), (4096, 8192, 14336), (128256, 8192, 4096)):
        add(aten.mm.default, T(k, m).t(), T(k, n))                     # weight gradient: x^T @ dy
    add(aten.addmm.default, T(4096), T(8192, 4096), T(4096, 4096))
    add(aten.addmm.default, T(1024), T(2048, 1024), T(1024, 1024))
    for b, m, k, n in ((32, 512, 128, 512), (64, 2048, 128, 2048), (8, 1024, 1024, 1024), (256, 128, 64, 128)):
        add(aten.bmm.default, T(b, m, k), T(b, k, n))
    for n in (512, 2048, 4096):
        with_tf32(False, lambda n=n: add(aten.mm.default, T(n, n, dtype=f32), T(n, n, dtype=f32)))
        with_tf32(True, lambda n=n: add(aten.mm.default, T(n, n, dtype=f32), T(n, n, dtype=f32)))
    for n in (2048, 4096, 8192):
        e4 = torch.float8_e4m3fn
        add(aten._scaled_mm.default, T(n, n, dtype=e4), T(n, n, dtype=e4).t(), T(dtype=f32), T(dtype=f32),
            out_dtype=bf)

    # ---- convolution (ResNet-like layers, NCHW) ----
    for n, cin, hw, cout, k, stride in ((32, 64, 56, 64, 3, 1), (32, 128, 28, 128, 3, 1), (32, 256, 14, 256, 3, 1),
                                        (32, 64, 56, 256, 1, 1), (32, 3, 224, 64, 7, 2), (8, 512, 7, 512, 3, 1)):
        x, w = T(n, cin, hw, hw), T(cout, cin, k, k)
        pad = k // 2
        add(aten.convolution.default, x, w, None, [stride] * 2, [pad] * 2, [1, 1], False, [0, 0], 1)
        out_hw = (hw + 2 * pad - k) // stride + 1
        add(aten.convolution_backward.default, T(n, cout, out_hw, out_hw), x, w, None, [stride] * 2, [pad] * 2,
            [1, 1], False, [0, 0], 1, [True, True, False])

    # ---- attention ----
    for b, h, s, d in ((1, 32, 1024, 128), (1, 32, 2048, 128), (1, 32, 4096, 128), (1, 32, 8192, 128),
                       (4, 32, 2048, 128), (2, 16, 4096, 64), (8, 12, 512, 64)):
        for causal in (False, True):
            q = T(b, h, s, d)
            add(aten._scaled_dot_product_flash_attention.default, q, q, q, 0.0, causal)
            lse = T(b, h, s, dtype=f32)
            add(aten._scaled_dot_product_flash_attention_backward.default, q, q, q, q, q, lse, L(0), L(0), s, s, 0.0,
                causal, L(2), L(0))
    for b, h, s, d in ((1, 32, 2048, 128), (1, 32, 4096, 128), (4, 16, 1024, 64)):
        q = T(b, h, s, d)
        add(aten._scaled_dot_product_efficient_attention.default, q, q, q, None, True, 0.0, True)
        add(aten._scaled_dot_product_efficient_attention_backward.default, q, q, q, q, None, q, T(b, h, s, dtype=f32),
            L(), L(), 0.0, [True, True, True, False], True)
        add(aten._scaled_dot_product_cudnn_attention.default, q, q, q, None, True, 0.0, True)
        add(aten._scaled_dot_product_cudnn_attention_backward.default, q, q, q, q, q, T(b, h, s, 1, dtype=f32), L(),
            L(), None, L(0), L(0), s, s, 0.0, True)

    # ---- elementwise / copies (sizes 1 .. 256M elements) ----
    sizes = (1, 1024, 16384, 262144, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20)
    for n in sizes:
        add(aten.add.Tensor, T(n), T(n))
        add(aten.mul.Tensor, T(n, dtype=f32), T(n, dtype=f32))
        add(aten.fill_.Scalar, T(n), 0.0)
        add(aten._to_copy.default, T(n), dtype=f32)
        add(aten.copy_.default, T(n), T(n))
    for n in (1 << 20, 16 << 20, 128 << 20):
        add(aten.silu.default, T(n))
        add(aten.silu_backward.default, T(n), T(n))
        add(aten.gelu.default, T(n))
        add(aten.where.self, T(n, dtype=torch.bool), T(n), T(n))
        add(aten.mul.Tensor, T(n // 4096, 4096), T(4096))                  # broadcast weight
        add(aten.clone.default, T(4096, n // 4096).t())                     # transposed copy

    # ---- reductions, norms, softmax ----
    for rows in (1024, 8192, 32768):
        x = T(rows, 4096)
        add(aten.sum.dim_IntList, x, [-1])
        add(aten.sum.dim_IntList, x, [0])
        add(aten.amax.default, T(rows, 4096, dtype=f32), [-1], True)
        add(aten.mean.dim, x, [-1], True)
        add(aten._fused_rms_norm.default, x, [4096], T(4096), 1e-5)
        add(aten._fused_rms_norm_backward.default, x, x, [4096], T(rows, 1, dtype=f32), T(4096), [True, True])
        add(aten.native_layer_norm.default, x, [4096], T(4096), T(4096), 1e-5)
        add(aten.native_layer_norm_backward.default, x, x, [4096], T(rows, 1, dtype=f32), T(rows, 1, dtype=f32),
            T(4096), T(4096), [True, True, True])
        add(aten._softmax.default, x, -1, False)
        add(aten._softmax_backward_data.default, x, x, -1, bf)
    for n in (1 << 16, 1 << 22, 1 << 26):
        add(aten.linalg_vector_norm.default, T(n, dtype=f32), 2)
    for rows, vocab in ((2048, 32000), (8192, 128256)):
        add(aten._log_softmax.default, T(rows, vocab, dtype=f32), 1, False)
        add(aten._log_softmax_backward_data.default, T(rows, vocab, dtype=f32), T(rows, vocab, dtype=f32), 1, f32)
        add(aten.nll_loss_forward.default, T(rows, vocab, dtype=f32), L(rows), None, 1, -100)
        add(aten.nll_loss_backward.default, T(dtype=f32), T(rows, vocab, dtype=f32), L(rows), None, 1, -100,
            T(dtype=f32))

    # ---- embedding, index, cat ----
    for tokens in (2048, 8192, 32768):
        add(aten.embedding.default, T(128256, 4096), L(tokens))
        add(aten.embedding_dense_backward.default, T(tokens, 4096), L(tokens), 128256, -1, False)
        add(aten.index_select.default, T(32768, 4096), 0, L(tokens))
        add(aten.gather.default, T(tokens, 4096), 1, L(tokens, 64))
        add(aten.index.Tensor, T(32768, 4096), [L(tokens)])
        add(aten.cat.default, [T(tokens, 4096), T(tokens, 1024), T(tokens, 1024)], -1)

    # ---- optimizer ----
    for count, shape in ((32, (4096, 4096)), (32, (4096, 14336 // 8)), (200, (4096,)), (8, (128256 // 8, 4096))):
        ps = [T(*shape, dtype=f32) for _ in range(count)]
        steps = [T(dtype=f32) for _ in range(count)]
        add(aten._fused_adamw_.default, ps, ps, ps, ps, [], steps, lr=1e-3, beta1=0.9, beta2=0.95,
            weight_decay=0.1, eps=1e-8, amsgrad=False, maximize=False)
        add(aten._foreach_add_.List, ps, ps)
        add(aten._foreach_mul_.Scalar, ps, 0.5)
        add(aten._foreach_norm.Scalar, ps, 2)
    return out


@dataclass
class ProfileReport:
    """Outcome of `profile_signatures`."""

    measured: int = 0
    skipped: int = 0                         # views, no-kernel ops, already in the database
    failed: list[tuple[str, str]] = field(default_factory=list)   # (signature key, message)


def profile_signatures(sigs: Iterable[Signature], db: Any, progress: Callable[..., None] | None = None, *,
                       repeats: int = DEFAULT_REPEATS, warmup: int = DEFAULT_WARMUP, skip_existing: bool = True,
                       flush_l2: bool = True) -> ProfileReport:
    """Measure each distinct signature and add it to `db` (a ProfileDB; not saved here).

    `progress(done, total, sig, status)` is called after each signature, status being 'measured', 'skipped' or
    'failed: <message>'. A signature that cannot be measured is reported in the result, not raised.
    """
    require_cuda()
    unique: dict[str, Signature] = {}
    for s in sigs:
        unique.setdefault(s.key(), s)
    report = ProfileReport()
    total = len(unique)
    for done, (key, sig) in enumerate(unique.items(), 1):
        if fam.classify(sig.op) in fam.NO_KERNEL or fam.work(sig).is_view or (skip_existing and key in db):
            report.skipped += 1
            status = "skipped"
        else:
            try:
                db.add(sig, measure_signature(sig, repeats, warmup=warmup, flush_l2=flush_l2))
                report.measured += 1
                status = "measured"
            except PhantoraError as e:
                report.failed.append((key, str(e)))
                status = f"failed: {e}"
        if progress is not None:
            progress(done, total, sig, status)
    return report


def _driver_version() -> str:
    import subprocess

    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=30)
        return r.stdout.strip().splitlines()[0] if r.returncode == 0 and r.stdout.strip() else ""
    except (OSError, subprocess.SubprocessError):
        return ""


def main(argv: list[str] | None = None) -> int:
    """python -m phantora.probes.calibrate OUT.h5 --gpu PRESET: profile the calibration set on this GPU."""
    import argparse
    import sys
    import time

    import torch

    from ..costmodel.measure import local_device_name
    from ..costmodel.profiledb import ProfileDB

    ap = argparse.ArgumentParser(prog="python -m phantora.probes.calibrate", description=main.__doc__)
    ap.add_argument("out", help="profile database to write (HDF5)")
    ap.add_argument("--gpu", required=True, help="GPU preset name this machine's GPU is, e.g. h100-sxm-80gb")
    ap.add_argument("--repeats", type=int, default=30)
    a = ap.parse_args(argv)
    name = local_device_name()
    db = ProfileDB.create(a.out, gpu=a.gpu, driver=_driver_version(), torch_version=torch.__version__,
                          command=" ".join(["python -m phantora.probes.calibrate"] + (argv or sys.argv[1:])))
    sigs = calibration_signatures()
    print(f"{name}: profiling {len(sigs)} signatures (torch {torch.__version__}, driver {db.meta['driver']})",
          flush=True)
    t0 = time.time()

    def progress(done: int, total: int, sig: Signature, status: str) -> None:
        rec = db.lookup(sig)
        shown = f"{rec.median_us:10.2f} us" if rec is not None and status == "measured" else status[:100]
        print(f"[{done:4d}/{total}] {time.time() - t0:6.1f}s {sig.op:58s} {shown}", flush=True)

    report = profile_signatures(sigs, db, progress)
    db.save()
    print(f"measured {report.measured}, skipped {report.skipped}, failed {len(report.failed)}; wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
