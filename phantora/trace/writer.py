"""Incremental writer of a Phantora trace (one HDF5 file, layout in docs/trace-format.md).

Rows handed to the writer stay in memory until `flush()`, which writes every pending row and table, then flushes
HDF5. Between flushes the writer makes no HDF5 call at all, so a run killed at any moment outside a flush leaves a
file that reads back everything up to the last flush.

Fixed-size tables are written chunk by chunk with `write_direct_chunk` (see chunks.py): chunks are shuffled and
deflated here, exactly as HDF5's standard `shuffle` + `gzip` filters would, by worker threads (zlib releases the
GIL), each full chunk as soon as it fills. A flush also writes the partially filled last chunk of each table,
zero-padded; the next flush that adds rows to that chunk rewrites it.

The file is written under a temporary name in the destination folder (`<name>.<random>.partial`) and renamed to
its own name by `close()`, so an existing trace is never truncated: the writer refuses a destination that exists
unless `overwrite=True`, and without it the rename never replaces a file that appeared meanwhile (the trace then
stays at its temporary name, which the error names). A run killed before `close()` leaves the `.partial` file,
readable up to its last flush; `TraceReader` names such files when asked for the missing trace.
"""

from __future__ import annotations

import json
import os
import platform
import secrets
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime, timezone
from functools import partial
from typing import Any

import h5py
import numpy as np

import phantora
from phantora.engine.ops import Op
from phantora.errors import TraceError
from phantora.trace import chunks
from phantora.trace import schema as S

DEFAULT_CHUNK_ROWS = 4096
"""Rows per chunk of the op tables (432 KiB of OP_DTYPE rows); see docs/trace-format.md for the measurements."""

DEFAULT_MAX_PENDING_ROWS = 1 << 20
"""Pending op rows (all ranks) that trigger a flush on their own, bounding the writer's memory."""

_LIBVER = ("earliest", "v108")
"""HDF5 format bounds: superblock 0 keeps no "open for writing" flag, so a killed run's file opens without h5clear."""

_Encoder = Callable[[np.ndarray, "int | None"], "Future[bytes] | bytes"]


class _ChunkedTable:
    """A resizable 1-D dataset of fixed-size rows, written in whole, compressed chunks.

    Rows are kept in chunk order from `start` (chunk-aligned): `ready` holds the encoded full chunks not yet
    written (futures while a worker thread compresses them: a chunk is handed to the pool as soon as it fills, so
    compression overlaps the caller's work), then `tail` and `partial` the rows of the chunk being filled. A flush
    also encodes that partial chunk, zero-padded, and writes it; its rows stay in `tail` and are encoded again with
    the rows that follow. The dataset is created at the first flush.
    """

    def __init__(self, path: str, dtype: np.dtype, chunk_rows: int, level: int | None):
        self.path = path
        self.dtype = np.dtype(dtype)
        self.chunk_rows = chunk_rows
        self.level = level
        self.created = False
        self.start = 0                                  # first row of ready[0] (or of tail)
        self.ready: list[Future[bytes] | bytes] = []
        self.tail = np.empty(0, self.dtype)
        self.partial: list[np.ndarray] = []
        self.n_partial = 0
        self.tail_on_disk = 0                           # rows of `tail` the file already holds
        self.tail_blob: Future[bytes] | bytes | None = None

    @property
    def n_rows(self) -> int:
        """Rows appended so far, flushed or not."""
        return self.start + len(self.ready) * self.chunk_rows + len(self.tail) + self.n_partial

    def append(self, rows: np.ndarray, encode: _Encoder | None) -> None:
        """Add the caller's rows (copied before this returns); with `encode`, chunks that fill up are handed to it
        at once."""
        if not len(rows):
            return
        self.partial.append(rows)
        self.n_partial += len(rows)
        if encode is not None and len(self.tail) + self.n_partial >= self.chunk_rows:
            self._cut(encode)            # copies every row it keeps
        else:
            self.partial[-1] = rows.copy()

    def _cut(self, encode: _Encoder) -> None:
        """Move every full chunk of tail + partial to `ready`, encoded by `encode`."""
        data = np.concatenate([self.tail, *self.partial])
        self.partial, self.n_partial = [], 0
        c = self.chunk_rows
        n_full = len(data) // c
        self.ready.extend(encode(data[i * c:(i + 1) * c], self.level) for i in range(n_full))
        self.tail = data[n_full * c:].copy()
        if n_full:
            self.tail_on_disk = 0

    def prepare(self, encode: _Encoder) -> bool:
        """First half of a flush: encode what the file lacks. False when there is nothing to write."""
        if self.partial:
            self._cut(encode)
        if len(self.tail) > self.tail_on_disk:
            padded = np.zeros(self.chunk_rows, self.dtype)
            padded[:len(self.tail)] = self.tail
            self.tail_blob = encode(padded, self.level)
        return bool(self.ready) or self.tail_blob is not None or not self.created

    def write(self, f: h5py.File) -> None:
        """Second half of a flush: write the encoded chunks."""
        ds = self.open(f)
        ds.resize((self.n_rows,))
        c = self.chunk_rows
        write = ds.id.write_direct_chunk
        for i, blob in enumerate(self.ready):
            write((self.start + i * c,), _result(blob), 0)
        self.start += len(self.ready) * c
        self.ready = []
        if self.tail_blob is not None:
            write((self.start,), _result(self.tail_blob), 0)
            self.tail_blob = None
            self.tail_on_disk = len(self.tail)

    def open(self, f: h5py.File) -> h5py.Dataset:
        """The dataset, created on first use. Callers drop the handle when done (HDF5 keeps chunk-lookup state per
        open dataset, which a reader in this process should not share)."""
        if self.created:
            return f[self.path]
        filters = {} if self.level is None else {"shuffle": True, "compression": "gzip",
                                                  "compression_opts": self.level}
        ds = f.create_dataset(self.path, shape=(0,), maxshape=(None,), dtype=self.dtype,
                              chunks=(self.chunk_rows,), **filters)
        self.created = True
        return ds


def _result(blob: Future[bytes] | bytes) -> bytes:
    return blob if isinstance(blob, bytes) else blob.result()


class _StringTable:
    """An append-only table of UTF-8 strings with an index for interning."""

    def __init__(self, path: str):
        self.path = path
        self.index: dict[str, int] = {}
        self.items: list[str] = []
        self.n_disk = 0

    def add(self, s: str) -> int:
        i = self.index.get(s)
        if i is None:
            if not isinstance(s, str):
                raise TypeError(f"trace strings must be str, got {type(s).__name__}")
            i = self.index[s] = len(self.items)
            self.items.append(s)
        return i

    def flush(self, f: h5py.File) -> None:
        if self.path not in f:
            f.create_dataset(self.path, shape=(0,), maxshape=(None,), dtype=h5py.string_dtype("utf-8"),
                             chunks=(1024,))
        n = len(self.items)
        if n > self.n_disk:
            ds = f[self.path]
            ds.resize((n,))
            ds[self.n_disk:n] = np.array(self.items[self.n_disk:n], dtype=object)
            self.n_disk = n


def default_meta(meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """`meta` with `created`, `mode` and `versions` filled in where missing (see schema.META_KEYS)."""
    out = dict(meta or {})
    out.setdefault("created", datetime.now(timezone.utc).isoformat(timespec="seconds"))
    out.setdefault("mode", "live")
    out["generated_marked"] = True       # KERNEL ops' arg marks Inductor's generated kernels (engine/ops.py)
    if out["mode"] not in ("live", "replay"):
        raise ValueError(f"trace meta 'mode' must be 'live' or 'replay', got {out['mode']!r}")
    versions = {"phantora": phantora.__version__, "python": platform.python_version(),
                "numpy": np.__version__, "h5py": h5py.__version__}
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "__version__"):
        versions["torch"] = str(torch.__version__)
    versions.update(out.get("versions") or {})
    out["versions"] = versions
    return out


class TraceWriter:
    """Writes one trace file incrementally; see the module docstring for what a flush guarantees.

    `meta` is the run's metadata (keys in schema.META_KEYS); `compression` is "gzip" (deflate `level`, with
    shuffle) or None. Use as a context manager, or call `close()`: only a closed trace is marked complete.
    """

    def __init__(self, path: str | os.PathLike, meta: dict[str, Any] | None = None, *,
                 compression: str | None = "gzip", level: int = 1, chunk_rows: int = DEFAULT_CHUNK_ROWS,
                 max_pending_rows: int = DEFAULT_MAX_PENDING_ROWS, threads: int | None = None,
                 overwrite: bool = False):
        if compression not in ("gzip", None):
            raise ValueError(f"compression must be 'gzip' or None, got {compression!r}")
        if chunk_rows < 1:
            raise ValueError(f"chunk_rows must be positive, got {chunk_rows}")
        self.path = os.fspath(path)
        self.meta = default_meta(meta)
        self._meta_text = _meta_json(self.meta)
        self._level = level if compression == "gzip" else None
        self._chunk_rows = chunk_rows
        self._max_pending = max_pending_rows
        self._threads = threads if threads is not None else min(4, os.cpu_count() or 1)
        self._pool: ThreadPoolExecutor | None = None
        self._closed = False
        self._temp_kept = True
        self._meta_dirty = True
        self._flushes = 0

        self._strings = _StringTable(S.STRINGS)
        self._strings.add("")
        self._signatures = _StringTable(S.SIGNATURES)
        self._groups: dict[int, tuple[str, tuple[int, ...]]] = {}
        self._groups_pending: list[int] = []
        self._collectives = _ChunkedTable(S.COLLECTIVES, S.COLL_DTYPE, 1024, self._level)
        self._dependencies = _ChunkedTable(S.DEPENDENCIES, S.DEP_DTYPE, 4096, self._level)
        self._ops: dict[int, _ChunkedTable] = {}
        self._iterations: dict[int, _ChunkedTable] = {}
        self._pending_ops = 0

        self._overwrite = overwrite
        self.temp_path = _create_temp(self.path, overwrite)
        try:
            self._f = h5py.File(self.temp_path, "w", libver=_LIBVER, locking="best-effort")
        except (OSError, ValueError) as e:
            _unlink_quietly(self.temp_path)
            raise TraceError(f"{self.path}: cannot create the trace file: {e}") from None
        try:
            a = self._f.attrs
            a["format"] = S.FORMAT_NAME
            a["version"] = np.int64(S.FORMAT_VERSION)
            a["complete"] = False
            a["flushes"] = np.int64(0)
            self._f.create_group(S.RANKS)
            for t in (self._collectives, self._dependencies):
                t.open(self._f)
            self._f.create_dataset(S.GROUPS, shape=(0,), maxshape=(None,), dtype=S.GROUP_DTYPE, chunks=(256,))
            self.flush()
        except BaseException:
            self._f.close()
            _unlink_quietly(self.temp_path)
            if self._pool is not None:
                self._pool.shutdown()
            raise

    # -- tables of names ---------------------------------------------------------------------------------------

    def add_string(self, s: str) -> int:
        """Index of `s` in the string table (added if new); the empty string is index 0."""
        return self._strings.add(s)

    @property
    def strings(self) -> list[str]:
        """The string table so far (a copy); row columns such as `name` index it."""
        return list(self._strings.items)

    def add_signature(self, key: str) -> int:
        """Id of the signature whose canonical key (Signature.key()) is `key`; equal keys get one id, from 0."""
        return self._signatures.add(key)

    def add_group(self, gid: int, ranks: Sequence[int], name: str = "") -> None:
        """Record process group `gid` with its member global ranks (in group-rank order) and an optional name."""
        members = tuple(int(r) for r in ranks)
        known = self._groups.get(int(gid))
        if known is not None:
            if known != (name, members):
                raise ValueError(f"trace group {gid} was added before with other members or name "
                                 f"({known[0]!r}, {list(known[1])}), now ({name!r}, {list(members)})")
            return
        self.add_string(name)
        self._groups[int(gid)] = (name, members)
        self._groups_pending.append(int(gid))

    # -- row tables --------------------------------------------------------------------------------------------

    def append_ops(self, rank: int, rows: np.ndarray) -> None:
        """Append op rows (dtype schema.OP_DTYPE, program order) to `rank`'s table; they are copied, so the
        caller may reuse its array."""
        self._check_open()
        rows = _checked(rows, S.OP_DTYPE, "append_ops")
        rank = int(rank)
        table = self._ops.get(rank)
        if table is None:
            table = self._ops[rank] = _ChunkedTable(f"{S.RANKS}/{rank}/{S.OPS}", S.OP_DTYPE, self._chunk_rows,
                                                    self._level)
        table.append(rows, self._background_encoder())
        self._pending_ops += len(rows)
        if self._pending_ops >= self._max_pending:
            self.flush()

    def append_op_objects(self, rank: int, ops: Sequence[Op], issue: Sequence[float], start: Sequence[float],
                          end: Sequence[float], *, mem_delta: Sequence[int] | None = None,
                          coll: Sequence[int] | None = None) -> None:
        """Append `ops` with their simulated times; see `rows_from_ops`."""
        self.append_ops(rank, self.rows_from_ops(ops, issue, start, end, mem_delta=mem_delta, coll=coll))

    def rows_from_ops(self, ops: Sequence[Op], issue: Sequence[float], start: Sequence[float],
                      end: Sequence[float], *, mem_delta: Sequence[int] | None = None,
                      coll: Sequence[int] | None = None) -> np.ndarray:
        """Op rows for `ops` (names interned here). `mem_delta` defaults to each op's `mem`, `coll` to -1."""
        n = len(ops)
        rows = np.empty(n, S.OP_DTYPE)
        add = self._strings.add
        rows["kind"] = [int(o.kind) for o in ops]
        rows["stream"] = [o.stream for o in ops]
        rows["name"] = [add(o.name) for o in ops]
        rows["sig"] = [o.sig for o in ops]
        rows["issue"] = issue
        rows["start"] = start
        rows["end"] = end
        rows["cpu_delta"] = [o.cpu_delta for o in ops]
        rows["host_py"] = [o.host_py for o in ops]
        rows["host_c"] = [o.host_c for o in ops]
        rows["host_disp"] = [o.host_disp for o in ops]
        rows["host_line"] = [o.host_line for o in ops]
        rows["duration"] = [o.duration for o in ops]
        rows["flops"] = [o.flops for o in ops]
        rows["nbytes"] = [o.nbytes for o in ops]
        rows["mem_delta"] = [o.mem for o in ops] if mem_delta is None else mem_delta
        rows["source"] = [int(o.source) for o in ops]
        rows["group"] = [o.group for o in ops]
        rows["arg"] = [o.arg for o in ops]
        rows["coll"] = -1 if coll is None else coll
        return rows

    def append_collectives(self, rows: np.ndarray) -> None:
        """Append collective rows (dtype schema.COLL_DTYPE); op rows refer to them by row index (`coll`)."""
        self._check_open()
        self._collectives.append(_checked(rows, S.COLL_DTYPE, "append_collectives"), self._background_encoder())

    def append_dependencies(self, rows: np.ndarray) -> None:
        """Append EVENT_RECORD -> STREAM_WAIT rows (dtype schema.DEP_DTYPE)."""
        self._check_open()
        self._dependencies.append(_checked(rows, S.DEP_DTYPE, "append_dependencies"), self._background_encoder())

    def mark_iteration(self, rank: int, t: float) -> None:
        """Record that `rank` reached an iteration boundary at virtual time `t` (seconds)."""
        self._check_open()
        rank = int(rank)
        table = self._iterations.get(rank)
        if table is None:
            table = self._iterations[rank] = _ChunkedTable(f"{S.RANKS}/{rank}/{S.ITERATIONS}", S.ITER_DTYPE,
                                                           1024, self._level)
        table.append(np.array([t], S.ITER_DTYPE), None)

    def update_meta(self, items: dict[str, Any]) -> None:
        """Merge `items` into the run metadata; written at the next flush."""
        merged = {**self.meta, **items}
        text = _meta_json(merged)
        self.meta, self._meta_text, self._meta_dirty = merged, text, True

    @property
    def n_collectives(self) -> int:
        """Collective rows appended so far: the `coll` index the next appended collective row will have."""
        return self._collectives.n_rows

    def n_ops(self, rank: int) -> int:
        """Op rows appended so far for `rank`: the op index the next appended row will have."""
        table = self._ops.get(int(rank))
        return 0 if table is None else table.n_rows

    # -- flushing ----------------------------------------------------------------------------------------------

    def flush(self) -> None:
        """Write every pending row and table, then flush HDF5: from here on the file reads back all of it."""
        self._check_open()
        self._write(final=False)

    def close(self, error: str | None = None) -> None:
        """Flush, mark the trace complete (recording `error` if the run failed), close the file and rename it to
        its own name. If the last flush fails, the file still gets its name (it reads back as incomplete, up to
        the previous flush) and the error is raised."""
        if self._closed:
            return
        try:
            self._write(final=True, error=error)
        finally:
            self._closed = True
            try:
                self._f.close()
            finally:
                if self._pool is not None:
                    self._pool.shutdown()
                self._publish()

    def discard(self) -> None:
        """Close without keeping anything: the temporary file is removed and the destination left as it was."""
        if self._closed:
            return
        self._closed = True
        try:
            self._f.close()
        except Exception:  # noqa: BLE001 - the file is removed anyway
            pass
        finally:
            if self._pool is not None:
                self._pool.shutdown()
            _unlink_quietly(self.temp_path)

    @property
    def written_path(self) -> str:
        """Where the file is now: its temporary name while open, its own name once closed (unless the rename
        was refused, see `close`)."""
        return self.temp_path if self._temp_kept else self.path

    def _publish(self) -> None:
        """Rename the temporary file to `path`: replacing an existing file only with `overwrite`."""
        try:
            if self._overwrite:
                os.replace(self.temp_path, self.path)
            else:
                link_no_clobber(self.temp_path, self.path)
        except FileExistsError:
            raise TraceError(f"{self.path}: a file of that name appeared while this trace was written; it was left "
                             f"alone and this trace kept as {self.temp_path} (pass --overwrite to replace "
                             f"existing files)") from None
        except OSError as e:
            raise TraceError(f"{self.path}: could not rename the finished trace to its name ({e}); it is kept as "
                             f"{self.temp_path}") from None
        self._temp_kept = False

    def __enter__(self) -> "TraceWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(error=None if exc is None else f"{exc_type.__name__}: {exc}")

    def _write(self, final: bool, error: str | None = None) -> None:
        f = self._f
        try:
            encode = self._background_encoder() or chunks.encode
            tables = (*self._ops.values(), *self._iterations.values(), self._collectives, self._dependencies)
            # Encode everything first, so that the partial chunks of all tables compress in parallel.
            for table in [t for t in tables if t.prepare(encode)]:
                table.write(f)
            self._pending_ops = 0
            self._flush_groups()
            self._strings.flush(f)
            self._signatures.flush(f)
            if self._meta_dirty:
                if S.META in f:
                    f[S.META][()] = self._meta_text
                else:
                    f.create_dataset(S.META, data=self._meta_text, dtype=h5py.string_dtype("utf-8"))
                self._meta_dirty = False
            self._flushes += 1
            f.attrs["flushes"] = np.int64(self._flushes)
            if final:
                if error is not None:
                    f.attrs["error"] = str(error)
                f.attrs["complete"] = True
            f.flush()
        except OSError as e:
            raise TraceError(f"{self.path}: writing the trace failed: {e}") from None

    def _flush_groups(self) -> None:
        if not self._groups_pending:
            return
        rows = np.empty(len(self._groups_pending), S.GROUP_DTYPE)
        for i, gid in enumerate(self._groups_pending):
            name, members = self._groups[gid]
            rows[i] = (gid, self._strings.add(name), np.asarray(members, S.RANKS_DTYPE))
        ds = self._f[S.GROUPS]
        n = len(ds)
        ds.resize((n + len(rows),))
        ds[n:] = rows
        self._groups_pending = []

    def _background_encoder(self) -> _Encoder | None:
        """Hands a chunk to the compression threads (None when compression is off or there is one thread)."""
        if self._level is None or self._threads <= 1:
            return None
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="phantora-trace")
        return partial(self._pool.submit, chunks.encode)

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"trace {self.path} is closed")


def _checked(rows: np.ndarray, dtype: np.dtype, what: str) -> np.ndarray:
    if not isinstance(rows, np.ndarray) or rows.dtype != dtype or rows.ndim != 1:
        got = f"{type(rows).__name__} {getattr(rows, 'dtype', '')} {getattr(rows, 'shape', '')}".strip()
        raise ValueError(f"{what}: rows must be a 1-D numpy array of the schema dtype, got {got}")
    return rows


PARTIAL_SUFFIX = ".partial"
"""Suffix of the temporary name a trace (or export) is written under: `<name>.<random>.partial`."""


def refuse_existing(path: str, overwrite: bool, what: str = "file") -> None:
    """TraceError when `path` exists and `overwrite` is off (the message names the path and the option)."""
    if os.path.isdir(path):
        raise TraceError(f"{path}: is a directory, not a {what}")
    if not overwrite and os.path.lexists(path):
        raise TraceError(f"{path}: already exists; refusing to replace it (pass --overwrite to replace it, or "
                         f"choose another path)")


def temp_sibling(path: str) -> str:
    """A new, empty file in `path`'s folder named `<name>.<random>.partial` (TraceError if it cannot be made)."""
    folder, name = os.path.split(os.path.abspath(path))
    for _ in range(100):
        tmp = os.path.join(folder, f"{name}.{secrets.token_hex(4)}{PARTIAL_SUFFIX}")
        try:
            # O_EXCL: a name no one else holds; mode 0o666 under the umask, as the file at its own name would get
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue
        except OSError as e:
            raise TraceError(f"{path}: cannot create a file in {folder}: {e.strerror or e}") from None
        os.close(fd)
        return tmp
    raise TraceError(f"{path}: cannot find a free temporary name in {folder}")


def _create_temp(path: str, overwrite: bool) -> str:
    refuse_existing(path, overwrite, "trace file")
    return temp_sibling(path)


def link_no_clobber(src: str, dst: str) -> None:
    """Give `src` the name `dst` unless `dst` exists (FileExistsError), atomically where hard links work."""
    try:
        os.link(src, dst)
    except FileExistsError:
        raise
    except OSError:
        # no hard links on this file system: check, then rename (not atomic against a concurrent writer)
        if os.path.lexists(dst):
            raise FileExistsError(dst) from None
        os.rename(src, dst)
        return
    os.unlink(src)


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _meta_json(meta: dict[str, Any]) -> str:
    try:
        return json.dumps(meta, default=str, ensure_ascii=False)
    except (TypeError, ValueError) as e:
        raise ValueError(f"trace meta is not JSON-serialisable: {e}") from None
