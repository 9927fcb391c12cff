"""Batched point-to-point (NCCL groups) through the engine and the recorder, and the completeness of a trace.

A batch (GROUP_START, sends and receives, GROUP_END) as `dist.batch_isend_irecv` emits it must give every op of the
program a row, in program order; a trace whose rows stop short of what the engine simulated is never complete.
"""

from __future__ import annotations

import numpy as np

from phantora.cluster import load_cluster
from phantora.engine.core import Engine
from phantora.engine.ops import Op, OpKind as K
from phantora.engine.recorder import Recorder
from phantora.simulate import simulate_streams
from phantora.trace.reader import TraceReader

MiB = 2**20
COMM = 7          # the group's communication stream


def pipeline_step(peer: int) -> list[Op]:
    """One step of a pipeline schedule: compute, then a batch with a send and a receive in each direction (as
    Megatron's and TorchTitan's schedules post them), the batch's completion waited by the compute stream."""
    return [
        Op(K.KERNEL, stream=0, duration=1e-4),
        Op(K.EVENT_RECORD, stream=0, arg=1),
        Op(K.GROUP_START, stream=0),
        Op(K.STREAM_WAIT, stream=COMM, arg=1),
        Op(K.SEND, stream=COMM, group=0, arg=peer, nbytes=4 * MiB),
        Op(K.STREAM_WAIT, stream=COMM, arg=1),
        Op(K.RECV, stream=COMM, group=0, arg=peer, nbytes=4 * MiB),
        Op(K.STREAM_WAIT, stream=COMM, arg=1),
        Op(K.SEND, stream=COMM, group=0, arg=peer, nbytes=MiB),
        Op(K.STREAM_WAIT, stream=COMM, arg=1),
        Op(K.RECV, stream=COMM, group=0, arg=peer, nbytes=MiB),
        Op(K.GROUP_END, stream=0),
        Op(K.EVENT_RECORD, stream=COMM, arg=2),
        Op(K.STREAM_WAIT, stream=0, arg=2),
        Op(K.KERNEL, stream=0, duration=1e-4),
        Op(K.ITER_MARK, arg=1),
    ]


def program(me: int, steps: int = 3) -> list[Op]:
    peer = 1 - me
    return [op for _ in range(steps) for op in pipeline_step(peer)] + [Op(K.SYNC_DEVICE)]


def run_recorded(streams: dict[int, list[Op]], recorder: type = Recorder):
    spec = load_cluster("h100-hgx", gpus_per_node=2)
    rec = recorder(keep=True)
    eng = Engine(spec, simulated=sorted(streams), sink=rec)
    rec.attach(eng)
    eng.add_group(0, (0, 1))
    for r, ops in streams.items():
        eng.feed(r, ops)
        eng.close(r)
    assert eng.run()
    return eng, rec


def test_every_op_of_a_batched_exchange_gets_a_row_in_program_order():
    streams = {r: program(r) for r in (0, 1)}
    eng, rec = run_recorded(streams)
    assert rec.missing() == {}
    for r, ops in streams.items():
        rows = rec.rows(r)
        assert len(rows) == len(ops)
        assert list(rows["kind"]) == [int(op.kind) for op in ops]
    # the transfers ran on the network: two per direction per step
    p2p = [c for c in eng.collectives if c["name"] == "send_recv"]
    assert len(p2p) == 4 * 3
    # the compute stream's second kernel waits for the whole batch
    rows = rec.rows(0)
    kernels = np.flatnonzero(rows["kind"] == int(K.KERNEL))
    last_transfer_end = max(c["end"] for c in p2p[:4])
    assert rows["start"][kernels[1]] >= last_transfer_end


def test_a_trace_missing_ops_is_not_marked_complete(tmp_path):
    streams = {r: program(r, steps=1) for r in (0, 1)}
    spec = load_cluster("h100-hgx", gpus_per_node=2)
    good = tmp_path / "good.h5"
    simulate_streams(spec, streams, good, groups={0: ("world", (0, 1))})
    with TraceReader(good) as t:
        assert t.meta["complete_simulation"] is True
        assert len(t.ops(0)) == len(streams[0])

    # an engine that never reports one op (as GROUP_START once was): the prefix stops there
    class Dropping(Recorder):
        def emitter(self, rank):
            append = super().emitter(rank)
            return lambda item: None if item[1].kind == K.GROUP_START else append(item)

    _, rec = run_recorded(streams, Dropping)
    missing = rec.missing()
    first_group = next(i for i, op in enumerate(streams[0]) if op.kind == K.GROUP_START)
    assert missing == {0: len(streams[0]) - first_group, 1: len(streams[1]) - first_group}

    # the same engine behind a written trace: it holds the prefix and says the simulation is not complete
    import phantora.simulate as simulate
    original = simulate.Recorder
    simulate.Recorder = Dropping
    try:
        cut = tmp_path / "cut.h5"
        simulate.simulate_streams(spec, streams, cut, groups={0: ("world", (0, 1))})
    finally:
        simulate.Recorder = original
    with TraceReader(cut) as t:
        assert len(t.ops(0)) == first_group
        assert t.meta["complete_simulation"] is False
