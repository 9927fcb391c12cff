"""Turns the engine's finished ops into trace rows, in program order, and hands them to a TraceWriter.

The engine reports ops when their times become known, which is not program order (work queued behind a collective
finishes later than host-side ops issued after it). The recorder appends each report to a per-rank list (the engine
calls that list's `append` directly, see `emitter`); when rows are wanted (`flush()`, `rows()`) the list is sorted by
op index and only the complete prefix of the rank's ops (every op before it reported) becomes rows, so the trace's
per-rank op tables are in program order and replay can re-issue them. Rows are built in bulk, column by column; a
replay hands the recorder its input rows as a template (`use_template`), so only the simulated columns are built.

Building rows also fills the cross-stream dependencies table: every STREAM_WAIT and SYNC_EVENT is linked to the
EVENT_RECORD it waits for (the latest record of the same event id before it in program order, which is the one the
engine resolves it against). A wait on an event never recorded waits for nothing and has no dependency row.
"""

from __future__ import annotations

from bisect import bisect_left
from operator import attrgetter, itemgetter

import numpy as np

from ..trace import schema as S
from .ops import Op, OpKind

_KIND, _STREAM, _NAME, _SIG, _DURATION, _FLOPS, _NBYTES, _SOURCE, _GROUP, _ARG, _CPU = (
    attrgetter(a) for a in ("kind", "stream", "name", "sig", "duration", "flops", "nbytes", "source", "group",
                            "arg", "cpu_delta"))
_HOST_PY, _HOST_C, _HOST_DISP, _HOST_LINE = (attrgetter(a) for a in ("host_py", "host_c", "host_disp", "host_line"))
_INDEX = itemgetter(0)
_TIMED = np.array([k in (OpKind.KERNEL, OpKind.MEMCPY) for k in range(256)])   # `duration` is the op's own cost
_ALLOC, _FREE, _ITER = int(OpKind.ALLOC), int(OpKind.FREE), int(OpKind.ITER_MARK)
_RECORD, _WAIT, _SYNC_EVENT = int(OpKind.EVENT_RECORD), int(OpKind.STREAM_WAIT), int(OpKind.SYNC_EVENT)
_MEMORY = np.zeros(256, bool)
_MEMORY[[_ALLOC, _FREE]] = True
_EVENTS = np.zeros(256, bool)
_EVENTS[[_RECORD, _WAIT, _SYNC_EVENT]] = True


class Recorder:
    """The engine's sink for traces: `Recorder(writer)`, then `attach(engine)`, then `flush()` as often as wanted.

    `writer` may be None (rows are only built and kept, e.g. for a replay that writes no trace); `keep=True` keeps
    every row built so that `rows(rank)` returns whole tables, not just what the writer has not
    had yet.
    """

    def __init__(self, writer=None, engine=None, ranks=(), *, keep: bool = False):
        self.writer = writer
        self.engine = engine
        self.keep = keep or writer is None
        self._reports: dict[int, list[tuple]] = {}       # per rank: reports not yet turned into rows, any order
        self._base: dict[int, int] = {}                   # per rank: index of its first op without a row
        self._templates: dict[int, np.ndarray] = {}
        self._template_names: np.ndarray | None = None
        self._template_costs = False
        self._pending: dict[int, list[np.ndarray]] = {}   # rows built, not yet handed to the writer
        self._kept: dict[int, list[np.ndarray]] = {}
        self._blocks: dict[int, dict[int, int]] = {}      # per rank: block id -> bytes (for FREE's mem_delta)
        self._events: dict[int, dict[int, int]] = {}      # per rank: event id -> op index of its latest record
        self._deps: list[np.ndarray] = []                 # dependency rows not yet handed to the writer
        self._names: dict[str, int] = {}
        self._name_list: list[str] = []
        self._coll_ids = np.empty(0, np.int64)           # engine collective ids, sorted
        self._coll_order = np.empty(0, np.int64)         # their positions in engine.collectives
        self._colls_seen = 0
        self._colls_written = 0
        self.n_ops = 0                                     # rows handed to the writer
        for r in ranks:
            self._add_rank(r)
        if writer is None:
            self._name("")

    def _add_rank(self, r: int) -> None:
        if r not in self._reports:
            self._reports[r] = []
            self._base[r] = 0
            self._pending[r] = []
            self._kept[r] = []
            self._blocks[r] = {}
            self._events[r] = {}

    def attach(self, engine) -> None:
        self.engine = engine
        for r in engine.ranks:
            self._add_rank(r)

    # ------------------------------------------------------------------------------------------------ input
    def __call__(self, rank: int, idx: int, op: Op, issue: float, start: float, end: float, coll: int) -> None:
        self._reports[rank].append((idx, op, issue, start, end, coll))

    def emitter(self, rank: int):
        """What the engine calls with each (index, op, issue, start, end, coll) report of `rank`: the append of the
        rank's report list, so that reporting an op costs no Python call."""
        self._add_rank(rank)
        return self._reports[rank].append

    def use_template(self, rank: int, rows: np.ndarray, names: list[str], costs_from_ops: bool = False) -> None:
        """Take the columns that do not depend on the simulation from `rows`, the op rows (schema.OP_DTYPE) the
        rank's ops were made from, as a replay does; `names` is the string table their `name` column indexes.
        Only the times, `coll`, `mem_delta` and, for untimed ops, `duration` come from the engine, plus `duration`
        and `source` from the ops themselves when `costs_from_ops` (kernels re-costed)."""
        self._add_rank(rank)
        self._templates[rank] = np.ascontiguousarray(rows)
        self._template_names = np.fromiter((self._name(x) for x in names), np.uint32, len(names))
        self._template_costs = costs_from_ops

    # ------------------------------------------------------------------------------------------------ strings
    def _name(self, s: str) -> int:
        i = self._names.get(s)
        if i is None:
            i = self._names[s] = self.writer.add_string(s) if self.writer is not None else len(self._name_list)
            if self.writer is None:
                self._name_list.append(s)
        return i

    @property
    def names(self) -> list[str]:
        """The string table the rows' `name` column indexes (the writer's when there is one)."""
        if self.writer is not None:
            return self.writer.strings
        return list(self._name_list)

    def _coll_rows(self, cids: np.ndarray) -> np.ndarray:
        """Row indices in the collectives table (the order of engine.collectives) of engine collective ids."""
        colls = self.engine.collectives
        if len(colls) != self._colls_seen:
            ids = np.fromiter((c["id"] for c in colls), np.int64, len(colls))
            order = np.argsort(ids, kind="stable")
            self._coll_ids, self._coll_order = ids[order], order
            self._colls_seen = len(colls)
        if not self._colls_seen:
            return np.full(len(cids), -1, np.int64)
        pos = np.minimum(np.searchsorted(self._coll_ids, cids), self._colls_seen - 1)
        return np.where(self._coll_ids[pos] == cids, self._coll_order[pos], -1)

    # ------------------------------------------------------------------------------------------------ rows
    def _take(self, rank: int) -> None:
        """Turn the complete prefix of `rank`'s reports into rows (appended to its pending rows)."""
        recs = self._reports[rank]
        if not recs:
            return
        recs.sort(key=_INDEX)
        base = self._base[rank]
        # indices are distinct, so recs[i][0] - base - i never decreases: the prefix is where it is 0
        if recs[-1][0] == base + len(recs) - 1:
            n = len(recs)
        else:
            n = bisect_left(range(len(recs)), True, key=lambda i: recs[i][0] != base + i)
        if n == 0:
            return
        block = recs[:n]
        del recs[:n]           # in place: the engine holds this list's append
        self._base[rank] = base + n
        n_deps = len(self._deps)
        tpl = self._templates.get(rank)
        if tpl is not None and len(tpl) >= base + n:
            rows = self._build_from(rank, base, block, tpl[base:base + n])
            if len(tpl) == base + n:
                del self._templates[rank]        # used up
        else:
            rows = self._build(rank, base, block)
        if self.writer is not None:
            self._pending[rank].append(rows)
        else:
            del self._deps[n_deps:]
        if self.keep:
            self._kept[rank].append(rows)

    def _build(self, rank: int, base: int, block: list) -> np.ndarray:
        n = len(block)
        _, ops, issue, start, end, coll = zip(*block)
        rows = np.empty(n, S.OP_DTYPE)
        rows["kind"] = np.fromiter(map(_KIND, ops), np.uint8, n)
        rows["stream"] = np.fromiter(map(_STREAM, ops), np.int16, n)
        names = list(map(_NAME, ops))
        index = self._names
        for new in set(names).difference(index):
            self._name(new)
        rows["name"] = np.fromiter(map(index.__getitem__, names), np.uint32, n)
        rows["sig"] = np.fromiter(map(_SIG, ops), np.int32, n)
        rows["cpu_delta"] = np.fromiter(map(_CPU, ops), np.float64, n)
        rows["host_py"] = np.fromiter(map(_HOST_PY, ops), np.int32, n)
        rows["host_c"] = np.fromiter(map(_HOST_C, ops), np.int32, n)
        rows["host_disp"] = np.fromiter(map(_HOST_DISP, ops), np.int32, n)
        rows["host_line"] = np.fromiter(map(_HOST_LINE, ops), np.int32, n)
        rows["duration"] = np.fromiter(map(_DURATION, ops), np.float64, n)
        rows["flops"] = np.fromiter(map(_FLOPS, ops), np.float64, n)
        rows["nbytes"] = np.fromiter(map(_NBYTES, ops), np.int64, n)
        rows["source"] = np.fromiter(map(_SOURCE, ops), np.uint8, n)
        rows["group"] = np.fromiter(map(_GROUP, ops), np.int32, n)
        rows["arg"] = np.fromiter(map(_ARG, ops), np.int64, n)
        self._simulated(rank, base, rows, issue, start, end, coll)
        return rows

    def _build_from(self, rank: int, base: int, block: list, tpl: np.ndarray) -> np.ndarray:
        n = len(block)
        _, ops, issue, start, end, coll = zip(*block)
        rows = np.empty(n, S.OP_DTYPE)
        rows.view(np.uint8)[:] = tpl.view(np.uint8)      # bytes: numpy copies packed records field by field
        rows["name"] = self._template_names[tpl["name"]]
        if self._template_costs:
            rows["duration"] = np.fromiter(map(_DURATION, ops), np.float64, n)
            rows["source"] = np.fromiter(map(_SOURCE, ops), np.uint8, n)
        self._simulated(rank, base, rows, issue, start, end, coll)
        return rows

    def _simulated(self, rank: int, base: int, rows: np.ndarray, issue, start, end, coll) -> None:
        """Fill the columns the simulation decides: times, `duration` of untimed ops, `coll`, `mem_delta`; and
        the iteration marks and dependencies of the rows."""
        n = len(rows)
        rows["issue"] = np.fromiter(issue, np.float64, n)
        t0 = np.fromiter(start, np.float64, n)
        t1 = np.fromiter(end, np.float64, n)
        rows["start"] = t0
        rows["end"] = t1
        kind = rows["kind"]
        untimed = np.flatnonzero(~_TIMED[kind])
        rows["duration"][untimed] = t1[untimed] - t0[untimed]
        cids = np.fromiter(coll, np.int64, n)
        some = np.flatnonzero(cids >= 0)
        if len(some):
            cids[some] = self._coll_rows(cids[some])
        rows["coll"] = cids
        mem = np.zeros(n, np.int64)
        alloc = np.flatnonzero(_MEMORY[kind])
        if len(alloc):
            self._memory(rank, rows, alloc, mem)
        rows["mem_delta"] = mem
        if self.writer is not None:
            for t in rows["end"][kind == _ITER].tolist():    # the iteration's end: host and GPU done
                self.writer.mark_iteration(rank, t)
        self._link(rank, base, kind, rows["arg"])

    def _memory(self, rank: int, rows: np.ndarray, where: np.ndarray, mem: np.ndarray) -> None:
        """mem_delta of the ALLOC and FREE rows at `where`, in program order."""
        blocks = self._blocks[rank]
        for i, k, arg, nbytes in zip(where.tolist(), rows["kind"][where].tolist(), rows["arg"][where].tolist(),
                                     rows["nbytes"][where].tolist()):
            if k == _ALLOC:
                blocks[arg] = nbytes
                mem[i] = nbytes
            else:
                mem[i] = -blocks.pop(arg, 0)

    def _link(self, rank: int, base: int, kind: np.ndarray, arg: np.ndarray) -> None:
        """Dependency rows of the block of rows starting at op `base`: each STREAM_WAIT / SYNC_EVENT to the latest
        EVENT_RECORD of its event id before it (in this block, else in an earlier one)."""
        sel = np.flatnonzero(_EVENTS[kind])
        if not len(sel):
            return
        a = arg[sel]
        rec = kind[sel] == _RECORD
        order = np.lexsort((sel, a))                    # by event id, then program order
        sa, sp, sr = a[order], sel[order], rec[order]
        m = len(order)
        # position (in this order) of the latest record at or before each entry; it is the wait's own record when
        # it has the wait's event id, else the event was not recorded earlier in this block
        last = np.maximum.accumulate(np.where(sr, np.arange(m), -1))
        lc = np.maximum(last, 0)
        found = ~sr & (last >= 0) & (sa[lc] == sa)
        src = sp[lc] + base
        events = self._events[rank]
        for j, e in zip(np.flatnonzero(~sr & ~found).tolist(), sa[~sr & ~found].tolist()):
            s_idx = events.get(e)
            if s_idx is not None:
                src[j] = s_idx
                found[j] = True
        if sr.any():
            ra, rp = sa[sr], sp[sr]
            tail = np.append(ra[1:] != ra[:-1], True)    # the last record of each event id in this block
            events.update(zip(ra[tail].tolist(), (rp[tail] + base).tolist()))
        if found.any():
            dst = sp[found] + base
            by_dst = np.argsort(dst, kind="stable")
            deps = np.empty(len(dst), S.DEP_DTYPE)
            deps["rank"] = rank
            deps["src"] = src[found][by_dst]
            deps["dst"] = dst[by_dst]
            self._deps.append(deps)

    # ------------------------------------------------------------------------------------------------ output
    def missing(self) -> dict[int, int]:
        """Per rank, how many ops the engine issued that have no row (an op never reported, or reported behind
        one that never was): nonzero means the trace holds less than was simulated and is not complete."""
        out: dict[int, int] = {}
        if self.engine is None:
            return out
        for r, rs in self.engine.ranks.items():
            if r in self._reports:
                self._take(r)
            n = rs.index - self._base.get(r, 0)
            if n > 0:
                out[r] = n
        return out

    def rows(self, rank: int) -> np.ndarray:
        """The rank's rows of the complete prefix: all of them with keep=True, else those not yet flushed."""
        self._take(rank)
        parts = self._kept[rank] if self.keep else self._pending[rank]
        if not parts:
            return np.empty(0, S.OP_DTYPE)
        if len(parts) > 1:
            parts[:] = [np.concatenate(parts)]
        return parts[0]

    def flush(self) -> None:
        """Build the rows of every complete prefix; hand them, the new dependencies and the finished collectives
        to the writer and flush it."""
        for rank in self._reports:
            self._take(rank)
        if self.writer is None:
            return
        for rank, parts in self._pending.items():
            for rows in parts:
                self.writer.append_ops(rank, rows)
                self.n_ops += len(rows)
            parts.clear()
        if self._deps:
            self.writer.append_dependencies(np.concatenate(self._deps))
            self._deps = []
        colls = self.engine.collectives if self.engine is not None else []
        if len(colls) > self._colls_written:
            new = colls[self._colls_written:]
            arr = np.zeros(len(new), dtype=S.COLL_DTYPE)
            groups = self.engine.groups
            for i, c in enumerate(new):
                arr[i] = (c["id"], self._name(c["name"]), c["group"], c["nbytes"], c["root"], self._name(c["algo"]),
                          self._name(c["proto"]), c["start"], c["end"],
                          len(groups[c["group"]].simulated) if c["group"] in groups else 2)
            self.writer.append_collectives(arr)
            self._colls_written = len(colls)
        self.writer.flush()
