"""Layout of a Phantora trace file: format name and version, dataset paths, and the numpy dtypes of its tables.

A trace is one HDF5 file (see docs/trace-format.md). Every table is a one-dimensional, chunked, resizable dataset
whose rows are numpy structured records with the dtypes below; times are seconds of virtual time, sizes are bytes.
"""

from __future__ import annotations

import h5py
import numpy as np

from phantora.engine.ops import CostSource, OpKind

FORMAT_NAME = "phantora-trace"
"""Value of the root attribute `format`; a file without it is not a Phantora trace."""

FORMAT_VERSION = 1
"""Value of the root attribute `version` written by this code; readers refuse larger versions."""

# Dataset and group paths inside the file.
META = "meta"                  # scalar UTF-8 string: JSON object of run metadata
STRINGS = "strings"            # variable-length UTF-8 strings: op names, algorithms, protocols (index 0 is "")
SIGNATURES = "signatures"      # variable-length UTF-8 strings: kernel signature keys (Signature.key())
GROUPS = "groups"              # GROUP_DTYPE rows
COLLECTIVES = "collectives"    # COLL_DTYPE rows
DEPENDENCIES = "dependencies"  # DEP_DTYPE rows
RANKS = "ranks"                # one HDF5 group per simulated rank, named by the rank number
OPS = "ops"                    # ranks/<r>/ops: OP_DTYPE rows in program order
ITERATIONS = "iterations"      # ranks/<r>/iterations: float64 iteration-mark times

META_KEYS = {
    "command": "list[str]: the command line of the run",
    "cluster": "dict: the cluster preset table (the cluster TOML as a dict)",
    "gpu": "str: GPU preset name",
    "versions": "dict: versions of phantora, torch, python, numpy, h5py",
    "world_size": "int: number of ranks of the simulated job",
    "ranks": "list[int]: ranks simulated (and traced) by this run",
    "rank_map": "list[int]: for every rank 0..world_size-1, the simulated rank that represents it",
    "created": "str: ISO 8601 UTC time the trace was created",
    "mode": "str: 'live' (a framework ran) or 'replay' (re-simulated from another trace)",
    "generated_marked": "bool: KERNEL ops' `arg` marks the kernels Inductor generated (absent in older traces, "
                        "whose generated kernels are found by name)",
    "host_cpu": "dict: how the framework's host time was found: mode ('model' or 'measured'), the prices py_call_ns, "
                "c_call_ns, dispatch_us, py_line_ns (absent in older traces: 0), the conversion prices to_tensor_ns, "
                "infer_dtype_ns, to_list_ns (absent in older traces), and cpu_time_scale (docs/host-cpu.md)",
    "routing": "dict: the expert routing a mixture-of-experts step assumed (phantora run --routing): kind "
               "('balanced', 'zipf', 'loads'), exponent (zipf), loads and source (loads)",
    "algo": "str or null: the collective algorithm the run forced (phantora run / replay --algo; null: NCCL's "
            "own choice; absent in older traces), which a replay forces again unless told otherwise",
    "proto": "str or null: the NCCL protocol the run forced (--proto), likewise",
    "overrides": "list[str]: the cluster fields the live run's --set changed (absent in older traces), which a "
                 "replay's note on model constants changed since does not attribute to the preset",
}
"""Documented keys of the JSON object in `meta`; a trace may hold more, and readers ignore keys they do not know."""

OP_DTYPE = np.dtype([
    ("kind", "u1"),          # OpKind
    ("stream", "<i2"),       # stream id on the rank (0 = default stream)
    ("name", "<u4"),         # index into the string table
    ("sig", "<i4"),          # index into the signature table, -1 for none
    ("issue", "<f8"),        # s, CPU time at which the op was issued
    ("start", "<f8"),        # s, time the op started (on its stream, or on the host for host-side ops)
    ("end", "<f8"),          # s, time the op finished
    ("cpu_delta", "<f8"),    # s, framework CPU time since the previous op (as handed to the engine)
    ("duration", "<f8"),     # s, cost used for the op (kernel/copy time; for network ops the simulated time)
    ("flops", "<f8"),        # floating-point operations
    ("nbytes", "<i8"),       # bytes moved / requested, by kind
    ("mem_delta", "<i8"),    # change of the rank's allocated device bytes caused by the op
    ("source", "u1"),        # CostSource
    ("group", "<i4"),        # process-group id, -1 for none
    ("arg", "<i8"),          # root / peer / event id / block id / memcpy direction, by kind
    ("coll", "<i8"),         # row index into the collectives table, -1 for none
    ("host_py", "<i4"),      # host work since the previous op (modelled host CPU): Python calls,
    ("host_c", "<i4"),       # built-in function calls,
    ("host_disp", "<i4"),    # aten ops dispatched; all 0 when the host CPU time was measured
    ("host_line", "<i4"),    # Python lines run (modelled host CPU), appended after host_disp
])
"""One row per op of a rank's stream, in program order."""

OPTIONAL_OP_COLUMNS = ("host_py", "host_c", "host_disp", "host_line")
"""Columns appended after the first traces were written (a compatible addition): a trace without them reads them
as 0."""

COLL_DTYPE = np.dtype([
    ("id", "<i8"),             # engine's collective id
    ("name", "<u4"),           # string index: all_reduce, all_gather, ... send/recv
    ("group", "<i4"),          # process-group id
    ("nbytes", "<i8"),         # bytes of one rank's input buffer
    ("root", "<i4"),           # group rank of the root, -1 for rootless collectives
    ("algo", "<u4"),           # string index: ring, tree, pairwise, ...
    ("proto", "<u4"),          # string index: Simple, LL, LL128, ...
    ("start", "<f8"),          # s, time the collective started (the last member arrived)
    ("end", "<f8"),            # s, time the collective finished
    ("ranks_arrived", "<i4"),  # the group's simulated members (all reached it; mirrored ranks not counted)
])
"""One row per collective (or point-to-point transfer) instance, shared by all ranks taking part."""

DEP_DTYPE = np.dtype([
    ("rank", "<i4"),   # rank whose streams the dependency links
    ("src", "<i8"),    # op index (row of ranks/<rank>/ops) of the EVENT_RECORD
    ("dst", "<i8"),    # op index of the STREAM_WAIT that waits for it
])
"""Cross-stream dependencies: EVENT_RECORD -> STREAM_WAIT pairs."""

RANKS_DTYPE = np.dtype("<i4")

GROUP_DTYPE = np.dtype([
    ("id", "<i4"),                              # process-group id (as in OP_DTYPE.group)
    ("name", "<u4"),                            # string index, 0 when unnamed
    ("ranks", h5py.vlen_dtype(RANKS_DTYPE)),  # member global ranks, in group-rank order
])
"""Process groups: id -> member ranks (variable length) and a name."""

ITER_DTYPE = np.dtype("<f8")

OP_DEFAULTS = {"sig": -1, "group": -1, "arg": -1, "coll": -1}
"""Column values of an op row that mean "none"; every other column defaults to 0."""

GPU_KINDS = (OpKind.KERNEL, OpKind.MEMCPY, OpKind.COLLECTIVE, OpKind.SEND, OpKind.RECV)
"""Kinds that occupy a stream between `start` and `end`."""

COMM_KINDS = (OpKind.COLLECTIVE, OpKind.SEND, OpKind.RECV)
"""Kinds that are communication."""

KIND_NAMES = {int(k): k.name for k in OpKind}
SOURCE_NAMES = {int(s): s.name for s in CostSource}


def empty_ops(n: int) -> np.ndarray:
    """`n` op rows with every column at its "none" value (see OP_DEFAULTS)."""
    rows = np.zeros(n, OP_DTYPE)
    for field, value in OP_DEFAULTS.items():
        rows[field] = value
    return rows


def empty_collectives(n: int) -> np.ndarray:
    """`n` collective rows with `root` at -1 and every other column at 0."""
    rows = np.zeros(n, COLL_DTYPE)
    rows["root"] = -1
    return rows


def empty_dependencies(n: int) -> np.ndarray:
    """`n` dependency rows, all zero."""
    return np.zeros(n, DEP_DTYPE)
