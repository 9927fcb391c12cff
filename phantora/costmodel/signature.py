"""Kernel signatures: what identifies one kernel's cost on one GPU.

A signature is the op overload plus the shapes, dtypes and strides of its tensor inputs and the scalar arguments
that change the work (e.g. `transpose` flags, `is_causal`, reduction dims). Two launches with equal signatures cost
the same on the same GPU; the signature table of a trace lets replay re-cost every kernel on another GPU.

Layout (see docs/cost-model.md, "Signatures"):

- `shapes`/`dtypes`/`strides` hold one entry per argument of the op's schema, in schema order (keyword-only
  arguments included, defaults filled in), `None` where the argument is not a single tensor; trailing `None`s are
  trimmed. Position `i` is therefore always schema argument `i`, which is how the FLOP counters find `query`,
  `mat2`, ... Higher-order ops without a schema use their positional arguments in order.
- `scalars` holds `(name, value)` pairs of the non-tensor arguments kept, in schema order. Ints, bools, strings,
  int lists, dtypes, layouts, memory formats and device types are kept; floats and `Scalar` numbers are values, not
  work, and are dropped (alpha, beta, eps, lr, scale, fill values), except where listed in `_KEEP_NUMBERS`.
- `lists` holds the tensor-list arguments (`Tensor[]`, `Tensor?[]`: `cat`, `_foreach_*`, `_fused_adamw_`, `index`)
  compactly as `(slot, ((shape, dtype, count), ...))`: each distinct (shape, dtype) once, in order of first
  appearance, with its multiplicity. Strides of list members are not kept (they are assumed contiguous).
"""

from __future__ import annotations

import json
import weakref
from dataclasses import dataclass
from typing import Any

from ..errors import TraceError

TensorEntry = tuple[tuple[int, ...] | None, str | None, int]   # (shape, dtype, multiplicity) in a tensor list
TensorList = tuple[int, tuple[TensorEntry, ...]]               # (argument slot, distinct entries)


@dataclass(frozen=True)
class Signature:
    op: str                                   # op overload, e.g. "aten.mm.default"
    shapes: tuple[tuple[int, ...] | None, ...] = ()   # per schema argument; None for non-tensor arguments
    dtypes: tuple[str | None, ...] = ()       # torch dtype names without "torch.", e.g. "bfloat16"
    strides: tuple[tuple[int, ...] | None, ...] = ()
    scalars: tuple[Any, ...] = ()             # (name, value) pairs of the kept non-tensor arguments, JSON-serialisable
    lists: tuple[TensorList, ...] = ()        # tensor-list arguments, compact (see module docstring)

    def __hash__(self) -> int:                # memoised: the cost model's cache hashes every launch's signature
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.op, self.shapes, self.dtypes, self.strides, self.scalars, self.lists))
            object.__setattr__(self, "_hash", h)
        return h

    def __getstate__(self) -> dict:           # the memoised hash is per process (string hashing is salted)
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    def key(self) -> str:
        """Canonical text form; equal signatures have equal keys."""
        k = self.__dict__.get("_key")
        if k is None:
            parts: list[Any] = [self.op, [list(s) if s is not None else None for s in self.shapes], list(self.dtypes),
                                [list(s) if s is not None else None for s in self.strides], list(self.scalars)]
            if self.lists:
                parts.append([[slot, [[list(s) if s is not None else None, d, n] for s, d, n in entries]]
                              for slot, entries in self.lists])
            k = json.dumps(parts, separators=(",", ":"))
            object.__setattr__(self, "_key", k)
        return k

    @classmethod
    def from_key(cls, key: str) -> "Signature":
        try:
            parts = json.loads(key)
            if not isinstance(parts, list) or len(parts) not in (5, 6) or not isinstance(parts[0], str):
                raise ValueError("not a list of 5 or 6 fields starting with the op name")
            op, shapes, dtypes, strides, scalars = parts[:5]
            lists = parts[5] if len(parts) == 6 else []
            return cls(op, tuple(tuple(s) if s is not None else None for s in shapes), tuple(dtypes),
                       tuple(tuple(s) if s is not None else None for s in strides),
                       tuple(_freeze(x) for x in scalars),
                       tuple((int(slot), tuple((tuple(s) if s is not None else None, d, int(n)) for s, d, n in entries))
                             for slot, entries in lists))
        except (ValueError, TypeError) as e:
            shown = key if len(key) <= 120 else key[:117] + "..."
            raise TraceError(f"not a kernel signature key: {shown!r} ({e})") from None

    # ---- accessors used by the FLOP counters -------------------------------------------------------------------

    def tensor(self, i: int) -> tuple[tuple[int, ...], str, tuple[int, ...] | None] | None:
        """(shape, dtype, stride) of schema argument `i`, or None where it is not a tensor."""
        if i >= len(self.shapes) or self.shapes[i] is None:
            return None
        stride = self.strides[i] if i < len(self.strides) else None
        return self.shapes[i], self.dtypes[i], stride

    def scalar(self, name: str, default: Any = None) -> Any:
        """The kept scalar argument `name`, or `default` when it was not recorded."""
        for n, v in self.scalars:
            if n == name:
                return v
        return default

    def tensor_list(self, slot: int) -> tuple[TensorEntry, ...]:
        """The entries of the tensor-list argument at `slot` (empty when there is none)."""
        for s, entries in self.lists:
            if s == slot:
                return entries
        return ()

    @property
    def name(self) -> str:
        """The op's packet name: 'mm' for 'aten.mm.default', 'flex_attention' for 'higher_order.flex_attention'."""
        parts = self.op.split(".")
        return parts[1] if len(parts) > 1 else parts[0]


def _freeze(x: Any) -> Any:
    if isinstance(x, list):
        return tuple(_freeze(v) for v in x)
    return x


# ---- building signatures from live (possibly fake) arguments --------------------------------------------------------

# Float / Scalar arguments that do change the work, per op packet name. Everything else of type float or number
# (alpha, beta, eps, lr, momentum, scale, fill values, exponents) is a value and is dropped.
_KEEP_NUMBERS: dict[str, tuple[str, ...]] = {
    "arange": ("start", "end", "step"),            # they fix the output length
    "linspace": ("start", "end"),
    "_scaled_dot_product_flash_attention": ("dropout_p",),
    "_scaled_dot_product_flash_attention_backward": ("dropout_p",),
    "_scaled_dot_product_efficient_attention": ("dropout_p",),
    "_scaled_dot_product_efficient_attention_backward": ("dropout_p",),
    "_scaled_dot_product_cudnn_attention": ("dropout_p",),
    "_scaled_dot_product_cudnn_attention_backward": ("dropout_p",),
    "native_dropout": ("p",),
}
# Int / bool arguments that are values, not work, per op packet name.
_DROP_ARGS: dict[str, tuple[str, ...]] = {
    "copy_": ("other", "non_blocking"),
    "_to_copy": ("non_blocking", "pin_memory"),
    "fill_": ("value",),
    "masked_fill": ("value",),
    "masked_fill_": ("value",),
    "batch_norm_gather_stats": ("count",),          # elements per rank: a value, the kernel's work is [world, C]
}
_COPY_OPS = frozenset({"copy_", "_to_copy", "_copy_from", "_copy_from_and_resize", "to"})

_NUMBER_KINDS = frozenset({"FloatType", "NumberType", "ComplexType"})


@dataclass(frozen=True)
class _Arg:
    name: str
    kwarg_only: bool
    has_default: bool
    default: Any
    drop: bool            # a number (float/Scalar) to drop, or listed in _DROP_ARGS
    tensors: bool         # a Tensor or Tensor[] argument (an empty list of tensors is recorded nowhere)


_PLANS: dict[Any, tuple[str, str, tuple[_Arg, ...] | None]] = {}
_DTYPE_NAMES: dict[Any, str] = {}


def op_name(func: Any) -> str:
    """Canonical name of an op overload ('aten.mm.default') or higher-order op ('higher_order.flex_attention')."""
    plan = _plan(func)
    return plan[0]


def _plan(func: Any) -> tuple[str, str, tuple[_Arg, ...] | None]:
    plan = _PLANS.get(func)
    if plan is not None:
        return plan
    schema = getattr(func, "_schema", None)
    if schema is not None and hasattr(func, "_overloadpacket"):
        packet = func._overloadpacket.__name__
        name = str(func)
        keep_numbers = _KEEP_NUMBERS.get(packet, ())
        drops = _DROP_ARGS.get(packet, ())
        args = []
        for a in schema.arguments:
            kind = _type_kind(a.type)
            drop = (kind in _NUMBER_KINDS and a.name not in keep_numbers) or a.name in drops or kind == "GeneratorType"
            args.append(_Arg(a.name, bool(a.kwarg_only), a.default_value is not None or _has_default(a),
                             a.default_value, drop, kind == "TensorType"))
        plan = (name, packet, tuple(args))
    else:
        ns = getattr(func, "namespace", None) or "higher_order"
        fname = func.name() if callable(getattr(func, "name", None)) else getattr(func, "__name__", str(func))
        plan = (f"{ns}.{fname}", fname, None)
    _PLANS[func] = plan
    return plan


def _type_kind(t: Any) -> str:
    while t.kind() == "OptionalType":
        t = t.getElementType()
    if t.kind() == "ListType":
        return _type_kind(t.getElementType())
    return t.kind()


def _has_default(a: Any) -> bool:
    try:
        return bool(a.has_default_value())
    except AttributeError:
        return False


def _dtype_name(dt: Any) -> str:
    n = _DTYPE_NAMES.get(dt)
    if n is None:
        n = str(dt).removeprefix("torch.")
        _DTYPE_NAMES[dt] = n
    return n


def _int_tuple(xs: Any) -> tuple[int, ...]:
    return tuple(int(x) for x in xs)


def _describe_tensor(t: Any) -> tuple[tuple[int, ...], str, tuple[int, ...] | None]:
    shape = _int_tuple(t.shape)
    try:
        stride = _int_tuple(t.stride())
    except (RuntimeError, NotImplementedError):      # sparse / nested tensors have no strides
        stride = None
    return shape, _dtype_name(t.dtype), stride


def _scalar_value(v: Any) -> tuple[bool, Any]:
    """(keep, JSON-able value) for one non-tensor argument value."""
    import torch

    if v is None or isinstance(v, (bool, int, str)):
        return True, v
    if isinstance(v, float):
        return True, v
    if isinstance(v, torch.dtype):
        return True, _dtype_name(v)
    if isinstance(v, (torch.memory_format, torch.layout)):
        return True, str(v).removeprefix("torch.")
    if isinstance(v, torch.device):
        return True, v.type
    if isinstance(v, (torch.SymInt, torch.SymBool)):
        return True, int(v) if isinstance(v, torch.SymInt) else bool(v)
    if isinstance(v, torch.SymFloat):
        return True, float(v)
    if isinstance(v, (list, tuple)):
        out = []
        for x in v:
            ok, y = _scalar_value(x)
            if not ok:
                return False, None
            out.append(y)
        return True, tuple(out)
    return False, None


def _compact_list(items: Any) -> tuple[TensorEntry, ...]:
    import torch

    counts: dict[tuple[Any, Any], int] = {}
    for t in items:
        if isinstance(t, torch.Tensor):
            k = (_int_tuple(t.shape), _dtype_name(t.dtype))
        else:
            k = (None, None)
        counts[k] = counts.get(k, 0) + 1
    return tuple((s, d, n) for (s, d), n in counts.items())


class _Builder:
    def __init__(self) -> None:
        self.shapes: list[Any] = []
        self.dtypes: list[Any] = []
        self.strides: list[Any] = []
        self.scalars: list[tuple[str, Any]] = []
        self.lists: list[TensorList] = []
        self.devices: list[str | None] = []     # device type per slot (first member's for a list)

    def slot(self, name: str, v: Any, drop: bool = False, tensors: bool = False) -> None:
        import torch

        i = len(self.shapes)
        if isinstance(v, torch.Tensor):
            s, d, st = _describe_tensor(v)
            self.shapes.append(s)
            self.dtypes.append(d)
            self.strides.append(st)
            self.devices.append(v.device.type)
            return
        self.shapes.append(None)
        self.dtypes.append(None)
        self.strides.append(None)
        if isinstance(v, (list, tuple)) and v and any(isinstance(x, torch.Tensor) for x in v):
            self.lists.append((i, _compact_list(v)))
            self.devices.append(next(x.device.type for x in v if isinstance(x, torch.Tensor)))
            return
        self.devices.append(None)
        if drop or tensors:                 # a tensor argument left as None shows as a None slot
            return
        keep, val = _scalar_value(v)
        if keep:
            self.scalars.append((name, val))

    def build(self, op: str) -> Signature:
        n = len(self.shapes)
        while n and self.shapes[n - 1] is None:
            n -= 1
        return Signature(op, tuple(self.shapes[:n]), tuple(self.dtypes[:n]), tuple(self.strides[:n]),
                         tuple(self.scalars), tuple(self.lists))


def signature_of(func: Any, args: tuple | list = (), kwargs: dict | None = None) -> Signature:
    """The signature of one call of `func` (an `OpOverload` or a higher-order op) with these (possibly fake) args.

    Works on real, FakeTensor and meta tensors alike: only shapes, dtypes, strides and devices are read, never data.
    """
    kwargs = kwargs or {}
    name, packet, plan = _plan(func)
    if plan is None:
        special = _HOP_BUILDERS.get(packet)
        if special is not None:
            return special(name, args, kwargs)
        return _generic_hop(name, args, kwargs)
    b = _Builder()
    npos = len(args)
    beta = None
    for i, a in enumerate(plan):
        if i < npos and not a.kwarg_only:
            v = args[i]
        elif a.name in kwargs:
            v = kwargs[a.name]
        else:
            v = a.default
        b.slot(a.name, v, a.drop, a.tensors)
        if a.name == "beta":
            beta = v
    if packet in _BETA_OPS and beta is not None and not isinstance(beta, bool) and beta == 0:
        # beta = 0: cuBLAS does not read C (Megatron's attention scores: baddbmm into an empty buffer, beta 0)
        b.scalars.append(("beta", 0.0))
    if packet in _COPY_OPS:
        _mark_transfer(b, packet)
    elif packet in _TF32_OPS:
        _mark_tf32(b, packet)
    return b.build(name)


_BETA_OPS = frozenset({"addmm", "addmm_", "baddbmm", "baddbmm_", "addbmm", "addbmm_"})
"""GEMMs with a C input scaled by beta; a beta of 0 is kept as scalar ("beta", 0.0), since then C is not read."""
_TF32_OPS = frozenset({"mm", "bmm", "addmm", "addmm_", "baddbmm", "baddbmm_", "addbmm", "linear", "matmul",
                       "convolution", "convolution_backward", "cudnn_convolution", "_convolution"})


def _mark_tf32(b: _Builder, packet: str) -> None:
    """fp32 matmuls/convolutions run on TF32 tensor cores when PyTorch allows it: record the setting."""
    if "float32" not in b.dtypes:
        return
    import torch

    if packet.startswith(("convolution", "cudnn_convolution", "_convolution")):
        allowed = bool(torch.backends.cudnn.allow_tf32)
    else:
        allowed = torch.get_float32_matmul_precision() != "highest"
    b.scalars.append(("tf32", allowed))


def _mark_transfer(b: _Builder, packet: str) -> None:
    """Copies between host and device memory cross PCIe: record the direction as scalar 'xfer' ('h2d'/'d2h')."""
    if not b.devices or b.devices[0] is None:
        return
    src = b.devices[0]
    if packet == "_to_copy":
        dst = dict(b.scalars).get("device")
    else:                                   # copy_(self=dst, src) and friends
        dst, src = src, (b.devices[1] if len(b.devices) > 1 else None)
    if dst is None or src is None or dst == src or "cpu" not in (src, dst) or "meta" in (src, dst):
        return
    b.scalars.append(("xfer", "d2h" if dst == "cpu" else "h2d"))


# ---- higher-order ops -------------------------------------------------------------------------------------------

def _generic_hop(name: str, args: Any, kwargs: dict) -> Signature:
    b = _Builder()
    for i, v in enumerate(args):
        b.slot(f"a{i}", v, drop=isinstance(v, float))
    for k in sorted(kwargs):
        v = kwargs[k]
        b.slot(k, v, drop=isinstance(v, float))
    return b.build(name)


def _flex_builder(n_tensors: int, mask_pos: int):
    def build(name: str, args: Any, kwargs: dict) -> Signature:
        import torch

        b = _Builder()
        names = ("query", "key", "value", "out", "logsumexp", "grad_out")
        for i in range(n_tensors):
            v = args[i] if i < len(args) else kwargs.get(names[i])
            b.slot(names[i], v if isinstance(v, torch.Tensor) else None)
        block_mask = args[mask_pos] if mask_pos < len(args) else kwargs.get("block_mask")
        q, k = b.shapes[0], b.shapes[1]
        if q is not None and k is not None and len(q) >= 2 and len(k) >= 2:
            density = mask_density(block_mask, q[-2], k[-2])
            if density is not None:
                b.scalars.append(("density", density))
        return b.build(name)
    return build


_HOP_BUILDERS = {
    "flex_attention": _flex_builder(3, 4),
    "flex_attention_backward": _flex_builder(6, 9),
}

_DENSITY_CACHE: "weakref.WeakKeyDictionary[Any, dict[tuple[int, int], float | None]]" = weakref.WeakKeyDictionary()
_DENSITY_GRID = 256


def mask_density(block_mask: Any, q_len: int, kv_len: int) -> float | None:
    """Fraction of the (query, key) score matrix a flex-attention block mask leaves to compute, to 2 decimals.

    By evaluating the mask function on a 256 x 256 grid of (q_idx, kv_idx) samples spread over the sequence (with
    fake mode unset): the fraction of (query, key) pairs kept, the convention under which a causal mask halves the
    work. Failing that (a mask that closes over fake tensors), from the block counts when the mask's tensors hold
    real data (partial and full blocks over all blocks). None when neither works: the cost model then assumes a
    full (dense) score matrix.
    """
    import torch

    if block_mask is None:
        return None
    items = tuple(block_mask.as_tuple()) if hasattr(block_mask, "as_tuple") else tuple(block_mask)
    tensors_at = [i for i, x in enumerate(items) if isinstance(x, torch.Tensor)]
    mask_mod = next((x for x in reversed(items) if callable(x) and not isinstance(x, torch.Tensor)), None)
    d = None
    if mask_mod is not None:
        try:
            per_fn = _DENSITY_CACHE.setdefault(mask_mod, {})
        except TypeError:                               # not weak-referenceable
            per_fn = {}
        if (q_len, kv_len) not in per_fn:
            per_fn[(q_len, kv_len)] = _density_from_mask_mod(mask_mod, q_len, kv_len)
        d = per_fn[(q_len, kv_len)]
    if d is None:
        d = _density_from_blocks(items, tensors_at, q_len, kv_len)
    return d


def _is_real(t: Any) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return not isinstance(t, FakeTensor) and t.device.type != "meta"


def _density_from_blocks(items: tuple, tensors_at: list[int], q_len: int, kv_len: int) -> float | None:
    """(partial + full) KV blocks over all blocks, from kv_num_blocks and full_kv_num_blocks (2nd tensor after)."""
    if not tensors_at:
        return None
    i0 = tensors_at[0]
    kv_num = items[i0]
    full_num = items[i0 + 2] if i0 + 2 < len(items) else None
    ints = [x for x in items if isinstance(x, int) and not isinstance(x, bool)]
    if not _is_real(kv_num) or (full_num is not None and not _is_real(full_num)) or len(ints) < 2:
        return None
    kv_block = ints[-1]
    if kv_block <= 0 or kv_num.dim() < 1:
        return None
    n_kv = -(-kv_len // kv_block)
    total = kv_num.sum().item() + (full_num.sum().item() if full_num is not None else 0)
    rows = kv_num.numel()
    if rows == 0 or n_kv == 0:
        return None
    return round(min(1.0, total / (rows * n_kv)), 2)


def _density_from_mask_mod(mask_mod: Any, q_len: int, kv_len: int) -> float | None:
    import torch
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.utils._python_dispatch import _disable_current_modes

    n = _DENSITY_GRID
    try:
        with unset_fake_temporarily(), _disable_current_modes(), torch.no_grad():
            q = torch.linspace(0, q_len - 1, min(n, q_len)).round().long()
            kv = torch.linspace(0, kv_len - 1, min(n, kv_len)).round().long()
            zero = torch.zeros((), dtype=torch.long)
            m = mask_mod(zero, zero, q[:, None], kv[None, :])
            m = torch.as_tensor(m).to(torch.bool).expand(q.numel(), kv.numel())
            return round(float(m.float().mean().item()), 2)
    except Exception:       # noqa: BLE001 - any mask the sampler cannot evaluate means "unknown density"
        return None
