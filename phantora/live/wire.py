"""What a rank process and the engine server say to each other.

Transport: `multiprocessing.connection` over a Unix socket (address `unix://PATH`) with an authentication key passed in
the environment; every message is one pickled tuple whose first element is its tag.

rank -> server
    ("hello", rank, pid)                         first message
    ("ops", rows, sigs)                          ops in program order (see `encode`); sigs: new (local id, key) pairs
    ("wait", rows, sigs)                         same, the last row is a blocking op; answered ("time", t)
    ("group", gid, ranks, name)                  a process group (after the ops that precede its creation)
    ("device", gid, index)                       the CUDA device of the rank's first NCCL collective on gid;
                                                 not answered
    ("event", event_id)                          completion time of a recorded event; answered ("time", t | None)
    ("exchange", rows, sigs, gid, seq, kind, payload)
                                                 ops up to a collective, and its real values (sent together, so
                                                 a member whose collective arrived without values sent none);
                                                 answered ("value", result)
    ("put", rows, sigs, key, payload)            ops, then the objects of a point-to-point object send
                                                 (key = (gid, src, dst, n)); not answered
    ("take", rows, sigs, key)                    ops, then a wait for the objects posted under key; answered
                                                 ("value", objects)
    ("bye",)                                     the rank's program has ended
server -> rank
    ("time", t), ("value", v), ("error", message)

Op rows are plain tuples in `Op.__slots__` order, which pickle several times faster than `Op` objects.
"""

from __future__ import annotations

from phantora.engine.ops import Op

FIELDS = Op.__slots__
AUTHKEY_ENV = "PHANTORA_AUTHKEY"


def encode(op: Op) -> tuple:
    return (op.kind, op.stream, op.name, op.sig, op.duration, op.flops, op.nbytes, op.group, op.arg, op.cpu_delta,
            op.source, op.mem, op.host_py, op.host_c, op.host_disp, op.host_line)


def decode(row: tuple) -> Op:
    op = Op.__new__(Op)
    (op.kind, op.stream, op.name, op.sig, op.duration, op.flops, op.nbytes, op.group, op.arg, op.cpu_delta,
     op.source, op.mem, op.host_py, op.host_c, op.host_disp, op.host_line) = row
    return op


def address_of(url: str) -> str:
    """The socket path of a `unix://PATH` address."""
    if not url.startswith("unix://"):
        raise ValueError(f"not a phantora engine address: {url!r} (expected unix://PATH)")
    return url[len("unix://"):]
