"""Writing a record back to TOML in canonical form.

The standard library reads TOML but does not write it; records only need strings, numbers, booleans, lists of those
and nested tables, so this small writer covers them. Keys keep the order of the table given (the schema's field
order); scalar keys come before sub-tables, as TOML requires. Floats are written with `repr`, so reading the text
back gives the same value.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")      # characters TOML lets a string hold only escaped


def _key(k: str) -> str:
    return k if BARE_KEY.fullmatch(k) else _basic(k)


def _basic(s: str) -> str:
    """A basic (one-line) string: JSON escapes every character TOML needs escaped but DEL."""
    return json.dumps(s, ensure_ascii=False).replace("\x7f", "\\u007f")


def _string(s: str) -> str:
    if "\n" in s and '"""' not in s and "\\" not in s and not CONTROL.search(s):
        # A multi-line basic string; a newline right after the opening quotes is trimmed by TOML readers.
        return '"""\n' + s.replace('"', '\\"') + '"""'
    return _basic(s)


def value(v: Any) -> str:
    """TOML text of one value (a string quoted and escaped as TOML requires)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ValueError(f"cannot write {v!r} to a record")
        return repr(v)
    if isinstance(v, str):
        return _string(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(value(x) for x in v) + "]"
    raise TypeError(f"cannot write a {type(v).__name__} to TOML")


def dumps(table: dict[str, Any], header: str = "") -> str:
    """TOML text of a nested table; `header` (comment lines without '#') goes first."""
    lines: list[str] = [f"# {line}".rstrip() for line in header.splitlines()]
    _emit(table, [], lines)
    return "\n".join(lines).strip("\n") + "\n"


def _emit(table: dict[str, Any], path: list[str], lines: list[str]) -> None:
    scalars = [(k, v) for k, v in table.items() if not isinstance(v, dict)]
    tables = [(k, v) for k, v in table.items() if isinstance(v, dict)]
    if path and (scalars or not tables):
        lines.append("")
        lines.append("[" + ".".join(_key(p) for p in path) + "]")
    for k, v in scalars:
        lines.append(f"{_key(k)} = {value(v)}")
    for k, v in tables:
        _emit(v, path + [k], lines)
