"""The cross-stream dependencies table: deriving it from op rows and checking a trace's table against them.

A dependency row (schema.DEP_DTYPE) links, on one rank, an EVENT_RECORD op (`src`) to an op that waits for that
recording (`dst`): a STREAM_WAIT (a stream waits for the event) or a SYNC_EVENT (the host waits for it). The
recording a wait refers to is the latest EVENT_RECORD of the same event id (`arg`) before the wait in program order;
a wait on an event id never recorded waits for nothing and has no row.

Physics of a valid timeline: a STREAM_WAIT starts (its stream resumes) no earlier than the end of its record, and a
SYNC_EVENT ends (the host resumes) no earlier than the end of its record.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from phantora.engine.ops import OpKind
from phantora.trace import schema as S

RECORD = int(OpKind.EVENT_RECORD)
WAIT_KINDS = (int(OpKind.STREAM_WAIT), int(OpKind.SYNC_EVENT))


def dependencies_of(rank: int, ops: np.ndarray) -> np.ndarray:
    """The dependency rows that one rank's op rows (schema.OP_DTYPE, program order) imply."""
    kind = ops["kind"]
    where = np.flatnonzero((kind == RECORD) | np.isin(kind, WAIT_KINDS))
    latest: dict[int, int] = {}
    out = []
    for i, k, arg in zip(where.tolist(), kind[where].tolist(), ops["arg"][where].tolist()):
        if k == RECORD:
            latest[arg] = i
        elif arg in latest:
            out.append((rank, latest[arg], i))
    return np.array(out, S.DEP_DTYPE) if out else np.empty(0, S.DEP_DTYPE)


def check_dependencies(deps: np.ndarray, ops_by_rank: Mapping[int, np.ndarray], *, timing: bool = True,
                       limit: int = 5) -> tuple[int, list[str]]:
    """(number of rows with a problem, up to `limit` messages) for a dependencies table against the op rows.

    Structure: the rank is one of `ops_by_rank`, `src` and `dst` are op indices of it with src < dst, `src` is an
    EVENT_RECORD, `dst` a STREAM_WAIT or SYNC_EVENT of the same event id. With `timing`, also the physics of the
    module docstring.
    """
    bad = 0
    messages: list[str] = []

    def report(n: int, text: str) -> None:
        nonlocal bad
        bad += n
        if n and len(messages) < limit:
            messages.append(text)

    ranks = deps["rank"]
    known = np.isin(ranks, np.fromiter(ops_by_rank, np.int64, len(ops_by_rank)))
    if not known.all():
        report(int((~known).sum()), f"dependency rows name rank(s) without ops: "
                                    f"{sorted(set(ranks[~known].tolist()))[:8]}")
    for rank in np.unique(ranks[known]).tolist():
        ops = ops_by_rank[rank]
        d = deps[ranks == rank]
        src, dst = d["src"], d["dst"]
        n = len(ops)
        inside = (src >= 0) & (dst >= 0) & (src < n) & (dst < n)
        report(int((~inside).sum()), f"rank {rank}: dependency op indices outside its {n} ops "
                                     f"(first: {int(src[~inside][0]) if (~inside).any() else 0} -> "
                                     f"{int(dst[~inside][0]) if (~inside).any() else 0})")
        src, dst = src[inside], dst[inside]
        order = src < dst
        report(int((~order).sum()), f"rank {rank}: a dependency points backwards in program order "
                                    f"({_first(src, dst, ~order)})")
        is_record = ops["kind"][src] == RECORD
        report(int((~is_record).sum()), f"rank {rank}: a dependency's src is not an EVENT_RECORD "
                                        f"({_first(src, dst, ~is_record)})")
        is_wait = np.isin(ops["kind"][dst], WAIT_KINDS)
        report(int((~is_wait).sum()), f"rank {rank}: a dependency's dst is not a STREAM_WAIT or SYNC_EVENT "
                                      f"({_first(src, dst, ~is_wait)})")
        same = ops["arg"][src] == ops["arg"][dst]
        report(int((~same).sum()), f"rank {rank}: a dependency links different event ids "
                                   f"({_first(src, dst, ~same)})")
        if timing:
            ok = is_record & is_wait
            stream_wait = ops["kind"][dst] == int(OpKind.STREAM_WAIT)
            resumed = np.where(stream_wait, ops["start"][dst], ops["end"][dst])
            early = ok & (resumed < ops["end"][src])
            report(int(early.sum()), f"rank {rank}: a wait resumes before the event it waits for was recorded "
                                     f"({_first(src, dst, early)})")
    return bad, messages


def _first(src: np.ndarray, dst: np.ndarray, mask: np.ndarray) -> str:
    if not mask.any():
        return ""
    i = int(np.flatnonzero(mask)[0])
    return f"op {int(src[i])} -> op {int(dst[i])}"
