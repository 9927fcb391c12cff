"""A kernel Inductor generated, rebuilt from its recipe for timing on a GPU host (`phantora profile`).

Under simulation a compiled region's generated kernels are signatures `inductor.pointwise` / `inductor.reduction`
(docs/compile.md); where every size is static, the signature's `graph` scalar is the kernel's recipe
(stubs/phantora_stubs/kernel_recipe.py writes it), JSON:

    {"in":  [[shape, stride, dtype], ...],        what the kernel reads (graph inputs or other kernels' buffers)
     "ops": [[op, args, kwargs], ...],            the fused FX nodes in graph order, e.g. "aten.mul.Tensor"
     "out": [i, ...]}                             the ops whose values the kernel stores

An argument is a number, string, bool, null, a list, or an object: {"n": i} the value of op i, {"in": j} input j,
{"dtype": "bfloat16"}, {"device": "cuda"}, {"enum": "contiguous_format"} (a memory format or layout),
{"float": "inf"}.

A recipe comes from a trace, which may come from anyone: `parse` checks its structure and references, and `rebuild`
runs only functional aten and prims ops (no op that writes to its arguments) with strings only where an op takes a
mode by name (`rounding_mode`, `approximate`, ...; never a file name).

`rebuild` makes a function of the inputs that runs the ops and returns the stored values, and inputs for it;
`phantora profile` compiles the function with Inductor on the GPU (`torch.compile(fullgraph=True,
dynamic=False)`, default mode) and times one call of the compiled function as it times an aten op (measure.py):
what Inductor generates there for the same ops, at the same sizes. Inductor on the GPU host may split or fuse
the ops differently from the simulated run's scheduler; the time is of everything the compiled call launches.
"""

from __future__ import annotations

import json
from typing import Any, Callable

from ..errors import PhantoraError

_TRUSTED_NAMESPACES = ("aten", "prims")
_STRING_ARGUMENTS = frozenset({"rounding_mode", "approximate", "reduce", "side", "interpolation", "padding_mode",
                               "reduction"})
"""The only arguments a recipe may give as strings: a string elsewhere (a file name: aten.from_file) is refused."""


def parse(recipe: str) -> dict:
    """The recipe's JSON, checked for the fields `rebuild` needs; a PhantoraError naming what is wrong."""
    try:
        data = json.loads(recipe)
    except ValueError as e:
        raise PhantoraError(f"a generated kernel's recipe is not JSON ({e})") from None
    if not isinstance(data, dict) or not all(isinstance(data.get(k), list) for k in ("in", "ops", "out")):
        raise PhantoraError("a generated kernel's recipe needs the lists 'in', 'ops' and 'out'")
    n = len(data["ops"])
    for i, op in enumerate(data["ops"]):
        if not (isinstance(op, list) and len(op) == 3 and isinstance(op[0], str) and isinstance(op[1], list)
                and isinstance(op[2], dict)):
            raise PhantoraError(f"op {i} of a generated kernel's recipe is not [name, args, kwargs]")
        if op[0].split(".")[0] not in _TRUSTED_NAMESPACES:
            raise PhantoraError(f"op {i} of a generated kernel's recipe, {op[0]}, is not an aten or prims op")
    if not data["out"] or not all(isinstance(i, int) and 0 <= i < n for i in data["out"]):
        raise PhantoraError("a generated kernel's recipe stores values of ops it does not have")
    for j, entry in enumerate(data["in"]):
        if not (isinstance(entry, list) and len(entry) == 3 and all(isinstance(v, list) for v in entry[:2])
                and len(entry[0]) == len(entry[1]) and all(isinstance(v, int) and v >= 0 for v in entry[0] + entry[1])
                and isinstance(entry[2], str)):
            raise PhantoraError(f"input {j} of a generated kernel's recipe is not [shape, stride, dtype]")
    for i, (_name, args, kwargs) in enumerate(data["ops"]):
        _check_references((args, kwargs), i, len(data["in"]))
    return data


def _check_references(v, op_index: int, inputs: int) -> None:
    """Every {"n": k} names an earlier op, every {"in": j} an input."""
    if isinstance(v, (list, tuple)):
        for x in v:
            _check_references(x, op_index, inputs)
    elif isinstance(v, dict):
        if "n" in v and not (isinstance(v["n"], int) and 0 <= v["n"] < op_index):
            raise PhantoraError(f"op {op_index} of a generated kernel's recipe reads a value no earlier op made")
        if "in" in v and not (isinstance(v["in"], int) and 0 <= v["in"] < inputs):
            raise PhantoraError(f"op {op_index} of a generated kernel's recipe reads an input it does not list")
        if not ({"n", "in", "dtype", "device", "enum", "float"} & set(v)):
            for x in v.values():
                _check_references(x, op_index, inputs)


def _check_op(name: str, op, args: list, kwargs: dict) -> None:
    """Only functional ops, and strings only where an op takes a mode by name (no file names)."""
    schema = op._schema
    if schema.is_mutable:
        raise PhantoraError(f"a generated kernel's recipe calls {name}, which writes to its arguments")
    names = [a.name for a in schema.arguments]
    for pos, value in [*enumerate(args), *kwargs.items()]:
        arg = names[pos] if isinstance(pos, int) and pos < len(names) else pos
        if isinstance(value, str) and arg not in _STRING_ARGUMENTS:
            raise PhantoraError(f"a generated kernel's recipe gives {name} the string argument {arg!r}")


def _decoder(values: list, inputs: list) -> Callable[[Any], Any]:
    import torch

    def decode(v: Any) -> Any:
        if isinstance(v, list):
            return [decode(x) for x in v]
        if isinstance(v, dict):
            if "n" in v:
                return values[v["n"]]
            if "in" in v:
                return inputs[v["in"]]
            if "dtype" in v:
                return getattr(torch, v["dtype"])
            if "device" in v:
                return torch.device(v["device"])
            if "enum" in v:
                return getattr(torch, v["enum"])
            if "float" in v:
                return float(v["float"])
            raise PhantoraError(f"a generated kernel's recipe has an argument it cannot read: {v}")
        return v
    return decode


def rebuild(recipe: str, device: str = "cuda", seed: int = 0) -> tuple[Callable[..., tuple], list]:
    """(function of the inputs returning the stored values, inputs) for a recipe; `device` replaces the recorded
    device of factory ops ("cuda" on a GPU host, "cpu" to check a recipe without one)."""
    import torch

    from .measure import make_tensor, resolve_op

    data = parse(recipe)
    ops = []
    for name, args, kwargs in data["ops"]:
        op = resolve_op(name)                   # a PhantoraError for a name this torch lacks
        _check_op(name, op, args, kwargs)
        ops.append((op, args, kwargs))
    gen = torch.Generator(device=torch.device(device)).manual_seed(seed)
    inputs = []
    for entry in data["in"]:
        shape, stride, dtype = entry
        dt = getattr(torch, dtype, None)
        # integer inputs are indices or positions in fused kernels: zeros index validly whatever they index
        if isinstance(dt, torch.dtype) and not dt.is_floating_point and dt != torch.bool:
            t = torch.zeros(max(1, _storage(shape, stride)), dtype=dt, device=device).as_strided(shape, stride)
        else:
            t = make_tensor(tuple(shape), dtype, tuple(stride), device, gen=gen)
        inputs.append(t)
    out = list(data["out"])

    def kernel(*ins: Any) -> tuple:
        values: list = []
        decode = _decoder(values, list(ins))
        for op, args, kwargs in ops:
            a = decode(args)
            kw = {k: decode(v) for k, v in kwargs.items()}
            if "device" in kw and kw["device"] is not None:
                kw["device"] = torch.device(device)
            values.append(op(*a, **kw))
        return tuple(values[i] for i in out)

    return kernel, inputs


def _storage(shape: list, stride: list) -> int:
    if any(s == 0 for s in shape):
        return 0
    return 1 + sum((s - 1) * st for s, st in zip(shape, stride))
