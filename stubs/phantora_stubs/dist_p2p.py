"""Point-to-point on a simulated process group: send/recv become `OpKind.SEND` / `OpKind.RECV` (peer = group
rank); a send of small tensors with known values carries them to the receiver (exchange.p2p_send; inside an NCCL
group the receiver takes them when the group ends), and NCCL groups (`batch_isend_irecv`, the coalescing manager)
are bracketed by GROUP_START / GROUP_END (an NCCL group: its transfers run when it ends, and its one work completes
after them; comm.py).
"""

from __future__ import annotations

import torch.distributed as dist
from phantora.engine.ops import OpKind

from . import comm, context, exchange
from .clock import METER
from .dist_emit import EmissionMixin, PhantoraWork, _flat, _forget, uncounted_methods


@uncounted_methods
class PointToPointMixin(EmissionMixin):
    """The point-to-point and coalescing methods of `PhantoraProcessGroup`."""

    # -- point-to-point ----------------------------------------------------------------------------------------------
    def send(self, tensors, dst, tag=0):
        work = self._p2p(OpKind.SEND, tensors, dst)
        info = self._info
        exchange.p2p_send(info.gid, info.ranks[self.rank()], info.ranks[dst], list(_flat(tensors)))
        return work

    def recv(self, tensors, src, tag=0):
        _forget(tensors)
        work = self._p2p(OpKind.RECV, tensors, src)
        info = self._info
        exchange.p2p_recv(info.gid, info.ranks[src], info.ranks[self.rank()], list(_flat(tensors)), work._event)
        return work

    def recv_anysource(self, tensors, tag=0):
        # dist.recv / irecv without src: ProcessGroupNCCL refuses it with this message; a gloo group's answer
        # (whichever peer's message comes first) has no simulated meaning here
        if self.backend_label == "gloo":
            raise RuntimeError("phantora: a receive from any source (dist.recv without src) is not simulated; "
                               "pass src")
        raise RuntimeError("ProcessGroupNCCL does not support recvAnysource")

    # -- coalescing (ncclGroupStart / ncclGroupEnd) ------------------------------------------------------------------
    def _start_coalescing(self, device=None):
        self._group_marker(OpKind.GROUP_START)

    def _end_coalescing(self, device=None):
        self._group_marker(OpKind.GROUP_END)
        return PhantoraWork(None)


# ---- batch_isend_irecv --------------------------------------------------------------------------------------------

def _wrap_batch_isend_irecv(c10d) -> None:
    from .dist_groups import PhantoraProcessGroup   # built on PointToPointMixin: imported here, not above

    original = c10d.batch_isend_irecv
    if getattr(original, "__phantora__", False):
        return

    def batch_isend_irecv(p2p_op_list):
        """One NCCL group (GROUP_START, the sends and receives, GROUP_END); as ProcessGroupNCCL's coalesced path
        does, an NCCL group returns a single work for the whole batch (a gloo group one work per op)."""
        ctx = context.get()
        METER.enter()
        try:
            comm.group_marker(ctx, OpKind.GROUP_START)
        finally:
            METER.exit()
        try:
            works = original(p2p_op_list)
        except BaseException:
            comm.drop_group_end_work()      # the batch failed: its receives take nothing, the error goes up
            raise
        finally:
            METER.enter()
            try:
                comm.group_marker(ctx, OpKind.GROUP_END)
            finally:
                METER.exit()
        group = p2p_op_list[0].group if p2p_op_list else None
        if group is None and p2p_op_list:
            group = c10d._get_default_group()
        if works and isinstance(group, PhantoraProcessGroup) and group.backend_label != "gloo":
            return [works[-1]]
        return works

    batch_isend_irecv.__phantora__ = True   # type: ignore[attr-defined]
    batch_isend_irecv.__doc__ = original.__doc__
    c10d.batch_isend_irecv = batch_isend_irecv
    dist.batch_isend_irecv = batch_isend_irecv
