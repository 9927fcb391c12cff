"""Export of a trace as Chrome / Perfetto trace-event JSON (open it in ui.perfetto.dev or chrome://tracing).

Layout: one process per simulated rank (pid = rank, named "rank N"); one thread per stream ("stream S"; ops that
overlap on one stream, such as grouped sends and receives, go to extra "stream S (overlap k)" threads, since a
thread's slices must nest); a "CPU" thread with issue marks of launches, host synchronisations and iteration marks;
a "memory" counter. Kernels, copies, collectives and point-to-point ops are complete ("X") events with their FLOPs,
bytes, cost source and signature as args. The parts of one collective on different ranks are chained by flow
events ("s" then "f" with one id, binding to the enclosing slices), which viewers draw as arrows between ranks.

Times are written in microseconds from integer nanoseconds, so slices that touch stay touching. Each number carries
a trailing 5 in the fourth decimal place: readers that turn microseconds into nanoseconds by truncation (Perfetto's
JSON importer does) then land on the exact nanosecond instead of one below it. Event keys put "ts" before any
nested value, strings are written as UTF-8 rather than \\u escapes, and "displayTimeUnit", "otherData" and
"traceEvents" are the only top-level keys: the forms Perfetto's streaming JSON tokenizer accepts.
"""

from __future__ import annotations

import gzip
import json
import math
import os
from collections import defaultdict
from typing import Any, TextIO

import numpy as np

from phantora.engine.ops import Memcpy, OpKind
from phantora.errors import TraceError
from phantora.trace import schema as S
from phantora.trace.reader import TraceReader

CPU_TID = 0

_GPU = frozenset(int(k) for k in S.GPU_KINDS)
_CATEGORY = {int(OpKind.KERNEL): "kernel", int(OpKind.MEMCPY): "memcpy", int(OpKind.COLLECTIVE): "collective",
             int(OpKind.SEND): "p2p", int(OpKind.RECV): "p2p"}
_SYNC = {int(OpKind.SYNC_DEVICE): "synchronize device", int(OpKind.SYNC_STREAM): "synchronize stream",
         int(OpKind.SYNC_EVENT): "synchronize event"}
_MEMCPY = {int(m): m.name for m in Memcpy}


def export_perfetto(reader: TraceReader, out_path: str | os.PathLike, *, ranks: list[int] | None = None,
                    cpu: bool = True, memory: bool = True, signatures: bool = True) -> dict[str, Any]:
    """Write `reader`'s trace (or the given `ranks`) as trace-event JSON to `out_path` (gzip when it ends in .gz).

    `cpu` adds the CPU thread, `memory` the memory counter, `signatures` each kernel's signature key in its args.
    Returns counts: events, slices, flows and the ranks written.
    """
    out_path = os.fspath(out_path)
    ranks = list(reader.ranks if ranks is None else ranks)
    exporter = _Exporter(reader, cpu, memory, signatures)
    other = {"source": "phantora", "trace": os.path.basename(reader.path), "format_version": str(reader.version),
             "complete": str(reader.complete).lower()}
    for key in ("mode", "gpu", "world_size", "created"):
        if reader.meta.get(key) is not None:
            other[key] = str(reader.meta[key])
    try:
        with _open_text(out_path) as out:
            out.write('{"displayTimeUnit":"ms","otherData":' + json.dumps(other, ensure_ascii=False)
                      + ',"traceEvents":[\n')
            first = True
            for chunk in exporter.events(ranks):
                if chunk:
                    out.write(("" if first else ",\n") + ",\n".join(chunk))
                    first = False
            out.write("\n]}\n")
    except OSError as e:
        raise TraceError(f"{out_path}: cannot write the Perfetto trace: {e}") from None
    return {"path": out_path, "events": exporter.n_events, "slices": exporter.n_slices, "flows": exporter.n_flows,
            "ranks": ranks}


def _open_text(path: str) -> TextIO:
    if path.endswith(".gz"):
        return gzip.open(path, "wt", encoding="utf-8")
    return open(path, "w", encoding="utf-8")


def us(ns: int) -> str:
    """Microseconds text of an integer nanosecond time (see the module docstring for the trailing 5)."""
    sign = "-" if ns < 0 else ""
    ns = abs(ns)
    return f"{sign}{ns // 1000}.{ns % 1000:03d}5"


def _num(x: float | int) -> str:
    if isinstance(x, int):
        return str(x)
    if not math.isfinite(x):
        return json.dumps(str(x))
    return str(int(x)) if x.is_integer() and abs(x) < 2 ** 53 else repr(x)


def _str(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)


class _Exporter:
    """Builds the event lines rank by rank, then the flow events between ranks."""

    def __init__(self, reader: TraceReader, cpu: bool, memory: bool, signatures: bool):
        self.reader = reader
        self.cpu = cpu
        self.memory = memory
        self.with_signatures = signatures
        self.names = [_str(n) for n in reader.names]
        self.sig_texts = reader.signatures if signatures else []
        self._sig_json: dict[int, str] = {}
        colls = reader.collectives
        self.coll_name = colls["name"].tolist()
        self.coll_extra = [
            f',"coll":{i},"coll_id":{int(c["id"])},"algo":{_str(self._string(c["algo"]))},'
            f'"proto":{_str(self._string(c["proto"]))},"ranks_arrived":{int(c["ranks_arrived"])}'
            for i, c in enumerate(colls)]
        self.n_events = self.n_slices = self.n_flows = 0
        # coll row -> [(anchor ns, rank, tid)] of its parts
        self.parts: dict[int, list[tuple[int, int, int]]] = defaultdict(list)

    def _string(self, i: int) -> str:
        names = self.reader.names
        return names[int(i)] if 0 <= int(i) < len(names) else ""

    def _signature(self, sig: int) -> str:
        text = self._sig_json.get(sig)
        if text is None:
            key = self.sig_texts[sig] if 0 <= sig < len(self.sig_texts) else ""
            text = self._sig_json[sig] = _str(key)
        return text

    def events(self, ranks: list[int]):
        for r in ranks:
            lines = self._rank(r)
            self.n_events += len(lines)
            yield lines
        lines = self._flows()
        self.n_events += len(lines)
        yield lines

    def _rank(self, rank: int) -> list[str]:
        ops = self.reader.ops(rank)
        lines = [f'{{"name":"process_name","ph":"M","ts":0,"pid":{rank},"tid":0,"args":{{"name":"rank {rank}"}}}}',
                 f'{{"name":"process_sort_index","ph":"M","ts":0,"pid":{rank},"tid":0,'
                 f'"args":{{"sort_index":{rank}}}}}']
        if self.cpu:
            lines.append(f'{{"name":"thread_name","ph":"M","ts":0,"pid":{rank},"tid":{CPU_TID},"args":{{"name":"CPU"}}}}')
            lines.append(f'{{"name":"thread_sort_index","ph":"M","ts":0,"pid":{rank},"tid":{CPU_TID},'
                         f'"args":{{"sort_index":-1}}}}')
        if not len(ops):
            return lines
        start_ns = np.rint(ops["start"] * 1e9).astype(np.int64).tolist()
        end_ns = np.rint(ops["end"] * 1e9).astype(np.int64).tolist()
        issue_ns = np.rint(ops["issue"] * 1e9).astype(np.int64).tolist()
        cols = {c: ops[c].tolist() for c in ("kind", "stream", "name", "sig", "flops", "nbytes", "source", "group",
                                             "arg", "coll", "mem_delta")}
        kinds, streams, name_ids = cols["kind"], cols["stream"], cols["name"]
        lanes: dict[int, list[int]] = {}          # stream -> end ns of the last slice of each lane
        tids: dict[tuple[int, int], int] = {}     # (stream, lane) -> tid
        names = self.names
        iteration = 0
        mem = 0
        for i, k in enumerate(kinds):
            if k in _GPU:
                s, e = start_ns[i], max(end_ns[i], start_ns[i])
                stream = streams[i]
                ends = lanes.setdefault(stream, [])
                lane = next((j for j, last in enumerate(ends) if last <= s), len(ends))
                if lane == len(ends):
                    ends.append(e)
                else:
                    ends[lane] = e
                tid = tids.get((stream, lane))
                if tid is None:
                    tid = tids[(stream, lane)] = len(tids) + 1
                    label = f"stream {stream}" if lane == 0 else f"stream {stream} (overlap {lane})"
                    lines.append(f'{{"name":"thread_name","ph":"M","ts":0,"pid":{rank},"tid":{tid},'
                                 f'"args":{{"name":"{label}"}}}}')
                    lines.append(f'{{"name":"thread_sort_index","ph":"M","ts":0,"pid":{rank},"tid":{tid},'
                                 f'"args":{{"sort_index":{stream * 1000 + lane}}}}}')
                lines.append(self._slice(rank, tid, i, k, s, e, name_ids[i], cols))
                self.n_slices += 1
                coll = cols["coll"][i]
                if coll >= 0:
                    self.parts[coll].append((s + (e - s) // 2, rank, tid))
                if self.cpu:
                    lines.append(f'{{"name":{names[name_ids[i]] if name_ids[i] else _str(_CATEGORY[k])},'
                                 f'"cat":"launch","ph":"i","s":"t","ts":{us(issue_ns[i])},"pid":{rank},'
                                 f'"tid":{CPU_TID},"args":{{"op":{i}}}}}')
            elif self.cpu and k in _SYNC:
                s, e = issue_ns[i], max(end_ns[i], issue_ns[i])
                lines.append(f'{{"name":"{_SYNC[k]}","cat":"sync","ph":"X","ts":{us(s)},"dur":{us(e - s)},'
                             f'"pid":{rank},"tid":{CPU_TID},"args":{{"op":{i}}}}}')
                self.n_slices += 1
            elif self.cpu and k == int(OpKind.ITER_MARK):
                iteration += 1
                lines.append(f'{{"name":"iteration {iteration}","cat":"iteration","ph":"i","s":"p",'
                             f'"ts":{us(issue_ns[i])},"pid":{rank},"tid":{CPU_TID},"args":{{"op":{i}}}}}')
            delta = cols["mem_delta"][i]
            if self.memory and delta:
                mem += delta
                lines.append(f'{{"name":"memory","ph":"C","ts":{us(issue_ns[i])},"pid":{rank},"tid":{CPU_TID},'
                             f'"args":{{"allocated_bytes":{mem}}}}}')
        return lines

    def _slice(self, rank: int, tid: int, i: int, kind: int, s: int, e: int, name_id: int,
               cols: dict[str, list]) -> str:
        cat = _CATEGORY[kind]
        coll = cols["coll"][i]
        if name_id:
            name = self.names[name_id]
        elif kind == int(OpKind.MEMCPY):
            name = _str(f"memcpy {_MEMCPY.get(cols['arg'][i], '')}".rstrip())
        elif kind == int(OpKind.COLLECTIVE) and 0 <= coll < len(self.coll_name):
            name = self.names[self.coll_name[coll]]
        else:
            name = _str(cat if kind != int(OpKind.SEND) and kind != int(OpKind.RECV)
                        else OpKind(kind).name.lower())
        args = [f'"op":{i}', f'"stream":{cols["stream"][i]}', f'"flops":{_num(cols["flops"][i])}',
                f'"bytes":{cols["nbytes"][i]}', f'"source":"{S.SOURCE_NAMES.get(cols["source"][i], "?")}"']
        sig = cols["sig"][i]
        if sig >= 0:
            args.append(f'"sig":{sig}')
            if self.with_signatures:
                args.append(f'"signature":{self._signature(sig)}')
        if kind == int(OpKind.MEMCPY):
            args.append(f'"direction":"{_MEMCPY.get(cols["arg"][i], "?")}"')
        elif kind in (int(OpKind.SEND), int(OpKind.RECV)):
            args.append(f'"peer":{cols["arg"][i]},"group":{cols["group"][i]}')
        elif kind == int(OpKind.COLLECTIVE):
            args.append(f'"group":{cols["group"][i]},"root":{cols["arg"][i]}')
        extra = self.coll_extra[coll] if 0 <= coll < len(self.coll_extra) else ""
        return (f'{{"name":{name},"cat":"{cat}","ph":"X","ts":{us(s)},"dur":{us(e - s)},"pid":{rank},'
                f'"tid":{tid},"args":{{{",".join(args)}{extra}}}}}')

    def _flows(self) -> list[str]:
        """Flow events chaining the parts of each collective, in time order of their anchors."""
        lines = []
        flow_id = 0
        for coll in sorted(self.parts):
            parts = sorted(self.parts[coll])
            if len(parts) < 2:
                continue
            name = self.names[self.coll_name[coll]] if 0 <= coll < len(self.coll_name) else '"collective"'
            for (t0, r0, tid0), (t1, r1, tid1) in zip(parts, parts[1:]):
                flow_id += 1
                lines.append(f'{{"name":{name},"cat":"collective","ph":"s","ts":{us(t0)},"pid":{r0},"tid":{tid0},'
                             f'"id":{flow_id}}}')
                lines.append(f'{{"name":{name},"cat":"collective","ph":"f","bp":"e","ts":{us(t1)},"pid":{r1},'
                             f'"tid":{tid1},"id":{flow_id}}}')
        self.n_flows = flow_id
        return lines
