"""The op stream: what a rank hands the engine, live (from the stubs) or in replay (from a trace).

Each rank issues a sequence of `Op`s in program order. `cpu_delta` is the framework's own CPU time (seconds) spent
since the previous op; the engine adds it (scaled by the host preset) and, for launches, the host's launch overhead.
With the modelled host CPU (the default, docs/host-cpu.md) `cpu_delta` is computed from the host work counted since
the previous op, which the op carries too (`host_py` Python calls, `host_c` built-in calls, `host_disp` aten
dispatches, `host_line` Python lines), so that a replay can cost it again for another host.
"""

from __future__ import annotations

from enum import IntEnum


class OpKind(IntEnum):
    KERNEL = 0          # GPU kernel on `stream` costing `duration` seconds
    MEMCPY = 1          # copy on `stream`; `nbytes` moved, `arg` = direction (see Memcpy); D2H also syncs the host
    COLLECTIVE = 2      # collective `name` on `group`, `nbytes` = bytes of this rank's input buffer, `arg` = root
    SEND = 3            # point-to-point send of `nbytes` to group rank `arg` of `group`
    RECV = 4            # point-to-point receive of `nbytes` from group rank `arg` of `group`
    EVENT_RECORD = 5    # record event `arg` on `stream`
    STREAM_WAIT = 6     # `stream` waits for event `arg`
    SYNC_DEVICE = 7     # host waits for every stream of the rank
    SYNC_STREAM = 8     # host waits for `stream`
    SYNC_EVENT = 9      # host waits for event `arg`
    ALLOC = 10          # caching-allocator request of `nbytes`, block id `arg`
    FREE = 11           # free of block id `arg`
    ITER_MARK = 12      # iteration boundary (an optimizer step): ends when the host issued it and the GPU work before
                        # it is done
    CPU = 13            # only advances the CPU clock by `cpu_delta`
    GROUP_START = 14    # batch of p2p ops begins (ncclGroupStart): sends/recvs until GROUP_END start together
    GROUP_END = 15


class Memcpy(IntEnum):
    H2D = 0
    D2H = 1             # a download the host waits for (blocking, or to pageable memory)
    D2D = 2
    D2H_ASYNC = 3       # a non-blocking download to pinned memory: the host goes on


class CostSource(IntEnum):
    NONE = 0            # no cost (views, metadata)
    PROFILE = 1         # measured profile database
    MEASURED = 2        # live measurement on a local GPU
    ROOFLINE = 3        # roofline model with per-family efficiency
    CROSS_GPU = 4       # another GPU's profile scaled by the roofline ratio
    NETWORK = 5         # collective / p2p: network model
    RECORDED = 6        # duration copied from a trace as recorded


class Op:
    """One entry of a rank's op stream."""

    __slots__ = ("kind", "stream", "name", "sig", "duration", "flops", "nbytes", "group", "arg", "cpu_delta",
                 "source", "mem", "host_py", "host_c", "host_disp", "host_line")

    def __init__(self, kind: OpKind, *, stream: int = 0, name: str = "", sig: int = -1, duration: float = 0.0,
                 flops: float = 0.0, nbytes: int = 0, group: int = -1, arg: int = -1, cpu_delta: float = 0.0,
                 source: int = CostSource.NONE, mem: int = 0, host_py: int = 0, host_c: int = 0,
                 host_disp: int = 0, host_line: int = 0):
        self.kind = kind
        self.stream = stream
        self.name = name
        self.sig = sig            # signature id (index into the run's signature table), -1 for none
        self.duration = duration  # seconds, kernels and copies
        self.flops = flops
        self.nbytes = nbytes
        self.group = group        # process-group id (see Engine.add_group)
        self.arg = arg            # root / peer / event id / block id / memcpy direction, by kind
        self.cpu_delta = cpu_delta
        self.source = source
        self.mem = mem            # bytes of memory the op's outputs allocate (informational)
        self.host_py = host_py    # host work since the previous op (modelled host CPU): Python calls,
        self.host_c = host_c      # built-in (C) function calls,
        self.host_disp = host_disp  # aten ops dispatched (kernels, views, metadata ops),
        self.host_line = host_line  # and Python lines run

    def describe(self) -> str:
        """The op in words, for failure reports: what it is, where, how much."""
        k = OpKind(self.kind)
        if k in (OpKind.KERNEL, OpKind.MEMCPY):
            what = self.name or ("copy " + Memcpy(self.arg).name if k == OpKind.MEMCPY and self.arg >= 0 else k.name)
            return f"{'kernel' if k == OpKind.KERNEL else 'copy'} {what} on stream {self.stream}"
        if k == OpKind.COLLECTIVE:
            return f"collective {self.name} of {self.nbytes:,} bytes on group {self.group}, stream {self.stream}"
        if k in (OpKind.SEND, OpKind.RECV):
            way = "send to" if k == OpKind.SEND else "receive from"
            return f"{way} group rank {self.arg} of group {self.group}, {self.nbytes:,} bytes, stream {self.stream}"
        if k in (OpKind.EVENT_RECORD, OpKind.STREAM_WAIT):
            return f"{'record of' if k == OpKind.EVENT_RECORD else 'stream wait for'} event {self.arg} on stream " \
                   f"{self.stream}"
        if k == OpKind.SYNC_DEVICE:
            return "host waits for every stream (torch.cuda.synchronize)"
        if k == OpKind.SYNC_STREAM:
            return f"host waits for stream {self.stream}"
        if k == OpKind.SYNC_EVENT:
            return f"host waits for event {self.arg}"
        if k in (OpKind.ALLOC, OpKind.FREE):
            return f"{'allocation of ' + format(self.nbytes, ',') + ' bytes' if k == OpKind.ALLOC else 'free'}, " \
                   f"block {self.arg}"
        if k == OpKind.ITER_MARK:
            return f"end of iteration {self.arg} (optimizer step)"
        return k.name.lower().replace("_", " ")

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={getattr(self, k)!r}" for k in self.__slots__ if getattr(self, k) not in ("", -1, 0, 0.0))
        return f"Op({OpKind(self.kind).name}, {fields})"


COLLECTIVE_NAMES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all", "barrier")
