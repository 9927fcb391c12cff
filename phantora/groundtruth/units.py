"""Unit aliases a submitted record may use, and their conversion to the canonical keys.

A record is stored with one unit per quantity (tokens/s per GPU, MFU in percent, seconds, GiB = 2^30 bytes). A
submission may give a metric under an alias key in another unit; `normalize_units` rewrites the raw TOML table to the
canonical keys before the schema sees it. Giving a quantity twice (canonical key and alias, or two aliases) is an
error, never a silent choice.
"""

from __future__ import annotations

import datetime as _dt
import math
from typing import Any, Callable

from ..errors import PresetError

GIB = 2**30

# alias key -> (canonical key, conversion, what the alias means)
METRIC_ALIASES: dict[str, tuple[str, Callable[[float, dict[str, Any]], float], str]] = {
    "mfu": ("mfu_percent", lambda v, t: 100.0 * v, "MFU as a fraction (0.568)"),
    "memory_gb": ("memory_gib", lambda v, t: v * 1e9 / GIB, "peak memory in GB (10^9 bytes)"),
    "memory_mib": ("memory_gib", lambda v, t: v / 1024.0, "peak memory in MiB"),
    "memory_bytes": ("memory_gib", lambda v, t: v / GIB, "peak memory in bytes"),
    "iteration_ms": ("iteration_s", lambda v, t: v / 1000.0, "iteration time in milliseconds"),
    "tokens_per_s": ("tokens_per_s_per_gpu", lambda v, t: v / _gpus(t), "tokens/s of the whole job"),
}


def _gpus(table: dict[str, Any]) -> int:
    gpus = table.get("hardware", {}).get("gpus")
    if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus <= 0:
        raise PresetError("converting a whole-job rate to a per-GPU rate needs a positive hardware.gpus",
                          key="metrics.tokens_per_s")
    return gpus


def normalize_units(table: dict[str, Any], *, file: str | None = None) -> dict[str, Any]:
    """A copy of a raw record table with alias metric keys converted to the canonical ones.

    TOML dates (`date = 2024-12-03`) become ISO strings.
    """
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in table.items()}
    source = out.get("source")
    if isinstance(source, dict) and isinstance(source.get("date"), _dt.date):
        source["date"] = source["date"].isoformat()
    for section in ("metrics", "simulation"):
        metrics = out.get(section)
        if not isinstance(metrics, dict):
            continue
        for alias, (canon, convert, meaning) in METRIC_ALIASES.items():
            if alias not in metrics:
                continue
            key = f"{section}.{alias}"
            if canon in metrics:
                raise PresetError(f"gives the same quantity as '{section}.{canon}'; keep one of them", file=file,
                                  key=key)
            value = metrics.pop(alias)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise PresetError(f"expected a number ({meaning}), got {value!r}", file=file, key=key)
            if not math.isfinite(value):
                raise PresetError(f"expected a finite number ({meaning}), got {value!r}", file=file, key=key)
            try:
                metrics[canon] = float(convert(float(value), out))
            except PresetError as exc:
                raise PresetError(str(exc), file=file) from None
    return out
