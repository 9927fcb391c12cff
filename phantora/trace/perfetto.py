"""Export of a trace as Chrome / Perfetto trace-event JSON (open it in ui.perfetto.dev or chrome://tracing).

Layout: one process per simulated rank (pid = rank, named "rank N"); one thread per stream ("stream S"; ops that
overlap on one stream, such as grouped sends and receives, go to extra "stream S (overlap k)" threads, since a
thread's slices must nest); a "CPU" thread with issue marks of launches, host synchronisations and iteration marks;
a "memory" counter. Kernels, copies, collectives and point-to-point ops are complete ("X") events with their FLOPs,
bytes, cost source and signature as args. The parts of one collective on different ranks are chained by flow
events ("s" then "f" with one id, binding to the enclosing slices), which viewers draw as arrows between ranks.
The trace's cross-stream dependencies become flow events too (category "dependency"): from the last GPU slice
on the recording stream before the EVENT_RECORD to the first GPU slice on the waiting stream after the
STREAM_WAIT (or to the host's synchronisation slice for a SYNC_EVENT), anchored at the slices' midpoints (the
sync's last nanosecond), so they point forward in time.

Times are written in microseconds from integer nanoseconds, so slices that touch stay touching. Each number carries
a trailing 5 in the fourth decimal place: readers that turn microseconds into nanoseconds by truncation (Perfetto's
JSON importer does) then land on the exact nanosecond instead of one below it. Event keys put "ts" before any
nested value, strings are written as UTF-8 rather than \\u escapes, and "displayTimeUnit", "otherData" and
"traceEvents" are the only top-level keys: the forms Perfetto's streaming JSON tokenizer accepts.
"""

from __future__ import annotations

import gzip
import json
import os
from collections import defaultdict
from typing import Any, TextIO

import numpy as np

from phantora.engine.ops import Memcpy, OpKind
from phantora.errors import TraceError
from phantora.trace import schema as S
from phantora.trace.reader import TraceReader
from phantora.trace.writer import link_no_clobber, refuse_existing, temp_sibling

CPU_TID = 0

_GPU = frozenset(int(k) for k in S.GPU_KINDS)
_CATEGORY = {int(OpKind.KERNEL): "kernel", int(OpKind.MEMCPY): "memcpy", int(OpKind.COLLECTIVE): "collective",
             int(OpKind.SEND): "p2p", int(OpKind.RECV): "p2p"}
_SYNC = {int(OpKind.SYNC_DEVICE): "synchronize device", int(OpKind.SYNC_STREAM): "synchronize stream",
         int(OpKind.SYNC_EVENT): "synchronize event"}
_MEMCPY = {int(m): m.name for m in Memcpy}
_KERNEL, _MEMCPY_KIND, _COLLECTIVE, _ITER_MARK = (int(OpKind.KERNEL), int(OpKind.MEMCPY), int(OpKind.COLLECTIVE),
                                                  int(OpKind.ITER_MARK))
_SYNC_EVENT = int(OpKind.SYNC_EVENT)


def export_perfetto(reader: TraceReader, out_path: str | os.PathLike, *, ranks: list[int] | None = None,
                    cpu: bool = True, memory: bool = True, signatures: bool = True,
                    overwrite: bool = False) -> dict[str, Any]:
    """Write `reader`'s trace (or the given `ranks`) as trace-event JSON to `out_path` (gzip when it ends in .gz).

    `cpu` adds the CPU thread, `memory` the memory counter, `signatures` each kernel's signature key in its args.
    The JSON is written to a temporary file in the same folder and renamed to `out_path` only once complete, so a
    failure (an unreadable trace, a full disk, an interrupt) leaves no file behind and `out_path` as it was. An
    existing `out_path` is refused (TraceError) unless `overwrite`.
    Returns counts: events, slices, flows and the ranks written.
    """
    out_path = os.fspath(out_path)
    refuse_existing(out_path, overwrite, "Perfetto JSON file")
    tmp = temp_sibling(out_path)
    try:
        counts = _export(reader, out_path, tmp, ranks, cpu, memory, signatures)
        if overwrite:
            os.replace(tmp, out_path)
        else:
            link_no_clobber(tmp, out_path)
    except FileExistsError:
        raise TraceError(f"{out_path}: a file of that name appeared during the export; it was left alone (pass "
                         f"--overwrite to replace it)") from None
    except OSError as e:
        raise TraceError(f"{out_path}: cannot write the Perfetto trace: {e}") from None
    finally:
        try:
            os.unlink(tmp)
        except OSError:
            pass
    return counts


def _export(reader: TraceReader, out_path: str, tmp: str, ranks: list[int] | None, cpu: bool, memory: bool,
            signatures: bool) -> dict[str, Any]:
    ranks = list(reader.ranks if ranks is None else ranks)
    exporter = _Exporter(reader, cpu, memory, signatures)
    other = {"source": "phantora", "trace": os.path.basename(reader.path), "format_version": str(reader.version),
             "complete": str(reader.complete).lower()}
    for key in ("mode", "gpu", "world_size", "created"):
        if reader.meta.get(key) is not None:
            other[key] = str(reader.meta[key])
    try:
        with _open_text(tmp, out_path.endswith(".gz")) as out:
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
            "dependency_flows": exporter.n_dependency_flows, "ranks": ranks}


def _open_text(path: str, gz: bool) -> TextIO:
    if gz:
        return gzip.open(path, "wt", encoding="utf-8")
    return open(path, "w", encoding="utf-8")


def us(ns: int) -> str:
    """Microseconds text of an integer nanosecond time (see the module docstring for the trailing 5)."""
    sign = "-" if ns < 0 else ""
    ns = abs(ns)
    return f"{sign}{ns // 1000}.{ns % 1000:03d}5"


def _us_list(ns: np.ndarray) -> list[str]:
    """`us` of every element of an int64 array."""
    if len(ns) and int(ns.min()) < 0:
        return [us(x) for x in ns.tolist()]
    q, r = np.divmod(ns, 1000)
    return [f"{a}.{b:03d}5" for a, b in zip(q.tolist(), r.tolist())]


def _num_list(x: np.ndarray) -> list[int | float | str]:
    """JSON number texts of a float array: integral values without a fraction, non-finite ones as strings."""
    finite = np.isfinite(x)
    integral = finite & (np.abs(x) < 2.0 ** 53) & (x == np.floor(np.where(finite, x, 0)))
    if integral.all():
        return x.astype(np.int64).tolist()
    out: list[int | float | str] = x.tolist()
    for i in np.flatnonzero(integral).tolist():
        out[i] = int(out[i])
    for i in np.flatnonzero(~finite).tolist():
        out[i] = json.dumps(str(out[i]))
    return out


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
        self.n_events = self.n_slices = self.n_flows = self.n_dependency_flows = 0
        self.flow_id = 0
        deps = reader.dependencies
        self.deps_by_rank: dict[int, np.ndarray] = {r: deps[deps["rank"] == r]
                                                    for r in np.unique(deps["rank"]).tolist()}
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
            lines.append(f'{{"name":"thread_name","ph":"M","ts":0,"pid":{rank},"tid":{CPU_TID},'
                         f'"args":{{"name":"CPU"}}}}')
            lines.append(f'{{"name":"thread_sort_index","ph":"M","ts":0,"pid":{rank},"tid":{CPU_TID},'
                         f'"args":{{"sort_index":-1}}}}')
        if not len(ops):
            return lines
        start = np.rint(ops["start"] * 1e9).astype(np.int64)
        issue = np.rint(ops["issue"] * 1e9).astype(np.int64)
        end = np.maximum(np.rint(ops["end"] * 1e9).astype(np.int64), start)
        sync_end = np.maximum(end, issue)
        start_ns, end_ns, issue_ns = start.tolist(), end.tolist(), issue.tolist()
        ts, dur, issue_ts = _us_list(start), _us_list(end - start), _us_list(issue)
        sync_dur = _us_list(sync_end - issue)
        kinds, streams, name_ids, sigs, colls, nbytes, groups, args, mem_deltas = (
            ops[c].tolist() for c in ("kind", "stream", "name", "sig", "coll", "nbytes", "group", "arg", "mem_delta"))
        flops = _num_list(ops["flops"])
        sources = [S.SOURCE_NAMES.get(x, "?") for x in ops["source"].tolist()]
        lanes: dict[int, list[int]] = {}          # stream -> end ns of the last slice of each lane
        tids: dict[tuple[int, int], int] = {}     # (stream, lane) -> tid
        names, n_names = self.names, len(self.names)
        coll_name, coll_extra, n_coll = self.coll_name, self.coll_extra, len(self.coll_extra)
        iteration = 0
        mem = 0
        deps = self.deps_by_rank.get(rank)
        dep_src: dict[int, list[int]] = defaultdict(list)      # op index -> dependency rows it is the record of
        dep_dst: dict[int, list[int]] = defaultdict(list)      # op index -> dependency rows it is the wait of
        if deps is not None:
            for j, (a, b) in enumerate(zip(deps["src"].tolist(), deps["dst"].tolist())):
                dep_src[a].append(j)
                dep_dst[b].append(j)
        n_deps = 0 if deps is None else len(deps)
        producer: list[tuple[int, int] | None] = [None] * n_deps   # (anchor ns, tid) of each dependency's ends
        consumer: list[tuple[int, int] | None] = [None] * n_deps
        last_gpu: dict[int, tuple[int, int]] = {}                  # stream -> (anchor ns, tid) of its last slice
        awaiting: dict[int, list[int]] = defaultdict(list)         # stream -> dependencies waiting for a slice
        for i, k in enumerate(kinds):
            if n_deps and (i in dep_src or i in dep_dst):
                for j in dep_src.get(i, ()):
                    producer[j] = last_gpu.get(streams[i])
                if k == _SYNC_EVENT:
                    if self.cpu and sync_end[i] > issue[i]:
                        for j in dep_dst.get(i, ()):
                            consumer[j] = (int(sync_end[i]) - 1, CPU_TID)
                else:
                    awaiting[streams[i]].extend(dep_dst.get(i, ()))
            if k in _GPU:
                s, e, stream = start_ns[i], end_ns[i], streams[i]
                ends = lanes.get(stream)
                if ends is None:
                    ends = lanes[stream] = []
                if ends and ends[0] <= s:
                    lane = 0
                else:
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
                coll = colls[i]
                name = names[name_ids[i]] if 0 < name_ids[i] < n_names else self._default_name(k, args[i], coll)
                extra = ""
                sig = sigs[i]
                if sig >= 0:
                    extra = f',"sig":{sig},"signature":{self._signature(sig)}' if self.with_signatures \
                        else f',"sig":{sig}'
                if k == _KERNEL:
                    pass
                elif k == _MEMCPY_KIND:
                    extra += f',"direction":"{_MEMCPY.get(args[i], "?")}"'
                elif k == _COLLECTIVE:
                    extra += f',"group":{groups[i]},"root":{args[i]}'
                else:
                    extra += f',"peer":{args[i]},"group":{groups[i]}'
                if 0 <= coll < n_coll:
                    extra += coll_extra[coll]
                    self.parts[coll].append((s + (e - s) // 2, rank, tid))
                if n_deps:
                    anchor = (s + (e - s) // 2, tid)
                    last_gpu[stream] = anchor
                    waiting = awaiting.get(stream)
                    if waiting:
                        for j in waiting:
                            consumer[j] = anchor
                        waiting.clear()
                lines.append(f'{{"name":{name},"cat":"{_CATEGORY[k]}","ph":"X","ts":{ts[i]},"dur":{dur[i]},'
                             f'"pid":{rank},"tid":{tid},"args":{{"op":{i},"stream":{stream},"flops":{flops[i]},'
                             f'"bytes":{nbytes[i]},"source":"{sources[i]}"{extra}}}}}')
                self.n_slices += 1
                if self.cpu:
                    lines.append(f'{{"name":{name},"cat":"launch","ph":"i","s":"t","ts":{issue_ts[i]},'
                                 f'"pid":{rank},"tid":{CPU_TID},"args":{{"op":{i}}}}}')
            elif k in _SYNC:
                if self.cpu:
                    lines.append(f'{{"name":"{_SYNC[k]}","cat":"sync","ph":"X","ts":{issue_ts[i]},'
                                 f'"dur":{sync_dur[i]},"pid":{rank},"tid":{CPU_TID},"args":{{"op":{i}}}}}')
                    self.n_slices += 1
            elif k == _ITER_MARK:
                iteration += 1
                if self.cpu:
                    # at the iteration's end (the GPU's completion of its work: what inspect and replay time), the
                    # host's issue of the mark in its args
                    lines.append(f'{{"name":"iteration {iteration}","cat":"iteration","ph":"i","s":"p",'
                                 f'"ts":{us(end_ns[i])},"pid":{rank},"tid":{CPU_TID},'
                                 f'"args":{{"op":{i},"issued_us":{issue_ts[i]}}}}}')
            delta = mem_deltas[i]
            if delta and self.memory:
                mem += delta
                lines.append(f'{{"name":"memory","ph":"C","ts":{issue_ts[i]},"pid":{rank},"tid":{CPU_TID},'
                             f'"args":{{"allocated_bytes":{mem}}}}}')
        for j in range(n_deps):
            p, c = producer[j], consumer[j]
            if p is None or c is None:
                continue
            self.flow_id += 1
            self.n_dependency_flows += 1
            name = _str(f"event {args[int(deps['src'][j])]}")
            lines.append(f'{{"name":{name},"cat":"dependency","ph":"s","ts":{us(p[0])},"pid":{rank},"tid":{p[1]},'
                         f'"id":{self.flow_id}}}')
            lines.append(f'{{"name":{name},"cat":"dependency","ph":"f","bp":"e","ts":{us(c[0])},"pid":{rank},'
                         f'"tid":{c[1]},"id":{self.flow_id}}}')
        return lines

    def _default_name(self, kind: int, arg: int, coll: int) -> str:
        """JSON name of an op that carries none: memcpy direction, collective name, send/recv."""
        if kind == _MEMCPY_KIND:
            return _str(f"memcpy {_MEMCPY.get(arg, '')}".rstrip())
        if kind == _COLLECTIVE and 0 <= coll < len(self.coll_name) and 0 < self.coll_name[coll] < len(self.names):
            return self.names[self.coll_name[coll]]
        if kind in (int(OpKind.SEND), int(OpKind.RECV)):
            return _str(OpKind(kind).name.lower())
        return _str(_CATEGORY[kind])

    def _flows(self) -> list[str]:
        """Flow events chaining the parts of each collective, in time order of their anchors."""
        lines = []
        flow_id = self.flow_id
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
        self.flow_id = flow_id
        return lines
