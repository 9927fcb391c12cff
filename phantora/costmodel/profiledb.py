"""Measured kernel profiles: one HDF5 file per GPU model.

File layout (format "phantora-profile", version 1; docs/cost-model.md has the full description):

    /                      attributes: format, version, gpu, driver, torch_version, created (ISO 8601 UTC), command
    /records               compound dataset, one row per signature:
                           key (UTF-8 string, Signature.key()), median_us, p10_us, p90_us (float64), count (int64)

`ProfileDB.create(...)` starts an empty database in memory, `.add(sig, samples_us)` records a measurement (a
re-measurement of a signature replaces the earlier record), `.save()` writes the whole file atomically (a temporary
file beside it, then a rename). `ProfileDB.open(path)` reads one; a file that is not HDF5, not a Phantora profile,
of a newer version or with malformed rows raises `ProfileDBError` naming the file and the problem.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable, Iterator

from ..errors import PhantoraError
from .signature import Signature

FORMAT = "phantora-profile"
VERSION = 1
_META_KEYS = ("gpu", "driver", "torch_version", "created", "command")


class ProfileDBError(PhantoraError):
    """A profile database file is missing, corrupt, or not a Phantora profile database."""


@dataclass(frozen=True, slots=True)
class ProfileRecord:
    median_us: float
    p10_us: float
    p90_us: float
    count: int


def summarize(samples_us: Iterable[float]) -> ProfileRecord:
    """Median, 10th and 90th percentiles (linear interpolation, as numpy's default) and count of samples."""
    xs = sorted(float(x) for x in samples_us)
    if not xs:
        raise ProfileDBError("a profile record needs at least one sample")
    if any(not math.isfinite(x) or x < 0 for x in xs):
        raise ProfileDBError("profile samples must be finite, non-negative microseconds")

    def q(p: float) -> float:
        pos = p * (len(xs) - 1)
        lo = int(math.floor(pos))
        hi = min(lo + 1, len(xs) - 1)
        return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)

    return ProfileRecord(q(0.5), q(0.1), q(0.9), len(xs))


class ProfileDB:
    """Profile of one GPU model: signature key -> ProfileRecord, plus provenance metadata."""

    def __init__(self, path: str | os.PathLike, meta: dict[str, str], records: dict[str, ProfileRecord]):
        self.path = Path(path)
        self.meta = dict(meta)
        self._records = records
        self._dirty = False
        self.version = 0          # bumped on every change (caches built over the records watch it)

    # ---- construction -------------------------------------------------------------------------------------------

    @classmethod
    def create(cls, path: str | os.PathLike, *, gpu: str, driver: str = "", torch_version: str = "",
               command: str = "") -> "ProfileDB":
        """A new, empty database for GPU preset `gpu`, written to `path` by `save()`."""
        if not gpu:
            raise ProfileDBError("a profile database needs the GPU it was measured on (gpu=...)")
        meta = {"gpu": str(gpu), "driver": str(driver), "torch_version": str(torch_version),
                "created": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), "command": str(command)}
        db = cls(path, meta, {})
        db._dirty = True
        return db

    @classmethod
    def open(cls, path: str | os.PathLike) -> "ProfileDB":
        import h5py
        import numpy as np

        p = Path(path)
        if not p.exists():
            raise ProfileDBError(f"{p}: no such profile database")
        try:
            f = h5py.File(p, "r")
        except OSError as e:
            raise ProfileDBError(f"{p}: not an HDF5 file, or corrupt/truncated ({e})") from None
        with f:
            fmt = _attr(f, "format")
            if fmt != FORMAT:
                raise ProfileDBError(f"{p}: not a Phantora profile database (format attribute {fmt!r}, "
                                     f"expected {FORMAT!r})")
            try:
                version = int(f.attrs.get("version", -1))
            except (TypeError, ValueError):
                version = -1
            if version < 1 or version > VERSION:
                raise ProfileDBError(f"{p}: profile database version {version} is not supported "
                                     f"(this Phantora reads versions 1..{VERSION})")
            meta = {k: _attr(f, k) for k in _META_KEYS}
            if not meta["gpu"]:
                raise ProfileDBError(f"{p}: profile database lacks the 'gpu' attribute")
            if "records" not in f:
                raise ProfileDBError(f"{p}: profile database has no 'records' table")
            ds = f["records"]
            names = ds.dtype.names or ()
            need = ("key", "median_us", "p10_us", "p90_us", "count")
            if any(n not in names for n in need):
                raise ProfileDBError(f"{p}: 'records' must have columns {', '.join(need)}; it has "
                                     f"{', '.join(names) or 'none'}")
            try:
                rows = ds[()]
            except OSError as e:
                raise ProfileDBError(f"{p}: 'records' cannot be read (corrupt?): {e}") from None
        records: dict[str, ProfileRecord] = {}
        for i, row in enumerate(np.atleast_1d(rows)):
            key = row["key"]
            key = key.decode("utf-8") if isinstance(key, bytes) else str(key)
            med, p10, p90, n = float(row["median_us"]), float(row["p10_us"]), float(row["p90_us"]), int(row["count"])
            if not all(math.isfinite(v) and v >= 0 for v in (med, p10, p90)) or n < 1:
                raise ProfileDBError(f"{p}: record {i} ({key[:60]}) has invalid timings")
            try:
                Signature.from_key(key)
            except PhantoraError as e:
                raise ProfileDBError(f"{p}: record {i}: {e}") from None
            records[key] = ProfileRecord(med, p10, p90, n)
        return cls(p, meta, records)

    # ---- access -------------------------------------------------------------------------------------------------

    @property
    def gpu(self) -> str:
        return self.meta["gpu"]

    def __len__(self) -> int:
        return len(self._records)

    def __contains__(self, sig: Signature | str) -> bool:
        return (sig if isinstance(sig, str) else sig.key()) in self._records

    def lookup(self, sig: Signature | str) -> ProfileRecord | None:
        return self._records.get(sig if isinstance(sig, str) else sig.key())

    def items(self) -> Iterator[tuple[str, ProfileRecord]]:
        return iter(list(self._records.items()))

    def add(self, sig: Signature | str, samples_us: Iterable[float]) -> ProfileRecord:
        """Record the measured durations (microseconds) of one signature; replaces an earlier record."""
        rec = summarize(samples_us)
        self._records[sig if isinstance(sig, str) else sig.key()] = rec
        self._dirty = True
        self.version += 1
        return rec

    # ---- writing ------------------------------------------------------------------------------------------------

    def save(self, path: str | os.PathLike | None = None) -> Path:
        """Write the database (atomically) to `path` or to where it was opened/created."""
        import h5py
        import numpy as np

        target = Path(path) if path is not None else self.path
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".tmp")
        dt = np.dtype([("key", h5py.string_dtype("utf-8")), ("median_us", "f8"), ("p10_us", "f8"),
                       ("p90_us", "f8"), ("count", "i8")])
        keys = sorted(self._records)
        arr = np.empty(len(keys), dtype=dt)
        for i, k in enumerate(keys):
            r = self._records[k]
            arr[i] = (k, r.median_us, r.p10_us, r.p90_us, r.count)
        with h5py.File(tmp, "w") as f:
            f.attrs["format"] = FORMAT
            f.attrs["version"] = VERSION
            for k in _META_KEYS:
                f.attrs[k] = str(self.meta.get(k, ""))     # plain str: numpy would store a str subclass as <U
            f.create_dataset("records", data=arr)
        os.replace(tmp, target)
        self.path = target
        self._dirty = False
        return target


def _attr(f, name: str) -> str:
    v = f.attrs.get(name, "")
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    return str(v)
