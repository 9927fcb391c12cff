"""Reading a Phantora trace back: metadata, tables, and per-rank op streams as `Op` objects for replay.

Every problem with the file (missing, not HDF5, not a Phantora trace, a newer format version, truncated or
unreadable data) raises `TraceError` with a message naming the file. A trace whose run never closed it (killed or
crashed) opens normally with `complete == False` and a `warning` text; it holds everything up to its last flush.
"""

from __future__ import annotations

import json
import os
import re
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import cached_property
from typing import Any

import h5py
import numpy as np

from phantora.engine.ops import GENERATED_PREFIXES, CostSource, Op, OpKind, generated_kernel_arg
from phantora.errors import TraceError
from phantora.gcpause import gc_paused
from phantora.trace import chunks
from phantora.trace import schema as S

_BLOCK_ROWS = 1 << 16
"""Rows read per block by `iter_ops`."""

_KIND_BY_VALUE: list[OpKind | None] = [None] * 256
for _k in OpKind:
    _KIND_BY_VALUE[int(_k)] = _k
_SOURCE_BY_VALUE: list[CostSource | None] = [None] * 256
for _s in CostSource:
    _SOURCE_BY_VALUE[int(_s)] = _s
_KNOWN_KIND = np.array([k is not None for k in _KIND_BY_VALUE])

# Op attributes set from row columns (in the order of _RowOp's parameters after kind, source and name, which are
# mapped separately).
_DIRECT = (("stream", "stream"), ("sig", "sig"), ("duration", "duration"), ("flops", "flops"),
           ("nbytes", "nbytes"), ("group", "group"), ("arg", "arg"), ("cpu_delta", "cpu_delta"),
           ("mem", "mem_delta"), ("host_py", "host_py"), ("host_c", "host_c"), ("host_disp", "host_disp"),
           ("host_line", "host_line"))
_ARG_COLUMN = [name for name, _ in _DIRECT].index("arg")


class _RowOp(Op):
    """An `Op` built from a trace row (positional construction; otherwise an Op in every respect)."""

    __slots__ = ()

    def __init__(self, kind, source, name, stream, sig, duration, flops, nbytes, group, arg, cpu_delta, mem, host_py,
                 host_c, host_disp, host_line):
        self.kind = kind
        self.source = source
        self.name = name
        self.stream = stream
        self.sig = sig
        self.duration = duration
        self.flops = flops
        self.nbytes = nbytes
        self.group = group
        self.arg = arg
        self.cpu_delta = cpu_delta
        self.mem = mem
        self.host_py = host_py
        self.host_c = host_c
        self.host_disp = host_disp
        self.host_line = host_line


class TraceReader:
    """An open trace file. Use as a context manager or call `close()`."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        self._executor: ThreadPoolExecutor | None = None
        self._f = _open(self.path)
        try:
            self._check_format()
            self.meta: dict[str, Any] = self._read_meta()
            self._check_layout()
        except BaseException:
            self._f.close()
            raise

    # -- file-level facts --------------------------------------------------------------------------------------

    @property
    def version(self) -> int:
        """Format version the file was written with."""
        return self._version

    @property
    def complete(self) -> bool:
        """True when the writer closed the file (the run ended, successfully or with a recorded error)."""
        return bool(self._attr("complete", False))

    @property
    def error(self) -> str | None:
        """The error the run ended with, if the writer recorded one."""
        e = self._attr("error")
        return None if e is None else _text(e)

    @property
    def flushes(self) -> int:
        """Number of flushes the writer completed."""
        return int(self._attr("flushes", 0))

    @property
    def warning(self) -> str | None:
        """Why the trace may hold less than the run did (None for a complete trace)."""
        if self.complete:
            return None
        n_ops = sum(self.n_ops(r) for r in self.ranks)
        return (f"{self.path}: incomplete trace: the run that wrote it did not close it (killed or crashed). "
                f"It holds what was written up to its last flush ({self.flushes} flushes, {n_ops} ops over "
                f"{len(self.ranks)} ranks); anything after that is missing.")

    @cached_property
    def ranks(self) -> list[int]:
        """Simulated ranks: those named in the metadata and those with tables in the file, sorted."""
        ranks = {int(r) for r in self.meta.get("ranks") or ()}
        with self._guard("the rank tables"):
            for key in self._f[S.RANKS]:
                try:
                    ranks.add(int(key))
                except ValueError:
                    raise TraceError(f"{self.path}: unexpected entry '{S.RANKS}/{key}' (not a rank number)") from None
        return sorted(ranks)

    # -- tables ------------------------------------------------------------------------------------------------

    @cached_property
    def names(self) -> list[str]:
        """The string table: op names, group names, algorithms, protocols; index 0 is ""."""
        return self._strings(S.STRINGS)

    @cached_property
    def signatures(self) -> list[str]:
        """Signature keys (Signature.key()), indexed by signature id."""
        return self._strings(S.SIGNATURES)

    @cached_property
    def groups(self) -> dict[int, tuple[str, list[int]]]:
        """Process groups: id -> (name, member global ranks in group-rank order)."""
        with self._guard("the groups table"):
            rows = self._f[S.GROUPS][()]
        names = self.names
        return {int(r["id"]): (self._name(names, int(r["name"])), [int(x) for x in r["ranks"]]) for r in rows}

    @cached_property
    def collectives(self) -> np.ndarray:
        """Collective rows (schema.COLL_DTYPE); op rows refer to them by row index."""
        return self._table(S.COLLECTIVES, S.COLL_DTYPE)

    @cached_property
    def dependencies(self) -> np.ndarray:
        """EVENT_RECORD -> STREAM_WAIT rows (schema.DEP_DTYPE)."""
        return self._table(S.DEPENDENCIES, S.DEP_DTYPE)

    def n_ops(self, rank: int) -> int:
        """Number of op rows of `rank`."""
        ds = self._rank_dataset(rank, S.OPS)
        return 0 if ds is None else len(ds)

    def ops(self, rank: int) -> np.ndarray:
        """All op rows of `rank` (schema.OP_DTYPE) in program order."""
        ds = self._rank_dataset(rank, S.OPS)
        if ds is None:
            return np.empty(0, S.OP_DTYPE)
        rows = self._read_rows(ds, 0, len(ds), S.OP_DTYPE, f"the ops of rank {rank}", self._pool())
        self._check_rows(rows, rank, 0)
        return rows

    def iterations(self, rank: int, ops: np.ndarray | None = None) -> np.ndarray:
        """Iteration-mark times of `rank` (s): the writer's marks, else the end times of its ITER_MARK ops
        (taken from `ops` when the caller already read them)."""
        ds = self._rank_dataset(rank, S.ITERATIONS)
        if ds is not None and len(ds):
            return self._read(ds, slice(None), S.ITER_DTYPE, f"the iterations of rank {rank}")
        if ops is None:
            ops = self.ops(rank)
        return ops["end"][ops["kind"] == int(OpKind.ITER_MARK)].astype(S.ITER_DTYPE)

    def iter_ops(self, rank: int) -> Iterator[Op]:
        """`rank`'s ops as engine `Op` objects in program order, read block by block."""
        ds = self._rank_dataset(rank, S.OPS)     # checked now, not at the first next()
        return iter(()) if ds is None else self._iter_ops(ds, rank)

    def op_objects(self, rows: np.ndarray, rank: int) -> list[Op]:
        """Engine `Op` objects of op rows of `rank` (from `ops(rank)`; row i of the array is op i of the list)."""
        out: list[Op] = []
        for lo in range(0, len(rows), _BLOCK_ROWS):
            out += self._build_ops(rows[lo:lo + _BLOCK_ROWS], self.names, rank, lo)
        return out

    def _iter_ops(self, ds: h5py.Dataset, rank: int) -> Iterator[Op]:
        names = self.names
        what = f"the ops of rank {rank}"
        n = len(ds)
        with ThreadPoolExecutor(1, thread_name_prefix="phantora-trace-read") as prefetch:
            # The next block is read and inflated in another thread while this one's objects are built.
            nxt = prefetch.submit(self._read_rows, ds, 0, min(n, _BLOCK_ROWS), S.OP_DTYPE, what, None)
            for lo in range(0, n, _BLOCK_ROWS):
                rows = nxt.result()
                hi = min(n, lo + _BLOCK_ROWS)
                if hi < n:
                    nxt = prefetch.submit(self._read_rows, ds, hi, min(n, hi + _BLOCK_ROWS), S.OP_DTYPE, what,
                                          None)
                self._check_rows(rows, rank, lo)
                ops = self._build_ops(rows, names, rank, lo)
                yield from ops

    @cached_property
    def _unmarked_generated(self) -> np.ndarray | None:
        """In a trace written before KERNEL ops' `arg` marked Inductor's generated kernels: the name ids of those
        kernels (their launches are charged `[host] generated_launch_us`; the calls of compiled regions, which
        such a trace does not record, nothing). None for a newer trace, or one with no generated kernel."""
        if self.meta.get("generated_marked"):
            return None
        ids = [i for i, n in enumerate(self.names) if n.startswith(GENERATED_PREFIXES)]
        return np.asarray(ids, dtype=np.int64) if ids else None

    def _build_ops(self, rows: np.ndarray, names: list[str], rank: int, offset: int) -> list[Op]:
        kinds = self._lookup(rows["kind"], _KIND_BY_VALUE, "op kind", rank, offset)
        sources = self._lookup(rows["source"], _SOURCE_BY_VALUE, "cost source", rank, offset)
        name_ids = rows["name"]
        if len(name_ids) and int(name_ids.max()) >= len(names):
            raise TraceError(f"{self.path}: rank {rank}: an op names string {int(name_ids.max())}, "
                             f"but the string table has {len(names)} entries")
        columns = [rows[col].tolist() for _, col in _DIRECT]
        generated = self._unmarked_generated
        if generated is not None:        # an older trace: its generated kernels are found by name
            arg = rows["arg"]
            old = (rows["kind"] == int(OpKind.KERNEL)) & (arg < 0) & np.isin(name_ids, generated)
            if old.any():
                arg = arg.copy()
                arg[old] = generated_kernel_arg(0)
                columns[_ARG_COLUMN] = arg.tolist()
        op_names = list(map(names.__getitem__, name_ids.tolist()))
        with gc_paused():
            # one positional constructor call per row touches each object once: faster than keyword calls of
            # Op(...) and than setting the objects' attributes column by column
            return list(map(_RowOp, kinds, sources, op_names, *columns))

    def close(self) -> None:
        self._f.close()
        if self._executor is not None:
            self._executor.shutdown()
            self._executor = None

    def __enter__(self) -> "TraceReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "complete" if self.complete else "incomplete"
        return f"TraceReader({self.path!r}, version={self.version}, {state}, ranks={self.ranks})"

    # -- checks and helpers ------------------------------------------------------------------------------------

    def _attr(self, name: str, default: Any = None) -> Any:
        """A file attribute; an unreadable one (damaged file header) is a TraceError naming the file."""
        with self._guard(f"the file attribute '{name}' (damaged file header?)"):
            return self._f.attrs.get(name, default)

    def _check_format(self) -> None:
        fmt = self._attr("format")
        if fmt is None:
            raise TraceError(f"{self.path}: an HDF5 file but not a Phantora trace (no 'format' attribute)")
        if _text(fmt) != S.FORMAT_NAME:
            raise TraceError(f"{self.path}: not a Phantora trace (format attribute is {_text(fmt)!r}, "
                             f"expected {S.FORMAT_NAME!r})")
        version = self._attr("version")
        try:
            self._version = int(version)
        except (TypeError, ValueError):
            raise TraceError(f"{self.path}: Phantora trace without a valid 'version' attribute "
                             f"(got {version!r})") from None
        if self._version > S.FORMAT_VERSION:
            raise TraceError(f"{self.path}: trace format version {self._version} is newer than this Phantora "
                             f"reads (up to {S.FORMAT_VERSION}); upgrade Phantora to read it")
        if self._version < 1:
            raise TraceError(f"{self.path}: invalid trace format version {self._version}")

    def _read_meta(self) -> dict[str, Any]:
        with self._guard("the metadata"):
            if S.META not in self._f:
                raise TraceError(f"{self.path}: Phantora trace without its '{S.META}' dataset")
            text = _text(self._f[S.META][()])
        try:
            meta = json.loads(text)
        except ValueError as e:
            raise TraceError(f"{self.path}: the '{S.META}' dataset is not valid JSON ({e})") from None
        if not isinstance(meta, dict):
            raise TraceError(f"{self.path}: the '{S.META}' dataset is not a JSON object")
        return meta

    def _check_layout(self) -> None:
        with self._guard("the file layout"):
            for path in (S.STRINGS, S.SIGNATURES, S.GROUPS, S.COLLECTIVES, S.DEPENDENCIES, S.RANKS):
                if path not in self._f:
                    raise TraceError(f"{self.path}: Phantora trace without its '{path}' "
                                     f"{'group' if path == S.RANKS else 'dataset'}")

    def _rank_dataset(self, rank: int, name: str) -> h5py.Dataset | None:
        rank = int(rank)
        with self._guard(f"the tables of rank {rank}"):
            group = self._f[S.RANKS].get(str(rank))
            if group is None:
                if rank in self.ranks:
                    return None
                raise TraceError(f"{self.path}: no rank {rank} in this trace (ranks: {_ranges(self.ranks)})")
            return group.get(name)

    def _read_rows(self, ds: h5py.Dataset, lo: int, hi: int, dtype: np.dtype, what: str,
                   pool: ThreadPoolExecutor | None) -> np.ndarray:
        """Rows lo..hi of a table; chunks are inflated here (in `pool` when given) when chunks.decodable."""
        with self._guard(what):
            fast = chunks.decodable(ds, dtype)
        if not fast or hi <= lo:
            return self._read(ds, slice(lo, hi), dtype, what)
        c = ds.chunks[0]
        filtered = len(chunks.pipeline(ds)) > 0
        first = lo // c * c
        offsets = range(first, hi, c)
        out = np.empty(hi - lo, dtype)
        out_bytes = out.view(np.uint8)   # copying bytes: numpy copies packed records field by field otherwise
        size = dtype.itemsize
        with self._guard(what):
            stored = [ds.id.read_direct_chunk((off,)) for off in offsets]
            decode = lambda item: chunks.decode(item[1], item[0], dtype, c, filtered)   # noqa: E731
            blocks = pool.map(decode, stored) if pool is not None and len(stored) > 1 else map(decode, stored)
            for off, block in zip(offsets, blocks):
                a, b = max(off, lo), min(off + c, hi)
                out_bytes[(a - lo) * size:(b - lo) * size] = block.view(np.uint8)[(a - off) * size:(b - off) * size]
        return out

    def _pool(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(min(4, os.cpu_count() or 1), thread_name_prefix="phantora-trace-read")
        return self._executor

    def _read(self, ds: h5py.Dataset, sel: slice, dtype: np.dtype, what: str) -> np.ndarray:
        with self._guard(what):
            data = ds[sel]
        if data.dtype == dtype:
            return data
        return self._convert(data, dtype, what)

    def _convert(self, data: np.ndarray, dtype: np.dtype, what: str) -> np.ndarray:
        """Rows of another layout (a later compatible version) reduced to the known columns."""
        if dtype.names is None:
            try:
                return data.astype(dtype)
            except (TypeError, ValueError):
                raise TraceError(f"{self.path}: {what} have type {data.dtype}, expected {dtype}") from None
        missing = [n for n in dtype.names if data.dtype.names is None or n not in data.dtype.names]
        optional = S.OPTIONAL_OP_COLUMNS if dtype is S.OP_DTYPE else ()
        if missing and all(n in optional for n in missing):     # an older version: those columns read as 0
            out = np.zeros(len(data), dtype)
            for n in dtype.names:
                if n not in missing:
                    out[n] = data[n]
            return out
        if missing:
            raise TraceError(f"{self.path}: {what} lack the column(s) {', '.join(missing)}")
        out = np.empty(len(data), dtype)
        for n in dtype.names:
            out[n] = data[n]
        return out

    def _table(self, path: str, dtype: np.dtype) -> np.ndarray:
        with self._guard(f"the '{path}' table"):
            ds = self._f[path]
        return self._read(ds, slice(None), dtype, f"the '{path}' table")

    def _strings(self, path: str) -> list[str]:
        with self._guard(f"the '{path}' table"):
            return [_text(x) for x in self._f[path][()].tolist()]

    def _name(self, names: list[str], i: int) -> str:
        if not 0 <= i < len(names):
            raise TraceError(f"{self.path}: string index {i} out of range (string table has {len(names)})")
        return names[i]

    def _check_rows(self, rows: np.ndarray, rank: int, offset: int) -> None:
        """Refuse op rows no Phantora writes: an op kind outside the schema's, a duration that is not a finite
        number of seconds >= 0."""
        bad = np.flatnonzero(~_KNOWN_KIND[rows["kind"]])
        if len(bad):
            i = int(bad[0])
            raise TraceError(f"{self.path}: rank {rank}, op {offset + i}: unknown op kind {int(rows['kind'][i])} "
                             f"(known: 0-{max(map(int, OpKind))}; written by a newer Phantora, or damaged)")
        duration = rows["duration"]
        bad = np.flatnonzero(~(np.isfinite(duration) & (duration >= 0)))
        if len(bad):
            i = int(bad[0])
            raise TraceError(f"{self.path}: rank {rank}, op {offset + i}: duration {float(duration[i])!r} is not "
                             f"a number of seconds >= 0 (a damaged trace)")

    def _lookup(self, values: np.ndarray, table: list, what: str, rank: int, offset: int) -> list:
        out = list(map(table.__getitem__, values.tolist()))
        if None in out:
            i = out.index(None)
            raise TraceError(f"{self.path}: rank {rank}, op {offset + i}: unknown {what} {int(values[i])} "
                             f"(written by a newer Phantora?)")
        return out

    @contextmanager
    def _guard(self, what: str):
        try:
            yield
        except TraceError:
            raise
        except (OSError, KeyError, ValueError, TypeError, RuntimeError, zlib.error) as e:
            raise TraceError(f"{self.path}: cannot read {what}: {e}") from None


def _open(path: str) -> h5py.File:
    if not os.path.exists(path):
        partial = partial_traces(path)
        if partial:
            raise TraceError(f"{path}: no such trace file; the unfinished trace {partial[-1]} is there (its run is "
                             f"still going, or was killed before it closed the trace; it reads back up to its "
                             f"last flush)")
        raise TraceError(f"{path}: no such trace file")
    if os.path.isdir(path):
        raise TraceError(f"{path}: is a directory, not a trace file")
    size = os.path.getsize(path)
    if size == 0:
        raise TraceError(f"{path}: empty file, not a trace")
    try:
        is_hdf5 = h5py.is_hdf5(path)
    except OSError as e:
        raise TraceError(f"{path}: cannot read the file: {e}") from None
    if not is_hdf5:
        raise TraceError(f"{path}: not an HDF5 file, so not a Phantora trace (no HDF5 signature; "
                         f"{size} bytes)")
    try:
        try:
            # No file lock: the trace of a running job can be inspected between two of its flushes.
            return h5py.File(path, "r", locking=False)
        except OSError as e:
            if "locking flag" not in str(e):
                raise
            # This process has the file open for writing, with locking: open it the same way.
            return h5py.File(path, "r", locking="best-effort")
    except OSError as e:
        msg = str(e)
        if "truncated" in msg:
            raise TraceError(f"{path}: truncated file: it is shorter ({size} bytes) than its HDF5 metadata "
                             f"says; it was cut short (copy interrupted, disk full?) [{msg}]") from None
        if "already open for write" in msg:
            raise TraceError(f"{path}: marked as open for writing by another program; if none is, clear the flag "
                             f"with `h5clear -s {path}` [{msg}]") from None
        raise TraceError(f"{path}: cannot open as HDF5 (corrupt file?): {msg}") from None


def partial_traces(path: str) -> list[str]:
    """Unfinished files a TraceWriter left for `path` (`<name>.<random>.partial`), oldest first."""
    folder, name = os.path.split(os.path.abspath(path))
    try:
        entries = os.listdir(folder)
    except OSError:
        return []
    pattern = re.compile(re.escape(name) + r"\.[0-9a-f]{8}\.partial")      # writer.temp_sibling's names
    found = [os.path.join(folder, e) for e in entries if pattern.fullmatch(e)]
    try:
        return sorted(found, key=os.path.getmtime)
    except OSError:
        return sorted(found)


def _text(x: Any) -> str:
    if isinstance(x, bytes):
        return x.decode("utf-8", errors="replace")
    if isinstance(x, np.ndarray) and x.shape == ():
        return _text(x[()])
    return str(x)


def _ranges(ranks: list[int]) -> str:
    """Compact text of a sorted rank list: "0-3, 8, 10-11"."""
    if not ranks:
        return "none"
    parts, lo, prev = [], ranks[0], ranks[0]
    for r in ranks[1:] + [None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        parts.append(str(lo) if lo == prev else f"{lo}-{prev}")
        if r is not None:
            lo = prev = r
    return ", ".join(parts)
