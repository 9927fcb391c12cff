"""Real values of small tensors that came from host data, and placeholders for everything else.

Fake tensors have no data. A side table (weak-keyed by the fake tensor) keeps a real CPU copy of the value of small
tensors (at most `SMALL_NUMEL` elements; integer and bool tensors up to `SMALL_INT_NUMEL`, on the host up to
`HOST_INT_NUMEL`) whose value is known on the host:
- tensors made from host data (`torch.tensor([3.5])`, `torch.full((1,), 2.0)`, `torch.arange(4)`...), including
  small random tensors (`torch.randint(0, 10, (1,))`: on the host drawn from the host's generator, on the GPU from
  the device's, cuda_rng.draw_generator);
- results of any op all of whose tensor inputs have a known value (elementwise ops, reductions, copies between
  devices, views, in-place updates), computed on the CPU copies.
An op that writes into a tensor with a known value from inputs without one forgets that value.

Every real copy is made with `device="cpu"` named: a framework may route factories without a device to the GPU
(DeepSpeed's `zero.Init` does).

`.item()`, `.tolist()`, `.numpy()`, `bool(t)`, `torch.equal` answer from the table; without a known value they answer
placeholders: 0 for integer dtypes, 0.0 for floating point, False for bool (True for `torch.isfinite`, fake.py), 0j for complex (so
NaN/inf checks pass and GradScaler never skips a step); `torch.equal` answers True. docs/stubs.md lists the rules.
`torch.isfinite` of a tensor too large for the table is kept as one value everywhere (`uniform`), which boolean
element-wise ops, copies, views and `all` / `any` carry on, so a check of a large gradient reads as a small one's.

Views share their known values' storage as the fake tensors share theirs: a write through a view (an op, a
collective) is seen by its base and the other views, and a view written with unknown data makes them unknown too.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily
from torch.utils import _pytree as pytree
from torch.utils.weak import WeakIdKeyDictionary

from .routes import ROUTES

SMALL_NUMEL = 64
SMALL_INT_NUMEL = 4096
"""Integer and bool tensors carry metadata (ids, sizes, counts, index lists such as DeepSpeed's parameter-id lists
that ZeRO-3 broadcasts and compares), not model data: their values are kept up to this many elements."""
STATE_BYTES = 8192
"""uint8 tensors hold generator states (the CPU generator's is 5,056 bytes, a CUDA one's 16): their values are kept up to
this many elements wherever they live, so that a state sent to the GPU, broadcast and brought back (accelerate
agrees on its DataLoader's generator so) still reads as the state it was."""
HOST_INT_NUMEL = 1 << 24
"""Integer and bool tensors on the host hold index data: a sampler's permutation of a dataset's samples
(`torch.randperm(len(dataset))`), token ids. Their values are kept up to this many elements (128 MiB as int64), so
that the batches a shuffled DataLoader or a DistributedSampler picks are the ones a GPU host picks."""


def simulated(t: Any) -> bool:
    """Whether `t` is a tensor of the simulation (a fake tensor, or a Parameter around one)."""
    return isinstance(t, torch.Tensor) and isinstance(getattr(t, "data", t), FakeTensor)


def storage_key(t: torch.Tensor) -> int:
    """The identity of a tensor's storage, shared by its views and `.data` (0 where it has none)."""
    try:
        return t.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError, AttributeError):
        return 0


def small_enough(t: torch.Tensor) -> bool:
    """Whether a tensor is small enough for a value computed from known ones to be kept (`SMALL_NUMEL`;
    `SMALL_INT_NUMEL` for integers, `HOST_INT_NUMEL` for integers on the host, `STATE_BYTES` for uint8)."""
    n = t.numel()
    if n <= SMALL_NUMEL:
        return True
    if t.dtype.is_floating_point or t.dtype.is_complex:
        return False
    return n <= SMALL_INT_NUMEL or (n <= HOST_INT_NUMEL and t.device.type == "cpu") or \
        (n <= STATE_BYTES and t.dtype == torch.uint8)


def small_buffer(t: torch.Tensor) -> bool:
    """Whether a tensor is small enough to be given a placeholder value (a new buffer's zeros, `isfinite`'s True):
    `SMALL_NUMEL`, `SMALL_INT_NUMEL` for integers, wherever it lives."""
    n = t.numel()
    if n <= SMALL_NUMEL:
        return True
    return n <= SMALL_INT_NUMEL and not (t.dtype.is_floating_point or t.dtype.is_complex)

# Ops never recomputed on the CPU copies (no meaningful value, or handled elsewhere).
_NEVER = {"_local_scalar_dense", "record_stream", "set_", "resize_", "_resize_output_", "_pin_memory", "is_pinned"}
# Uninitialized memory: any bytes are a valid answer, and a small new buffer is taken as zeros, so that a program that
# fills part of one and sends it (DeepSpeed's pipeline metadata) sends known values.
_UNINITIALIZED = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"}


# Boolean ops with an absorbing element: `a | b` is all True where a known operand is all True, whatever the other
# (unknown) one holds; `a & b` all False where one is all False (Hugging Face's generate() combines its stopping
# criteria so: the known max-length flag with an end-of-sequence test on tokens no one knows).
_ABSORBING = {"bitwise_or": True, "bitwise_or_": True, "logical_or": True, "logical_or_": True, "__or__": True,
              "__ior__": True, "bitwise_and": False, "bitwise_and_": False, "logical_and": False,
              "logical_and_": False, "__and__": False, "__iand__": False}
# Ops whose result on a tensor that holds one value everywhere (too large for the table: a `torch.isfinite` of a
# gradient, fake.py) is the result on one element of it: element-wise boolean ops, copies, views, all / any / amax.
_UNIFORM_SAME = {"clone", "detach", "alias", "view", "_unsafe_view", "reshape", "expand", "lift_fresh", "t",
                 "transpose", "permute", "squeeze", "unsqueeze", "flatten", "contiguous", "slice", "select"}
_UNIFORM = {"all", "any", "logical_not", "bitwise_not", "logical_and", "logical_or", "bitwise_and", "bitwise_or",
            "__and__", "__or__", "__invert__", "_to_copy", "amax", "amin", "max", "min", "mean", "sum", "nansum",
            "add", "add_", "sub", "sub_", "rsub", "mul", "mul_", "div", "div_", "true_divide", "neg", "abs",
            "eq", "ne", "lt", "le", "gt", "ge", "where", "masked_fill", "masked_fill_", "clamp", "clamp_min",
            "clamp_max", "pow", "sqrt", "rsqrt", "reciprocal"} | _UNIFORM_SAME
# Reductions whose result over n equal elements is n times the element's.
_UNIFORM_SUMS = {"sum", "nansum"}
# Factories that fill every element with one value: packet -> schema position of the value (None: the value
# named below)
_CONSTANT = {"ones": 1, "ones_like": 1, "new_ones": 1, "zeros": 0, "zeros_like": 0, "new_zeros": 0,
             "full": "fill_value", "full_like": "fill_value", "new_full": "fill_value"}
# Ops that write a "found inf/NaN" flag: under the no-inf assumption the flag keeps its (known) value.
# packet name -> schema position of the flag argument
_ASSUME_FINITE = {"_amp_foreach_non_finite_check_and_unscale_": 1, "_amp_foreach_non_finite_check_and_unscale": 1}


def placeholder_scalar(dtype: torch.dtype) -> Any:
    """What `.item()` answers for a tensor whose value is unknown."""
    if dtype == torch.bool:
        return False
    if dtype.is_complex:
        return 0j
    if dtype.is_floating_point:
        return 0.0
    return 0


def _mutated_positions(func: Any) -> tuple[tuple[int, str], ...]:
    out = []
    schema = getattr(func, "_schema", None)
    if schema is None:
        return ()
    for i, a in enumerate(schema.arguments):
        if a.alias_info is not None and a.alias_info.is_write:
            out.append((i, a.name))
    return tuple(out)


class ValueTable:
    """The side table and the propagation rule."""

    def __init__(self) -> None:
        self.table: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._mutates: dict[Any, tuple[tuple[int, str], ...]] = {}
        self.computed = 0
        self._viewed: set[int] = set()
        """Storages of known values that a view shares (their data pointers): dropping one of them drops all."""
        self.uniform: WeakIdKeyDictionary = WeakIdKeyDictionary()
        """Tensors too large for the table known to hold one value everywhere (a Python scalar)."""
        self._uniform_storages: dict[int, list] = {}
        """The uniform tensors by storage (`storage_key`: weak references), so that a write finds the aliases of
        what it writes without a scan of every uniform tensor (optimizer states begin as `zeros_like`)."""

    def _note(self, real: torch.Tensor) -> None:
        ptr = real.untyped_storage().data_ptr()
        if ptr:
            self._viewed.add(ptr)

    def get(self, t: torch.Tensor) -> torch.Tensor | None:
        if not isinstance(t, FakeTensor):
            return t
        return self.table.get(t)

    def set(self, fake: torch.Tensor, real: torch.Tensor, shared: bool = False) -> None:
        """`fake`'s value is `real`; `shared`: another fake tensor holds the same elements (`t.data = new`)."""
        self.uniform.pop(fake, None)
        self.table[fake] = real
        if shared:
            self._note(real)

    def as_list(self, t: torch.Tensor) -> Any:
        """`t`'s known value as nested Python lists (to travel in a pickle or a file), or None."""
        value = self.table.get(t) if isinstance(t, FakeTensor) else None
        if value is None:
            return None
        with unset_fake_temporarily():
            return value.tolist()

    def set_from_list(self, t: torch.Tensor, known: Any) -> None:
        """`t`'s value is `known` (what `as_list` gave, on another rank or in another run)."""
        with unset_fake_temporarily():
            self.set(t, torch.tensor(known, dtype=t.dtype, device="cpu").reshape(tuple(t.shape)))

    def write(self, fake: torch.Tensor, real: torch.Tensor) -> None:
        """`fake` now holds `real` (a collective's result): written into its known value where it has one, so that
        a base or view sharing it sees the write, as on the GPU; else set."""
        self._drop_uniform(fake)
        old = self.table.get(fake) if isinstance(fake, FakeTensor) else None
        if old is not None and tuple(old.shape) == tuple(real.shape):
            try:
                old.copy_(real)
                return
            except RuntimeError:           # an expanded value (elements sharing memory): replace it
                pass
        self.set(fake, real.clone())

    def set_uniform(self, fake: torch.Tensor, value: Any) -> None:
        """`fake` holds `value` in every element (for tensors too large for the table)."""
        if fake not in self.uniform:
            key = storage_key(fake)
            if key:
                refs = self._uniform_storages.setdefault(key, [])
                refs[:] = [r for r in refs if r() is not None]
                refs.append(weakref.ref(fake))
        self.uniform[fake] = value
        if len(self._uniform_storages) > 2 * len(self.uniform) + 1024:      # storages of tensors gone
            self._uniform_storages = {k: live for k, refs in self._uniform_storages.items()
                                      if (live := [r for r in refs if r() is not None])}

    def _drop_uniform(self, fake: Any) -> None:
        """`fake` is written: it, and every tensor sharing its storage (a view, a detached alias), no longer holds
        one known value."""
        if not self.uniform or not isinstance(fake, FakeTensor):
            return
        self.uniform.pop(fake, None)
        key = storage_key(fake)
        for ref in self._uniform_storages.pop(key, ()) if key else ():
            t = ref()
            if t is not None and storage_key(t) == key:
                self.uniform.pop(t, None)

    def drop(self, fake: Any) -> None:
        if not isinstance(fake, FakeTensor):
            return
        self._drop_uniform(fake)
        v = self.table.pop(fake, None)
        if v is None or not self._viewed:
            return
        ptr = v.untyped_storage().data_ptr()
        if ptr in self._viewed:                # its base and the other views hold the same elements: unknown too
            for k in [k for k, w in self.table.items() if w.untyped_storage().data_ptr() == ptr]:
                self.table.pop(k, None)

    def swap(self, a: torch.Tensor, b: torch.Tensor) -> None:
        ua, ub = self.uniform.pop(a, None), self.uniform.pop(b, None)
        if ub is not None:
            self.set_uniform(a, ub)
        if ua is not None:
            self.set_uniform(b, ua)
        va, vb = self.table.pop(a, None), self.table.pop(b, None)
        if vb is not None:
            self.table[a] = vb
        if va is not None:
            self.table[b] = va

    # -- propagation ------------------------------------------------------------------------------------------------
    def _mutated_args(self, func: Any, args: tuple, kwargs: dict) -> list[Any]:
        pos = self._mutates.get(func)
        if pos is None:
            pos = self._mutates[func] = _mutated_positions(func)
        out = []
        for i, name in pos:
            if i < len(args):
                out.append(args[i])
            elif name in kwargs:
                out.append(kwargs[name])
        return out

    def forget_mutated(self, func: Any, args: tuple, kwargs: dict) -> None:
        keep = _ASSUME_FINITE.get(getattr(getattr(func, "_overloadpacket", None), "__name__", ""))
        flag = args[keep] if keep is not None and keep < len(args) else None
        for m in self._mutated_args(func, args, kwargs):
            if m is flag:
                continue
            for t in pytree.tree_leaves(m):
                self.drop(t)

    def real_args(self, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        """The op's arguments with fake tensors replaced by their known values; None if one is unknown or big."""
        leaves, spec = pytree.tree_flatten((args, kwargs))
        table = self.table
        out = []
        for x in leaves:
            if isinstance(x, torch.Tensor):
                if isinstance(x, FakeTensor):
                    v = table.get(x)
                    if v is None:
                        return None
                    x = v
                elif not small_enough(x) or x.device.type == "meta":
                    return None
            elif isinstance(x, torch.device) and x.type != "cpu":
                x = torch.device("cpu")
            out.append(x)
        a, k = pytree.tree_unflatten(out, spec)
        if "device" in k and k["device"] is not None:
            k["device"] = torch.device("cpu")
        if k.get("pin_memory"):
            k["pin_memory"] = False
        return a, k

    def after_op(self, func: Any, packet: str, args: tuple, kwargs: dict, out: Any) -> None:
        """Propagate known values through an op the fake mode just ran (and expert routes, routes.py)."""
        if packet in _NEVER:
            return
        ROUTES.after_op(packet, args, kwargs, out, self)
        if packet in _UNINITIALIZED:
            for o in pytree.tree_leaves(out):
                if isinstance(o, FakeTensor) and small_buffer(o) and o.device.type != "meta":
                    with unset_fake_temporarily():
                        self.table[o] = torch.zeros(tuple(o.shape), dtype=o.dtype, device="cpu")
            return
        outs = [o for o in pytree.tree_leaves(out) if isinstance(o, torch.Tensor)]
        large = not all(small_enough(o) for o in outs)
        constant = large and (packet in _CONSTANT or packet in ("fill_", "zero_", "copy_"))
        if self.uniform or constant:
            found = None
            if constant:
                found = self._constant_result(packet, args, kwargs, out)
            elif packet in _UNIFORM:
                found = self._uniform_result(func, packet, args, kwargs, out)
            for m in self._mutated_args(func, args, kwargs):        # written: its aliases lose their one value
                for t in pytree.tree_leaves(m):
                    self._drop_uniform(t)
            if found is not None:
                for f, v in found:
                    self._set_everywhere(f, v)
                return
        if large:
            self.forget_mutated(func, args, kwargs)
            return
        ra = self.real_args(args, kwargs)
        if ra is None:
            if packet in _ABSORBING and self._absorbed(_ABSORBING[packet], args, outs):
                return
            if packet == "copy_" and self._overwritten(args):
                return
            if packet in ("fill_", "zero_") and self._filled(packet, args):
                return
            self.forget_mutated(func, args, kwargs)
            return
        try:
            with unset_fake_temporarily():
                real_out = func(*ra[0], **ra[1])
        except Exception:  # noqa: BLE001 - any failure just means "value unknown"
            self.forget_mutated(func, args, kwargs)
            return
        real_leaves = pytree.tree_leaves(real_out)
        fake_leaves = pytree.tree_leaves(out)
        if len(real_leaves) != len(fake_leaves):
            self.forget_mutated(func, args, kwargs)
            return
        self.computed += 1
        view = getattr(func, "is_view", False)       # its value shares its base's elements
        for f, r in zip(fake_leaves, real_leaves):
            if isinstance(f, FakeTensor) and isinstance(r, torch.Tensor) and tuple(f.shape) == tuple(r.shape):
                self.table[f] = r
                if view:
                    self._note(r)
        # in-place ops whose output is not returned as the mutated tensor (out= variants) keep their values too
        for m, rm in zip(self._mutated_args(func, args, kwargs), self._mutated_args(func, *ra)):
            for f, r in zip(pytree.tree_leaves(m), pytree.tree_leaves(rm)):
                if isinstance(f, FakeTensor) and isinstance(r, torch.Tensor) and tuple(f.shape) == tuple(r.shape):
                    self.table[f] = r

    def _constant_result(self, packet: str, args: tuple, kwargs: dict, out: Any) -> list | None:
        """A factory that fills a tensor too large for the table with one value (`torch.ones`, `full`, `fill_`,
        `zero_`, a copy from a tensor holding one value): [(output, value)], or None where the value is not a known
        number."""
        if packet == "zero_":
            value: Any = 0
        elif packet == "fill_":
            value = args[1] if len(args) > 1 else None
        elif packet == "copy_":                 # every element of the destination gets the source's one value
            value = self.uniform.get(args[1]) if len(args) > 1 and isinstance(args[1], FakeTensor) else None
            if value is None:
                return None
        else:
            pos = _CONSTANT[packet]
            if isinstance(pos, str):
                value = kwargs.get(pos)
                if value is None:
                    value = next((a for a in args[1:] if isinstance(a, (bool, int, float))), None)
            else:
                value = pos
        if isinstance(value, torch.Tensor):
            known = self.get(value)
            if known is None or known.numel() != 1:
                return None
            with unset_fake_temporarily():
                value = known.reshape(()).item()
        if not isinstance(value, (bool, int, float)):
            return None
        found = []
        for f in pytree.tree_leaves(out):
            if isinstance(f, FakeTensor):
                with unset_fake_temporarily():
                    found.append((f, torch.full((), value, dtype=f.dtype, device="cpu").item()))
        return found or None

    def _uniform_result(self, func: Any, packet: str, args: tuple, kwargs: dict, out: Any) -> list | None:
        """An op of `_UNIFORM` with an operand known to hold one value everywhere (and the others so, or known 0-d
        values): computed on one element of each, its result holds that value everywhere (a view or a copy of such
        a tensor holds its value; a sum over n elements n times it): [(output, value)]. None: not such a case."""
        if packet in _UNIFORM_SAME:
            v = self.uniform.get(args[0]) if args and isinstance(args[0], FakeTensor) else None
            if v is None:
                return None
            return [(f, v) for f in pytree.tree_leaves(out) if isinstance(f, FakeTensor)] or None
        leaves, spec = pytree.tree_flatten((args, kwargs))
        reps = []
        uniform = False
        for x in leaves:
            if isinstance(x, FakeTensor):
                v = self.uniform.get(x)
                if v is not None:
                    uniform = True
                    with unset_fake_temporarily():
                        x = torch.full([1] * x.dim(), v, dtype=x.dtype, device="cpu")
                else:
                    known = self.table.get(x)
                    if known is None or known.dim() != 0:
                        return None
                    x = known
            elif isinstance(x, torch.Tensor):
                return None
            elif isinstance(x, torch.device) and x.type != "cpu":
                x = torch.device("cpu")
            reps.append(x)
        if not uniform:
            return None
        a, k = pytree.tree_unflatten(reps, spec)
        if k.get("device") is not None:
            k["device"] = torch.device("cpu")
        try:
            with unset_fake_temporarily():
                real = func(*a, **k)
        except Exception:  # noqa: BLE001 - not computable on one element: the ordinary rule applies
            return None
        fakes, reals = pytree.tree_leaves(out), pytree.tree_leaves(real)
        if len(fakes) != len(reals):
            return None
        for f, r in zip(fakes, reals):
            if not isinstance(f, FakeTensor) or not isinstance(r, torch.Tensor) or r.numel() != 1:
                return None
        found = []
        src = args[0] if args and isinstance(args[0], torch.Tensor) else None
        for f, r in zip(fakes, reals):
            with unset_fake_temporarily():
                if packet in _UNIFORM_SUMS and src is not None and f.numel():
                    r = r * (src.numel() // f.numel())
                found.append((f, r.reshape(()).item()))
        return found

    def _set_everywhere(self, f: torch.Tensor, value: Any) -> None:
        """`f` holds `value` in every element: in the table when small enough, else as a uniform value."""
        if small_enough(f):
            with unset_fake_temporarily():
                self.set(f, torch.full(tuple(f.shape), value, dtype=f.dtype, device="cpu"))
        else:
            self.set_uniform(f, value)

    def _overwritten(self, args: tuple) -> bool:
        """`dst.copy_(src)` with `src` known and `dst` not: every element of `dst` is overwritten, so it is known
        (its old value never mattered)."""
        if len(args) < 2 or not isinstance(args[0], FakeTensor) or not isinstance(args[1], torch.Tensor):
            return False
        src = self.get(args[1])
        if src is None:
            return False
        dst = args[0]
        try:
            with unset_fake_temporarily():
                real = torch.empty(tuple(dst.shape), dtype=dst.dtype, device="cpu")
                real.copy_(src)
                self.write(dst, real)
        except Exception:  # noqa: BLE001 - a copy the CPU cannot make: value unknown
            return False
        return True

    def _filled(self, packet: str, args: tuple) -> bool:
        """`t.fill_(v)` or `t.zero_()` with `t`'s value unknown: every element is overwritten with a known value
        (a Python number, or a known one-element tensor), so `t` is known (`nn.init.constant_`, `zeros_`)."""
        if not args or not isinstance(args[0], FakeTensor):
            return False
        if packet == "zero_":
            value: Any = 0
        elif len(args) < 2:
            return False
        elif isinstance(args[1], torch.Tensor):
            known = self.get(args[1])
            if known is None or known.numel() != 1:
                return False
            with unset_fake_temporarily():
                value = known.reshape(()).item()
        elif isinstance(args[1], (bool, int, float)):
            value = args[1]
        else:
            return False
        dst = args[0]
        try:
            with unset_fake_temporarily():
                self.write(dst, torch.full(tuple(dst.shape), value, dtype=dst.dtype, device="cpu"))
        except Exception:  # noqa: BLE001 - a fill the CPU cannot make: value unknown
            return False
        return True

    def _absorbed(self, element: bool, args: tuple, outs: list) -> bool:
        """Whether a known operand of a boolean or / and is all `element` (the op's absorbing element): then every
        output element is `element`, whatever the unknown operand holds, and the outputs (an in-place op's own
        tensor among them) get that value."""
        out = outs[0] if len(outs) == 1 else None
        if not isinstance(out, FakeTensor) or out.dtype.is_floating_point or out.dtype.is_complex:
            return False
        if element and out.dtype != torch.bool:      # integers: `x | 1` is not 1; `x & 0` is 0
            return False
        found = False
        for a in args[:2]:
            if isinstance(a, (bool, int)):
                found = found or bool(a) is element and (a in (0, 1))
            elif isinstance(a, torch.Tensor):
                v = self.get(a)
                if v is not None and v.numel():
                    with unset_fake_temporarily():
                        found = found or bool((v.to(torch.bool) == element).all())
        if not found:
            return False
        with unset_fake_temporarily():
            self.table[out] = torch.full(tuple(out.shape), element, dtype=out.dtype, device="cpu")
        return True

    # -- readers ------------------------------------------------------------------------------------------------------
    def item(self, t: torch.Tensor) -> Any:
        v = self.get(t)
        if v is None:
            return placeholder_scalar(t.dtype)
        with unset_fake_temporarily():
            return v.reshape(-1)[0].item() if v.numel() else placeholder_scalar(t.dtype)

    def real_or_zeros(self, t: torch.Tensor) -> torch.Tensor:
        """A real CPU tensor for `t`: its known value, or zeros of its shape and dtype."""
        v = self.get(t)
        with unset_fake_temporarily():
            if v is not None:
                return v.detach().clone()
            one = self.uniform.get(t) if isinstance(t, FakeTensor) else None
            if one is not None:
                return torch.full(tuple(t.shape), one, dtype=t.dtype, device="cpu")
            return torch.zeros(tuple(t.shape), dtype=t.dtype, device="cpu")

    def has_value(self, t: torch.Tensor) -> bool:
        return self.get(t) is not None

    def watching(self) -> bool:
        """Whether a view op can carry anything: a known value or an expert route (the views' fast path)."""
        return bool(self.table) or bool(ROUTES.table) or bool(self.uniform)


VALUES = ValueTable()
