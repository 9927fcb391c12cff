"""All-to-all with split sizes, as NCCL runs it: one NCCL group of point-to-point transfers.

ProcessGroupNCCL runs `all_to_all_single` with split sizes (and `alltoall` on a list of tensors) as
`ncclGroupStart(); ncclSend / ncclRecv per peer with that peer's bytes; ncclGroupEnd()`
(torch/csrc/cuda/nccl.cpp, `all2all_single_unequal_split`, `all2all`), skipping peers with nothing to move. So
does the simulation: GROUP_START, a SEND of the bytes for each peer and a RECV of the bytes from each peer,
GROUP_END; the engine starts every transfer of the group together on the network, where they share the links
max-min fairly and the group ends with its slowest pair. An all-to-all of equal chunks (no split sizes, or split
sizes all equal, as the balanced routing gives) is one COLLECTIVE, costed by the network model's pairwise
all-to-all, the same pattern (tests/test_alltoall_uneven.py holds the two to the same time). Small known values
travel either way (exchange.py): combined per collective for equal chunks, pair by pair for the group of transfers
(`exchange.all_to_all_uneven`). The chunk a rank keeps for
itself is a local copy inside NCCL, not a transfer: it is not emitted.

The same function serves the process group's methods (dist_collectives.py) and the functional collective
(`_c10d_functional.all_to_all_single`, interceptor.py).
"""

from __future__ import annotations

from typing import Sequence

from phantora.engine.ops import Op, OpKind

from . import comm
from .clock import METER


def split_sizes(splits) -> list[int] | None:
    """Split sizes as a list of ints (torch.distributed takes any sequence: a list, a tuple, a NumPy array as
    Megatron-core's token dispatcher passes them, a tensor); None stays None."""
    return None if splits is None else [int(s) for s in splits]


def split_bytes(total_bytes: int, rows: int, splits: Sequence[int] | None, n: int) -> list[int] | None:
    """Bytes for each of `n` peers of a buffer of `rows` rows along dim 0 split by `splits` (None or empty: no
    split sizes were given)."""
    if not splits:
        return None
    if len(splits) != n:
        raise ValueError(f"all_to_all: {len(splits)} split sizes for a group of {n}")
    row = total_bytes // rows if rows else 0
    return [int(s) * row for s in splits]


def uniform(nbytes: int, send: list[int] | None, recv: list[int] | None, n: int) -> bool:
    """Whether the all-to-all moves equal chunks of the input both ways (no split sizes, or equal ones)."""
    if send is not None and (len(set(send)) > 1 or sum(send) != nbytes):
        return False
    return recv is None or (len(set(recv)) <= 1 and sum(recv) == nbytes)


def launch(ctx, info: comm.GroupInfo, nbytes: int, send: list[int] | None, recv: list[int] | None) -> tuple[int, bool]:
    """Emit one all-to-all on group `info`; `send[p]` / `recv[p]`: bytes to / from group rank p (None: equal
    chunks of this rank's `nbytes`-byte input). Returns the event its completion is recorded on, and whether it
    went as one COLLECTIVE (equal chunks). The caller has entered the host-CPU meter."""
    n = info.size
    if uniform(nbytes, send, recv, n):
        return comm.launch(ctx, OpKind.COLLECTIVE, "all_to_all", info, nbytes), True
    me = info.ranks.index(ctx.config.rank)
    equal = nbytes // n if n else 0
    send = send if send is not None else [equal] * n
    recv = recv if recv is not None else [equal] * n
    transfers = [(kind, p, b) for p in range(n) if p != me
                 for kind, b in ((OpKind.SEND, send[p]), (OpKind.RECV, recv[p])) if b > 0]
    if not transfers:          # nothing leaves the rank: complete in stream order
        event = ctx.dev.new_event_id()
        ctx.runtime.submit(Op(OpKind.EVENT_RECORD, stream=ctx.dev.stream(), arg=event, cpu_delta=METER.claim()))
        return event, False
    comm.group_marker(ctx, OpKind.GROUP_START)
    event = -1
    for kind, peer, b in transfers:
        event = comm.launch(ctx, kind, "send" if kind == OpKind.SEND else "recv", info, b, peer)
    comm.group_marker(ctx, OpKind.GROUP_END)
    return event, False

