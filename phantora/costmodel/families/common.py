"""The vocabulary every family's counter shares: the family names, the `Work` record, dtype sizes, the shape
and byte helpers a `Signature` is read with, and the generic fallback rule (`_other`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..signature import Signature


# ---- families -----------------------------------------------------------------------------------------------------

VIEW = "view"                  # views and metadata: no kernel
ALLOC = "alloc"                # empty/empty_strided/resize_: allocation only, no kernel
COLLECTIVE = "collective"      # costed by the network model, not here
MATMUL = "matmul"
CONV = "conv"
ATTN_FWD = "attention_fwd"
ATTN_BWD = "attention_bwd"
ELEMENTWISE = "elementwise"
REDUCTION = "reduction"
NORM = "norm"
SOFTMAX = "softmax"
EMBEDDING = "embedding"
LOSS = "loss"
OPTIMIZER = "optimizer"        # _foreach_* and _fused_adam(w)_
COPY = "copy"
INDEX = "index"
CAT = "cat"
OTHER = "other"

FAMILIES = (VIEW, ALLOC, COLLECTIVE, MATMUL, CONV, ATTN_FWD, ATTN_BWD, ELEMENTWISE, REDUCTION, NORM, SOFTMAX,
            EMBEDDING, LOSS, OPTIMIZER, COPY, INDEX, CAT, OTHER)
NO_KERNEL = frozenset({VIEW, ALLOC, COLLECTIVE})
TENSOR_CORE_FAMILIES = frozenset({MATMUL, CONV, ATTN_FWD, ATTN_BWD})


@dataclass(frozen=True, slots=True)
class Work:
    """What one kernel (one aten op) must do, independent of the GPU."""

    family: str
    flops: float = 0.0
    nbytes: float = 0.0
    dtype: str = "fp32"        # peak-table key of the arithmetic: bf16 | fp16 | tf32 | fp32 | fp8 | int8 | fp64
    tensor_core: bool = False  # FLOPs run on tensor cores (peak of `dtype`) rather than CUDA cores (fp32 peak)
    is_view: bool = False      # no kernel at all: zero cost
    launches: int = 1          # kernels the op launches (multi-tensor-apply ops launch several)
    xfer: str = ""             # "h2d" / "d2h": a copy across the host link
    op: str = ""               # op packet name ("mm", "_softmax"): efficiency tables may refine a family per op
    variant: str = ""          # sub-case with its own efficiency, e.g. "broadcast" for elementwise ops
    exec_flops: float = -1.0   # FLOPs the kernel really executes when more than `flops` (-1: same)
    blocks: int = 0            # > 0: one thread block per channel, bound by its threads' serial steps (roofline.py,
    block_steps: float = 0.0   # BLOCK_STEP_S): the blocks, each thread's steps, the threads of a block
    block_threads: int = 512

    @property
    def kernel_flops(self) -> float:
        return self.exec_flops if self.exec_flops >= 0 else self.flops


ITEMSIZE: dict[str, int] = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "complex64": 8, "complex128": 16, "complex32": 4,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "uint16": 2, "uint32": 4, "uint64": 8, "bool": 1,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1, "float8_e8m0fnu": 1,
    "float4_e2m1fn_x2": 1, "qint8": 1, "quint8": 1, "qint32": 4,
}


def itemsize(dtype: str | None) -> int:
    return ITEMSIZE.get(dtype or "float32", 4)


def peak_key(dtype: str | None, tf32: bool = False) -> str:
    """Key of GPUSpec.peak_tflops for arithmetic on `dtype` (a torch dtype name)."""
    if dtype == "bfloat16":
        return "bf16"
    if dtype == "float16":
        return "fp16"
    if dtype is not None and dtype.startswith(("float8", "float4")):
        return "fp8"
    if dtype in ("int8", "uint8"):
        return "int8"
    if dtype in ("float64", "complex128"):
        return "fp64"
    return "tf32" if tf32 else "fp32"


# ---- shape helpers ------------------------------------------------------------------------------------------------

def numel(shape: tuple[int, ...] | None) -> int:
    if shape is None:
        return 0
    n = 1
    for s in shape:
        n *= s
    return n


def touched(shape: tuple[int, ...], stride: tuple[int, ...] | None) -> int:
    """Elements a tensor really stores: dims broadcast with stride 0 do not multiply the memory read."""
    if stride is None or len(stride) != len(shape):
        return numel(shape)
    n = 1
    for s, st in zip(shape, stride):
        if st != 0:
            n *= s
    return n if numel(shape) else 0


def is_contiguous(shape: tuple[int, ...], stride: tuple[int, ...] | None) -> bool:
    if stride is None:
        return True
    expected = 1
    for s, st in zip(reversed(shape), reversed(stride)):
        if s != 1 and st != expected:
            return False
        expected *= s
    return True


def broadcast(shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
    nd = max((len(s) for s in shapes), default=0)
    out = [1] * nd
    for s in shapes:
        for i, d in enumerate(s):
            j = nd - len(s) + i
            if d != 1:
                out[j] = d if out[j] == 1 else max(out[j], d)
    return tuple(out)


def _tensors(sig: Signature) -> list[tuple[int, tuple[int, ...], str, tuple[int, ...] | None]]:
    """(slot, shape, dtype, stride) of every single-tensor argument."""
    out = []
    for i, s in enumerate(sig.shapes):
        if s is not None:
            out.append((i, s, sig.dtypes[i], sig.strides[i] if i < len(sig.strides) else None))
    return out


def _bytes_in(sig: Signature, skip: tuple[int, ...] = (), lists: bool = True) -> float:
    """Bytes of the inputs read once (tensor lists too unless `lists` is False), skipping slots in `skip`."""
    b = 0.0
    for i, s, d, st in _tensors(sig):
        if i not in skip:
            b += touched(s, st) * itemsize(d)
    if lists:
        for slot, entries in sig.lists:
            if slot not in skip:
                b += _list_bytes(entries)
    return b


def _list_bytes(entries) -> float:
    return float(sum(numel(s) * itemsize(d) * n for s, d, n in entries if s is not None))


def _list_numel(entries) -> int:
    return sum(numel(s) * n for s, _, n in entries if s is not None)


def _list_count(entries) -> int:
    return sum(n for s, _, n in entries if s is not None)


def _promote(dtypes: list[str]) -> str:
    """Result dtype of mixed inputs (a simplification of torch's promotion: widest float, else widest int)."""
    floats = [d for d in dtypes if d and (d.startswith(("float", "bfloat", "complex")))]
    pool = floats or [d for d in dtypes if d]
    if not pool:
        return "float32"
    if "bfloat16" in pool and "float16" in pool:
        return "float32"
    return max(pool, key=itemsize)


def _packet(op: str) -> tuple[str, str, str]:
    parts = op.split(".")
    if len(parts) >= 3:
        return parts[0], parts[1], ".".join(parts[2:])
    if len(parts) == 2:
        return parts[0], parts[1], ""
    return "", op, ""


def _first_tensor(sig: Signature):
    ts = _tensors(sig)
    return ts[0] if ts else None


def _other(sig: Signature, family: str) -> Work:
    """Generic fallback: every input read once, one output like the largest input written once, 1 FLOP/element."""
    ts = _tensors(sig)
    biggest = max(ts, key=lambda x: numel(x[1]), default=None)
    list_biggest = max((numel(s) * itemsize(d) for _, e in sig.lists for s, d, _ in e if s is not None), default=0)
    out_bytes = max(numel(biggest[1]) * itemsize(biggest[2]) if biggest else 0, list_biggest)
    out_n = max(numel(biggest[1]) if biggest else 0,
                max((numel(s) for _, e in sig.lists for s, _, _ in e if s is not None), default=0))
    return Work(OTHER, float(out_n), _bytes_in(sig) + out_bytes)
