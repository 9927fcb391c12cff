"""Conversions between Python data and tensors: host work in proportion to the data, inside one built-in call.

The host-CPU model counts calls and dispatches (docs/host-cpu.md); `torch.tensor(list)` is one built-in call and one
dispatch whatever the list's length, yet on a real host it walks the list element by element (twice when no dtype is
given: once to infer it), and `Tensor.tolist()` makes a Python object per element. In `model` mode each such
conversion the framework makes charges the rank's CPU clock its elements times the `[host]` preset's price
(`to_tensor_ns`, `infer_dtype_ns`, `to_list_ns`; phantora.hostcpu.ConvertCosts), like host compute: the time
travels with the rank's next op, and a replay keeps it as recorded.

What is charged, in this one place for every framework:
- `torch.tensor`, `torch.as_tensor`, `torch.asarray` of a Python list, tuple or scalar (not of a tensor or a numpy
  array, which PyTorch copies or shares as a block): the result's elements at `to_tensor_ns`, plus `infer_dtype_ns`
  when the call names no dtype;
- `Tensor.tolist()` (fake.py's reader calls `charge_to_list`): the tensor's elements at `to_list_ns`.
Only the framework's calls are charged (the stubs' own conversions are not): the charge is made on the outermost
entry into the stubs. `measured` mode installs nothing: the thread time there already holds the framework's
conversions.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from .clock import METER

_SCALARS = (bool, int, float, complex)
_PATCHED: dict[str, Any] = {}
STATS = {"to_tensor": 0, "infer_dtype": 0, "to_list": 0, "seconds": 0.0}
"""Elements converted and seconds charged in this process (model mode), for tests and diagnostics."""


class _State:
    costs = None          # phantora.hostcpu.ConvertCosts, set by install
    runtime = None


def _charge(seconds: float) -> None:
    if seconds > 0 and _State.runtime is not None:
        STATS["seconds"] += seconds
        _State.runtime.advance_cpu(seconds)


def _sequence_elements(data: Any, out: Any) -> int:
    """Elements a conversion from `data` walks in Python objects: the result's, for a list, tuple or scalar."""
    if isinstance(data, (list, tuple)) or type(data) in _SCALARS:
        return out.numel() if isinstance(out, torch.Tensor) else 0
    return 0


def _charge_to_tensor(data: Any, out: Any, dtype: Any) -> None:
    costs = _State.costs
    if costs is None or not METER.outermost():
        return
    n = _sequence_elements(data, out)
    if not n:
        return
    STATS["to_tensor"] += n
    seconds = n * costs.to_tensor_s
    if dtype is None:
        STATS["infer_dtype"] += n
        seconds += n * costs.infer_dtype_s
    _charge(seconds)


def active() -> bool:
    """Whether conversions are charged (model mode, installed)."""
    return _State.costs is not None


def charge_to_list(t: torch.Tensor) -> None:
    """`t.tolist()` made by the framework: its elements at `to_list_ns` (the caller has entered the meter)."""
    costs = _State.costs
    if costs is None or not METER.outermost():
        return
    n = t.numel()
    STATS["to_list"] += n
    _charge(n * costs.to_list_s)


def _wrap(name: str):
    original = getattr(torch, name)

    @functools.wraps(original)
    def convert(data, *args, **kwargs):
        out = original(data, *args, **kwargs)      # outside the stubs, as the framework's own call
        METER.enter(2)                             # this frame and the meter's
        try:
            _charge_to_tensor(data, out, kwargs.get("dtype"))      # dtype is a keyword argument of all three
        finally:
            METER.exit()
        return out

    convert._phantora = True                       # type: ignore[attr-defined]
    return original, convert


def _script_as(convert, original) -> None:
    """TorchScript compiles `torch.tensor(...)` as the builtin `aten::tensor`; found as this Python wrapper it
    would try to compile the wrapper and fail (torch.distributed.optim's scripted functional optimizers fail so at
    import). The wrapper is registered as the builtin the original is."""
    from torch.jit import _builtins

    op = _builtins._find_builtin(original)
    if op is not None:
        _builtins._register_builtin(convert, op)


def install(ctx) -> None:
    """Charge the framework's conversions in `model` mode (idempotent; nothing in `measured` mode)."""
    if ctx.config.host_cpu != "model":
        return
    _State.costs = ctx.config.convert_costs
    _State.runtime = ctx.runtime
    if _PATCHED:
        return
    for name in ("tensor", "as_tensor", "asarray"):
        original, convert = _wrap(name)
        _PATCHED[name] = original
        _script_as(convert, original)
        setattr(torch, name, convert)
