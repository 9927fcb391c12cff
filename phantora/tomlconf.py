"""Typed dataclasses from TOML tables, with errors that name the file and the key.

`build(cls, table, file=..., prefix=...)` checks that every required field is present, that no unknown key is
given (a typo must not be silently ignored), and that each value has the declared type (ints are accepted where a
float is declared, and a float must be finite: TOML's `nan` and `inf` are refused). Nested dataclasses and
`dict[str, float]` / `list[...]` fields are supported. A dataclass's `validate()` method, if any, runs after it is
built; `check_number` is the range check those methods share.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

from .errors import PresetError

T = TypeVar("T")


def read_toml(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise PresetError("file not found", file=str(path)) from None
    except tomllib.TOMLDecodeError as exc:
        raise PresetError(f"not valid TOML: {exc}", file=str(path)) from None
    except UnicodeDecodeError:
        raise PresetError("not a TOML file (not UTF-8 text)", file=str(path)) from None
    except IsADirectoryError:
        raise PresetError("a directory, not a TOML file", file=str(path)) from None
    except OSError as exc:
        raise PresetError(f"cannot read: {exc.strerror or exc}", file=str(path)) from None


def check_number(value: Any, key: str, *, positive: bool = False, nonnegative: bool = False,
                 at_most: float | None = None, file: str | None = None) -> None:
    """Refuse a figure that is not a finite number or lies out of its range, naming `key` (and `file` if given).

    NaN, infinities, booleans and non-numbers are always refused; `positive=True` refuses zero and below,
    `nonnegative=True` refuses values below zero, `at_most` refuses values above it. Meant for `validate()` methods
    (`build` adds the file to an error raised without one), e.g.
    `check_number(self.cpu_time_scale, "host.cpu_time_scale", positive=True)`.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PresetError(f"expected a number, got {value!r}", file=file, key=key)
    if not math.isfinite(value):
        raise PresetError(f"expected a finite number, got {value!r}", file=file, key=key)
    if positive and value <= 0:
        raise PresetError(f"must be positive, got {value!r}", file=file, key=key)
    if nonnegative and value < 0:
        raise PresetError(f"must not be negative, got {value!r}", file=file, key=key)
    if at_most is not None and value > at_most:
        raise PresetError(f"must be at most {at_most:g}, got {value!r}", file=file, key=key)


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def _check(value: Any, tp: Any, file: str | None, key: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        given = [a for a in args if a is not type(None)]
        if len(given) == 1:          # an optional value: its own type's message says what is wrong
            return _check(value, given[0], file, key)
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _check(value, arg, file, key)
            except PresetError as exc:
                errors.append(str(exc))
        raise PresetError(f"expected {' or '.join(_type_name(a) for a in args)}, got {value!r}", file=file, key=key)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise PresetError(f"expected a table, got {value!r}", file=file, key=key)
        return build(tp, value, file=file, prefix=key)
    if origin is dict:
        ktp, vtp = typing.get_args(tp)
        if not isinstance(value, dict):
            raise PresetError(f"expected a table, got {value!r}", file=file, key=key)
        return {str(k): _check(v, vtp, file, f"{key}.{k}") for k, v in value.items()}
    if origin in (list, tuple):
        args = typing.get_args(tp)
        if not isinstance(value, list):
            raise PresetError(f"expected a list, got {value!r}", file=file, key=key)
        etp = args[0] if args else Any
        items = [_check(v, etp, file, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if tp is Any:
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise PresetError(f"expected a number, got {value!r}", file=file, key=key)
        if not math.isfinite(value):     # TOML's nan / inf: no figure of a preset or record is meant so
            raise PresetError(f"expected a finite number, got {value!r}", file=file, key=key)
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise PresetError(f"expected an integer, got {value!r}", file=file, key=key)
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise PresetError(f"expected true or false, got {value!r}", file=file, key=key)
        return value
    if tp is str:
        if not isinstance(value, str):
            raise PresetError(f"expected a string, got {value!r}", file=file, key=key)
        return value
    return value


def build(cls: type[T], table: dict[str, Any], *, file: str | None = None, prefix: str = "") -> T:
    """Build dataclass `cls` from a TOML table, validating keys and types."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(table) - set(fields))
    if unknown:
        key = f"{prefix}.{unknown[0]}" if prefix else unknown[0]
        raise PresetError(f"unknown key (expected one of: {', '.join(sorted(fields))})", file=file, key=key)
    kwargs = {}
    for name, f in fields.items():
        key = f"{prefix}.{name}" if prefix else name
        if name not in table:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise PresetError("required key is missing", file=file, key=key)
            continue
        kwargs[name] = _check(table[name], hints[name], file, key)
    obj = cls(**kwargs)
    validate = getattr(obj, "validate", None)
    if callable(validate):
        try:
            validate()
        except PresetError as exc:
            if exc.file is None:
                raise PresetError(str(exc), file=file) from None
            raise
    return obj


def to_table(obj: Any) -> Any:
    """A dataclass as plain dicts/lists (the inverse of `build`)."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_table(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {k: to_table(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_table(v) for v in obj]
    return obj
