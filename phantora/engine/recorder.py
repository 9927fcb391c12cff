"""Turns the engine's finished ops into trace rows, in program order, and hands them to a TraceWriter.

The engine reports ops when their times become known, which is not program order (work queued behind a collective
finishes later than host-side ops issued after it). The recorder keeps each rank's out-of-order records until the
prefix before them is complete, so the trace's per-rank op tables are in program order and replay can re-issue them.
"""

from __future__ import annotations

import numpy as np

from ..trace import schema as S
from .ops import Op, OpKind


class Recorder:
    def __init__(self, writer, engine=None, ranks=()):
        self.writer = writer
        self.engine = engine
        self._held: dict[int, dict[int, tuple]] = {r: {} for r in ranks}
        self._next: dict[int, int] = {r: 0 for r in ranks}
        self._rows: dict[int, list[tuple]] = {r: [] for r in ranks}
        self._blocks: dict[int, dict[int, int]] = {r: {} for r in ranks}
        self._names: dict[str, int] = {}
        self._coll_row: dict[int, int] = {}
        self._colls_seen = 0
        self._colls_written = 0
        self.n_ops = 0

    def attach(self, engine) -> None:
        self.engine = engine
        for r in engine.ranks:
            self._held.setdefault(r, {})
            self._next.setdefault(r, 0)
            self._rows.setdefault(r, [])
            self._blocks.setdefault(r, {})

    def __call__(self, rank: int, idx: int, op: Op, issue: float, start: float, end: float, coll: int) -> None:
        held = self._held[rank]
        held[idx] = (op, issue, start, end, coll)
        nxt = self._next[rank]
        if idx != nxt:
            return
        rows = self._rows[rank]
        while nxt in held:
            rows.append(self._row(rank, *held.pop(nxt)))
            nxt += 1
        self._next[rank] = nxt

    def _name(self, s: str) -> int:
        i = self._names.get(s)
        if i is None:
            i = self._names[s] = self.writer.add_string(s) if self.writer is not None else len(self._names)
        return i

    def _coll_index(self, cid: int) -> int:
        if cid < 0:
            return -1
        row = self._coll_row.get(cid)
        if row is None:
            colls = self.engine.collectives
            for i in range(self._colls_seen, len(colls)):
                self._coll_row[colls[i]["id"]] = i
            self._colls_seen = len(colls)
            row = self._coll_row.get(cid, -1)
        return row

    def _row(self, rank: int, op: Op, issue: float, start: float, end: float, coll: int) -> tuple:
        k = op.kind
        mem = 0
        if k == OpKind.ALLOC:
            mem = op.nbytes
            self._blocks[rank][op.arg] = op.nbytes
        elif k == OpKind.FREE:
            mem = -self._blocks[rank].pop(op.arg, 0)
        dur = op.duration if k in (OpKind.KERNEL, OpKind.MEMCPY) else end - start
        if k == OpKind.ITER_MARK and self.writer is not None:
            self.writer.mark_iteration(rank, issue)
        return (int(k), op.stream, self._name(op.name), op.sig, issue, start, end, op.cpu_delta, dur, op.flops,
                op.nbytes, mem, int(op.source), op.group, op.arg, self._coll_index(coll))

    def rows(self, rank: int) -> np.ndarray:
        return np.array(self._rows[rank], dtype=S.OP_DTYPE)

    def flush(self) -> None:
        """Hand every complete prefix and finished collective to the writer and flush it."""
        if self.writer is None:
            return
        for rank, rows in self._rows.items():
            if rows:
                self.writer.append_ops(rank, np.array(rows, dtype=S.OP_DTYPE))
                self.n_ops += len(rows)
                self._rows[rank] = []
        colls = self.engine.collectives if self.engine is not None else []
        if len(colls) > self._colls_written:
            new = colls[self._colls_written:]
            arr = np.zeros(len(new), dtype=S.COLL_DTYPE)
            for i, c in enumerate(new):
                arr[i] = (c["id"], self._name(c["name"]), c["group"], c["nbytes"], c["root"], self._name(c["algo"]),
                          self._name(c["proto"]), c["start"], c["end"], len(self.engine.groups[c["group"]].simulated)
                          if c["group"] in self.engine.groups else 2)
            self.writer.append_collectives(arr)
            self._colls_written = len(colls)
        self.writer.flush()
