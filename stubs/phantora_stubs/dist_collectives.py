"""The collectives of a simulated process group: each becomes `OpKind.COLLECTIVE` on the group's communication
stream, nothing travels.

all_reduce, all_gather incl. the single-tensor and coalesced forms, reduce_scatter likewise, broadcast, reduce,
all_to_all, barrier; gather / scatter are point-to-point batches as NCCL does them. Real values travel where they
exist (exchange.py): small tensors with known values through all_reduce, broadcast, all_gather and all_to_all. Tensors on a
device the group has no backend for are refused first, as c10d refuses them (a CPU tensor on an NCCL-only group).
"""

from __future__ import annotations

from phantora.engine.ops import OpKind

from . import alltoall, context, exchange
from .clock import METER
from .dist_emit import EmissionMixin, PhantoraWork, _flat, _forget, _nbytes, uncounted_methods
from .routes import ROUTES


@uncounted_methods
class CollectivesMixin(EmissionMixin):
    """The collective methods of `PhantoraProcessGroup`."""

    # -- collectives ---------------------------------------------------------------------------------------------------
    def allreduce(self, tensors, opts=None):
        self._check_backend_device(tensors)
        work = self._collective("all_reduce", _nbytes(tensors), result=list(_flat(tensors)))
        exchange.all_reduce(self._info.gid, list(_flat(tensors)), opts, work._event)
        return work

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts)

    # An output's known value is forgotten when no value arrives, after the exchange: forgotten first, a base or
    # input that shares its elements (an in-place gather) would be forgotten with it (values.py).
    def allgather(self, output_tensors, input_tensors, opts=None):
        self._check_backend_device(output_tensors, input_tensors)
        if len(input_tensors) == 1 and len(output_tensors) == 1:
            for out in output_tensors[0]:
                ROUTES.gathered(out, list(input_tensors))
        nbytes = _nbytes(input_tensors)
        if len(output_tensors) == 1 and len({_nbytes(o) for o in output_tensors[0]}) > 1:
            # outputs of different sizes: ProcessGroupNCCL broadcasts each member's tensor from it, coalesced into
            # one launch; costed as the all-gather of their mean size, which every member computes the same
            nbytes = -(-sum(_nbytes(o) for o in output_tensors[0]) // len(output_tensors[0]))
        work = self._collective("all_gather", nbytes, result=output_tensors)
        if not (len(input_tensors) == 1 and len(output_tensors) == 1
                and exchange.all_gather(self._info.gid, list(output_tensors[0]), list(input_tensors), work._event)):
            _forget(output_tensors)
        return work

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        return self.allgather(output_lists, input_list, opts)

    def all_gather_single(self, output, input, opts=None):
        self._check_backend_device(output, input)
        ROUTES.gathered(output, [input])       # a routing map gathered over the members is one (routes.py)
        work = self._collective("all_gather", _nbytes(input), result=[output])
        if not exchange.all_gather_into(self._info.gid, output, input, work._event):
            _forget(output)
        return work

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        work = None
        for o, i in zip(outputs, inputs):
            work = self.all_gather_single(o, i, opts)
        return work if work is not None else PhantoraWork(None)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def reduce_scatter(self, output_tensors, input_lists, opts=None):
        self._check_backend_device(output_tensors, input_lists)
        _forget(output_tensors)
        return self._collective("reduce_scatter", _nbytes(input_lists), result=list(_flat(output_tensors)))

    def reduce_scatter_single(self, output, input, opts=None):
        self._check_backend_device(output, input)
        work = self._collective("reduce_scatter", _nbytes(input), result=[output])
        if not exchange.reduce_scatter_into(self._info.gid, output, input, opts, self._rank, self._size,
                                              work._event):
            _forget(output)
        return work

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        work = None
        for o, i in zip(outputs, inputs):
            work = self.reduce_scatter_single(o, i, opts)
        return work if work is not None else PhantoraWork(None)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def broadcast(self, tensors, opts=None):
        self._check_backend_device(tensors)
        root = int(getattr(opts, "rootRank", 0)) if opts is not None else 0
        work = self._collective("broadcast", _nbytes(tensors), root=root, result=list(_flat(tensors)))
        exchange.broadcast(self._info.gid, list(_flat(tensors)), root, self._rank, work._event)
        return work

    def reduce(self, tensors, opts=None):
        self._check_backend_device(tensors)
        root = int(getattr(opts, "rootRank", 0)) if opts is not None else 0
        work = self._collective("reduce", _nbytes(tensors), root=root, result=list(_flat(tensors)))
        exchange.reduce(self._info.gid, list(_flat(tensors)), opts, root, self._rank, work._event)
        return work

    def alltoall(self, output_tensors, input_tensors, opts=None):
        self._check_backend_device(output_tensors, input_tensors)
        send = [_nbytes([t]) for t in input_tensors]
        recv = [_nbytes([t]) for t in output_tensors]
        work, collective = self._all_to_all(_nbytes(input_tensors), send, recv, output_tensors)
        if not collective:
            exchange.all_to_all_uneven(self._info.gid, self._info.ranks, self._rank, list(output_tensors),
                                       list(input_tensors))
        elif not exchange.all_to_all(self._info.gid, list(output_tensors), list(input_tensors), self._rank,
                                     work._event):
            _forget(output_tensors)
        return work

    def all_to_all_single(self, output, input, output_split_sizes=None, input_split_sizes=None, opts=None):
        self._check_backend_device(output, input)
        n = self._size
        input_split_sizes, output_split_sizes = alltoall.split_sizes(input_split_sizes), alltoall.split_sizes(
            output_split_sizes)
        send = alltoall.split_bytes(_nbytes(input), input.shape[0] if input.dim() else 0, input_split_sizes, n)
        recv = alltoall.split_bytes(_nbytes(output), output.shape[0] if output.dim() else 0, output_split_sizes, n)
        work, collective = self._all_to_all(_nbytes(input), send, recv, [output])
        if not collective:
            exchange.all_to_all_uneven_into(self._info.gid, self._info.ranks, self._rank, output, input,
                                            input_split_sizes, output_split_sizes)
        elif not exchange.all_to_all_into(self._info.gid, output, input, input_split_sizes, self._rank,
                                          work._event):
            _forget(output)
        return work

    def _all_to_all(self, nbytes: int, send, recv, result) -> tuple[PhantoraWork, bool]:
        ctx = context.get()
        METER.enter()
        try:
            event, collective = alltoall.launch(ctx, self._info, nbytes, send, recv)
        finally:
            METER.exit()
        return PhantoraWork(event, result), collective

    alltoall_base = all_to_all_single

    def barrier(self, opts=None):
        return self._collective("barrier", 0, blocking=True)

    def monitored_barrier(self, timeout=None, wait_all_ranks=False):
        self.barrier().wait()

    def gather(self, output_lists, input_tensors, opts=None):
        self._check_backend_device(output_lists, input_tensors)
        root = int(getattr(opts, "rootRank", 0)) if opts is not None else 0
        self._group_marker(OpKind.GROUP_START)
        work = None
        if self._rank == root:
            _forget(output_lists)
            output_lists[0][root].copy_(input_tensors[0])      # the root's own chunk: a copy on its GPU
            for peer in range(self._size):
                if peer != root:
                    work = self._p2p(OpKind.RECV, input_tensors, peer)
        else:
            work = self._p2p(OpKind.SEND, input_tensors, root)
        self._group_marker(OpKind.GROUP_END)
        return work if work is not None else PhantoraWork(None)

    def scatter(self, output_tensors, input_lists, opts=None):
        self._check_backend_device(output_tensors, input_lists)
        root = int(getattr(opts, "rootRank", 0)) if opts is not None else 0
        self._group_marker(OpKind.GROUP_START)
        work = None
        if self._rank == root:
            output_tensors[0].copy_(input_lists[0][root])      # the root's own chunk: a copy on its GPU
            for peer in range(self._size):
                if peer != root:
                    work = self._p2p(OpKind.SEND, output_tensors, peer)
        else:
            _forget(output_tensors)
            work = self._p2p(OpKind.RECV, output_tensors, root)
        self._group_marker(OpKind.GROUP_END)
        return work if work is not None else PhantoraWork(None)
