"""The engine against timelines computed by hand and against the network model run on its own."""

import random

import pytest

from phantora.cluster import load_cluster
from phantora.engine.core import Engine
from phantora.engine.ops import Memcpy, Op, OpKind as K
from phantora.errors import SimulationError
from phantora.net.network import Network

MiB = 2**20
SIDE_BY_SIDE_OFF = tuple(f"streams.{k}=1" for k in ("compute_beside_compute", "compute_beside_memory",
                                                     "memory_beside_compute", "memory_beside_memory"))


def run(spec, streams, groups=(), order=None, **kw):
    recs = []
    eng = Engine(spec, sink=lambda *a: recs.append(a), **kw)
    for gid, ranks in groups:
        eng.add_group(gid, ranks)
    ranks = list(streams)
    for r in (order or ranks):
        eng.feed(r, streams[r])
        eng.close(r)
    assert eng.run()
    return eng, recs


def by_rank(recs, rank):
    return sorted((r for r in recs if r[0] == rank), key=lambda r: r[1])


def test_kernels_on_one_stream_run_back_to_back_after_launch():
    spec = load_cluster("h100-hgx")
    launch = spec.host.launch_overhead_us * 1e-6
    ops = [Op(K.KERNEL, duration=1e-3, cpu_delta=1e-6) for _ in range(3)] + [Op(K.SYNC_DEVICE)]
    eng, recs = run(spec, {0: ops}, simulated=[0])
    k = by_rank(recs, 0)
    assert k[0][4] == pytest.approx(1e-6 + launch)          # first kernel starts when launched
    assert k[2][5] == pytest.approx(1e-6 + launch + 3e-3)   # GPU-bound afterwards
    assert eng.ranks[0].cpu == pytest.approx(k[2][5])       # the sync waits for the stream


def test_a_generated_kernel_charges_its_launch_and_the_compiled_calls_it_opens():
    from phantora.engine.ops import generated_kernel_arg
    spec = load_cluster("h100-hgx")
    h = spec.host
    ops = [Op(K.KERNEL, duration=1e-9, arg=generated_kernel_arg(2)),   # after two calls began (forward, backward)
           Op(K.KERNEL, duration=1e-9, arg=generated_kernel_arg(0)),   # the same call's next generated kernel
           Op(K.KERNEL, duration=1e-9),                                 # an aten kernel (an extern kernel, eager)
           Op(K.SYNC_DEVICE)]
    eng, recs = run(spec, {0: ops}, simulated=[0])
    k = by_rank(recs, 0)
    assert k[0][3] == pytest.approx((h.launch_overhead_us + h.generated_launch_us + 2 * h.compiled_call_us) * 1e-6)
    assert k[1][3] - k[0][3] == pytest.approx((h.launch_overhead_us + h.generated_launch_us) * 1e-6)
    assert k[2][3] - k[1][3] == pytest.approx(h.launch_overhead_us * 1e-6)


def test_streams_overlap_and_events_order_them():
    # the order alone: kernels of two streams side by side at their full speed (no sharing of the GPU)
    spec = load_cluster("h100-hgx", overrides=SIDE_BY_SIDE_OFF)
    ops = [Op(K.KERNEL, stream=0, duration=2e-3), Op(K.EVENT_RECORD, stream=0, arg=1),
           Op(K.KERNEL, stream=1, duration=1e-3),                    # independent: overlaps
           Op(K.STREAM_WAIT, stream=1, arg=1), Op(K.KERNEL, stream=1, duration=1e-3),  # after stream 0's kernel
           Op(K.SYNC_DEVICE)]
    eng, recs = run(spec, {0: ops}, simulated=[0])
    k = by_rank(recs, 0)
    first, second_on_1, after_wait = k[0], k[2], k[4]
    assert second_on_1[4] < first[5]                     # ran concurrently
    assert after_wait[4] == pytest.approx(first[5])      # waited for the event
    assert eng.ranks[0].cpu == pytest.approx(first[5] + 1e-3)


def _gemms_and_copies(gpu, streams: int, per_stream: int, kind: str):
    """Kernels of one kind on `streams` streams, issued stream after stream (as a program issues them), each
    costed alone at 80% of the GPU's bf16 peak (a GEMM) or 90% of its HBM bandwidth (a copy), 1 ms each."""
    ops = []
    for s in range(streams):
        for _ in range(per_stream):
            if kind == "gemm":
                ops.append(Op(K.KERNEL, stream=s, duration=1e-3, flops=int(0.8 * gpu.peak_flops("bf16") * 1e-3),
                              nbytes=3 * 2 * 8192 ** 2))
            else:
                ops.append(Op(K.KERNEL, stream=s, duration=1e-3, nbytes=int(0.9 * gpu.hbm_bytes_per_s * 1e-3)))
    return ops + [Op(K.SYNC_DEVICE)]


@pytest.mark.parametrize("kind", ["gemm", "copy"])
def test_kernels_of_two_streams_side_by_side_do_not_beat_the_gpu(kind):
    """Two streams of GEMMs (or copies) that each alone run the GPU at 80% of its peak FLOP/s (90% of its HBM
    bandwidth) cannot together run it above 100%: side by side they share it. Without the sharing the engine
    gave 160% (180%). Issued one stream after the other, as `with torch.cuda.stream(s): ...` blocks issue them."""
    spec = load_cluster("h100-hgx")
    gpu = spec.gpu_spec()
    ops = _gemms_and_copies(gpu, 2, 5, kind)
    eng, recs = run(spec, {0: ops}, simulated=[0])
    span = eng.ranks[0].cpu - min(r[4] for r in recs if r[0] == 0)
    work = sum(o.flops for o in ops) / gpu.peak_flops("bf16") if kind == "gemm" else \
        sum(o.nbytes for o in ops) / gpu.hbm_bytes_per_s
    assert work / span <= 1.0, (work, span)
    assert span < sum(o.duration for o in ops) * 1.01       # and they do share it: not one after the other plus
    off = load_cluster("h100-hgx", overrides=SIDE_BY_SIDE_OFF)
    eng_off, recs_off = run(off, {0: ops}, simulated=[0])
    assert eng_off.ranks[0].cpu - min(r[4] for r in recs_off) == pytest.approx(5e-3, rel=0.01)


def test_short_kernels_beside_a_stream_neither_slow_nor_are_slowed():
    """Kernels under `streams.min_us` fill a part of the GPU (a 4 µs add beside an 8192³ GEMM took x1.00 of the
    GEMM's time on an H200, groundtruth/streams/): they run beside the others at full speed."""
    spec = load_cluster("h100-hgx")
    gpu = spec.gpu_spec()
    gemms = _gemms_and_copies(gpu, 1, 5, "gemm")[:-1]
    short = [Op(K.KERNEL, stream=1, duration=5e-6, nbytes=int(0.9 * gpu.hbm_bytes_per_s * 5e-6)) for _ in range(200)]
    eng, recs = run(spec, {0: gemms + short + [Op(K.SYNC_DEVICE)]}, simulated=[0])
    k = by_rank(recs, 0)
    assert k[4][5] - k[0][4] == pytest.approx(5e-3)          # the GEMMs' stream as alone
    assert all(r[5] - r[4] == pytest.approx(5e-6) for r in k[5:205])


def test_collective_starts_when_the_last_rank_arrives_and_lasts_what_the_network_says():
    spec = load_cluster("h100-hgx")
    streams = {r: [Op(K.KERNEL, duration=1e-3 * (r + 1)),
                   Op(K.COLLECTIVE, name="all_reduce", group=0, nbytes=64 * MiB), Op(K.SYNC_DEVICE)] for r in range(8)}
    eng, recs = run(spec, streams)
    alone, _ = Network(spec).time_alone("all_reduce", tuple(range(8)), 64 * MiB)
    c = eng.collectives[0]
    slowest_kernel_end = max(r[5] for r in recs if r[2].kind == K.KERNEL)
    assert c["start"] == pytest.approx(slowest_kernel_end)
    assert c["end"] - c["start"] == pytest.approx(alone, rel=1e-9)


def test_result_does_not_depend_on_reporting_order():
    spec = load_cluster("h100-hgx", nodes=2)
    rng = random.Random(0)

    def streams():
        out = {}
        for r in range(16):
            ops = []
            for i in range(20):
                ops.append(Op(K.KERNEL, duration=rng.uniform(1e-5, 1e-3), cpu_delta=rng.uniform(0, 1e-5)))
                if i % 4 == 0:
                    ops.append(Op(K.COLLECTIVE, name="all_gather", group=1 + r // 8, nbytes=MiB))
                if i % 7 == 0:
                    ops.append(Op(K.COLLECTIVE, name="all_reduce", group=0, nbytes=8 * MiB, stream=1))
            ops.append(Op(K.SYNC_DEVICE))
            out[r] = ops
        return out

    base = streams()
    groups = [(1, range(8)), (2, range(8, 16))]
    _, a = run(spec, base, groups)
    rng.seed(0)
    _, b = run(spec, streams(), groups, order=list(reversed(range(16))))
    key = lambda r: (r[0], r[1])
    assert [(x[0], x[1], x[3], x[4], x[5]) for x in sorted(a, key=key)] == \
           [(x[0], x[1], x[3], x[4], x[5]) for x in sorted(b, key=key)]


def test_concurrent_collectives_of_groups_sharing_links_contend():
    # two all-gathers over the same node's GPUs (two groups of the same 8 ranks) at the same time take about twice
    # as long as one alone: they share every NVLink
    spec = load_cluster("h100-hgx")
    one = {r: [Op(K.COLLECTIVE, name="all_gather", group=1, nbytes=256 * MiB), Op(K.SYNC_DEVICE)] for r in range(8)}
    two = {r: [Op(K.COLLECTIVE, name="all_gather", group=1, nbytes=256 * MiB, stream=0),
               Op(K.COLLECTIVE, name="all_gather", group=2, nbytes=256 * MiB, stream=1), Op(K.SYNC_DEVICE)]
           for r in range(8)}
    g = [(1, range(8)), (2, range(8))]
    e1, _ = run(spec, one, g)
    e2, _ = run(spec, two, g)
    t1 = e1.ranks[0].cpu
    t2 = e2.ranks[0].cpu
    assert t2 == pytest.approx(2 * t1, rel=0.05)


def test_representative_ranks_match_all_ranks_on_a_symmetric_workload():
    # 2 nodes; TP groups inside nodes, DP groups across; every rank runs the same program
    spec = load_cluster("h100-hgx", nodes=2)
    tp = [(1 + n, range(n * 8, n * 8 + 8)) for n in range(2)]
    dp = [(3 + i, (i, i + 8)) for i in range(8)]

    def program(r):
        tp_gid = 1 + r // 8
        dp_gid = 3 + r % 8
        ops = []
        for _ in range(3):
            ops += [Op(K.KERNEL, duration=2e-4, cpu_delta=5e-6),
                    Op(K.COLLECTIVE, name="all_reduce", group=tp_gid, nbytes=16 * MiB),
                    Op(K.KERNEL, duration=1e-4),
                    Op(K.COLLECTIVE, name="reduce_scatter", group=dp_gid, nbytes=64 * MiB, stream=1)]
        ops += [Op(K.SYNC_DEVICE), Op(K.ITER_MARK)]
        return ops

    full, _ = run(spec, {r: program(r) for r in range(16)}, tp + dp)
    # simulate rank 0..7 (node 0) only; node 1 mirrors node 0
    rank_map = [r % 8 for r in range(16)]
    rep, _ = run(spec, {r: program(r) for r in range(8)}, tp + dp, simulated=range(8), rank_map=rank_map)
    for r in range(8):
        assert rep.ranks[r].iterations == pytest.approx(full.ranks[r].iterations, rel=1e-12)
    # and with mirrored ranks' flows missing (a rank map that drops node 1's traffic) the answer would differ:
    # the DP reduce-scatters of node 1 share NICs only with node 0's, so check the shadow groups were used
    assert any(c["group"] >= 3 for c in rep.collectives)


def test_send_recv_pairs_match_and_take_link_time():
    spec = load_cluster("h100-hgx", nodes=2)
    size = 256 * MiB
    streams = {0: [Op(K.SEND, group=0, arg=8, nbytes=size), Op(K.SYNC_DEVICE)],
               8: [Op(K.KERNEL, duration=1e-3), Op(K.RECV, group=0, arg=0, nbytes=size), Op(K.SYNC_DEVICE)]}
    eng, recs = run(spec, streams, simulated=[0, 8])
    t_alone, _ = Network(spec).time_alone("send_recv", (0, 8), size)
    recv = [r for r in recs if r[0] == 8 and r[2].kind == K.RECV][0]
    assert recv[4] == pytest.approx(1e-3 + spec.host.launch_overhead_us * 1e-6)   # posted after the kernel
    assert eng.ranks[0].cpu == pytest.approx(recv[4] + t_alone, rel=1e-9)           # the sender waits for it


def test_batched_p2p_exchange_does_not_deadlock():
    spec = load_cluster("h100-hgx")
    prog = lambda me, peer: [Op(K.GROUP_START), Op(K.SEND, group=0, arg=peer, nbytes=MiB),
                             Op(K.RECV, group=0, arg=peer, nbytes=MiB), Op(K.GROUP_END), Op(K.SYNC_DEVICE)]
    eng, _ = run(spec, {0: prog(0, 1), 1: prog(1, 0)}, simulated=[0, 1])
    assert eng.ranks[0].cpu > 0


def test_mismatched_collectives_are_reported():
    spec = load_cluster("h100-hgx")
    streams = {r: [Op(K.COLLECTIVE, name="all_reduce" if r else "all_gather", group=0, nbytes=MiB)] for r in range(8)}
    with pytest.raises(SimulationError, match="mismatched collectives"):
        run(spec, streams)


def test_missing_rank_is_reported_as_stuck():
    spec = load_cluster("h100-hgx")
    streams = {r: ([Op(K.COLLECTIVE, name="all_reduce", group=0, nbytes=MiB)] if r else []) + [Op(K.SYNC_DEVICE)]
               for r in range(8)}
    with pytest.raises(SimulationError, match=r"waits for rank\(s\) \[0\]"):
        run(spec, streams)


def test_d2h_copy_blocks_the_host():
    spec = load_cluster("h100-hgx")
    ops = [Op(K.KERNEL, duration=5e-3), Op(K.MEMCPY, arg=Memcpy.D2H, nbytes=4, duration=2e-6), Op(K.CPU, cpu_delta=0)]
    eng, recs = run(spec, {0: ops}, simulated=[0])
    assert eng.ranks[0].cpu >= 5e-3


def test_allocator_reports_oom_beyond_vram():
    spec = load_cluster("h100-hgx")
    ops = [Op(K.ALLOC, arg=i, nbytes=30 * 2**30) for i in range(3)]
    eng, _ = run(spec, {0: ops}, simulated=[0])
    assert len(eng.ooms) == 1 and eng.ooms[0][1] == 2     # the third 30 GiB block does not fit in 80 GB


def _contended_program(r):
    """Collectives of concurrent groups that overlap in time (TP inside nodes on stream 0, DP across on stream 1,
    and a world all_reduce), with compute in between."""
    tp, dp = 1 + r // 8, 3 + r % 8
    ops = []
    for i in range(4):
        ops += [Op(K.KERNEL, duration=1e-4 * (1 + (r + i) % 3), cpu_delta=2e-6),
                Op(K.COLLECTIVE, name="all_reduce", group=tp, nbytes=8 * MiB),
                Op(K.COLLECTIVE, name="reduce_scatter", group=dp, nbytes=32 * MiB, stream=1),
                Op(K.KERNEL, duration=5e-5)]
        if i % 2:
            ops.append(Op(K.COLLECTIVE, name="all_gather", group=0, nbytes=MiB, stream=2))
    return ops + [Op(K.SYNC_DEVICE), Op(K.ITER_MARK)]


@pytest.mark.parametrize("representative", [False, True])
def test_idle_network_shortcut_matches_the_full_flow_simulation(monkeypatch, representative):
    """The engine's idle-network shortcut (collectives alone on the network complete at cached offsets, batches put
    on the flow simulator once anything else starts) gives the timeline of running every flow through the flow
    simulator, here with contention between groups and (representative ranks) shadow groups."""
    spec = load_cluster("h100-hgx", nodes=2)
    groups = [(1 + n, range(n * 8, n * 8 + 8)) for n in range(2)] + [(3 + i, (i, i + 8)) for i in range(8)]
    ranks = list(range(8)) if representative else list(range(16))
    kw = {"simulated": ranks, "rank_map": [r % 8 for r in range(16)]} if representative else {}
    results = {}
    for shortcut in (True, False):
        monkeypatch.setattr(Engine, "idle_shortcut", shortcut)
        eng, recs = run(spec, {r: _contended_program(r) for r in ranks}, groups, **kw)
        results[shortcut] = (eng, sorted(recs, key=lambda x: (x[0], x[1])))
        if shortcut:
            assert eng.net.batches_started > 0 and eng.net.batches_materialized > 0   # both paths taken
    (fast, a), (full, b) = results[True], results[False]
    assert [x[:2] for x in a] == [x[:2] for x in b]
    for x, y in zip(a, b):
        assert x[3:6] == pytest.approx(y[3:6], rel=1e-9, abs=1e-12)
    assert [c["end"] for c in fast.collectives] == pytest.approx([c["end"] for c in full.collectives], rel=1e-9)


def test_an_iteration_ends_when_the_gpu_finishes_the_work_issued_before_its_mark():
    """No host sync in the loop: the host runs ahead, and the iteration boundary is the GPU's completion of the
    step (what a synchronize after the optimizer step would return), so a GPU-bound loop's iterations last exactly
    its kernels; kernels issued after a mark do not delay it. (The two streams' kernels at full speed side by side:
    the iteration boundary alone.)"""
    spec = load_cluster("h100-hgx", overrides=SIDE_BY_SIDE_OFF)
    d = 5e-3                                      # far longer than the host's launch overhead
    step = [Op(K.KERNEL, stream=0, duration=d), Op(K.KERNEL, stream=7, duration=2 * d), Op(K.ITER_MARK)]
    eng, recs = run(spec, {0: step * 4}, simulated=[0])
    marks = eng.ranks[0].iterations
    assert len(marks) == 4
    # each mark waits for the longer (stream 7) kernel of its step; stream 7's first kernel starts once the host
    # has launched two kernels, then they run back to back
    launch = spec.host.launch_overhead_us * 1e-6
    for k, t in enumerate(marks):
        assert t == pytest.approx(2 * launch + (k + 1) * 2 * d, rel=1e-9)
    assert [b - a for a, b in zip(marks, marks[1:])] == pytest.approx([2 * d] * 3, rel=1e-9)
    # the host issued every mark long before
    issued = [r[4] for r in by_rank(recs, 0) if r[2].kind == K.ITER_MARK]
    assert max(issued) < marks[0]



def _sharing_program(alone: float):
    """Two ranks: a collective on stream 1 and, beside it on stream 0, a compute-bound kernel (a GEMM's FLOPs per
    byte), an HBM-bound one (a copy's) and a long compute-bound kernel that outlasts the collective."""
    def ops():
        return [Op(K.COLLECTIVE, stream=1, name="all_gather", group=0, nbytes=256 * MiB),
                Op(K.KERNEL, stream=0, duration=0.4 * alone, flops=1e12, nbytes=1e8),
                Op(K.KERNEL, stream=0, duration=0.3 * alone, flops=0.0, nbytes=1e9),
                Op(K.KERNEL, stream=0, duration=2.0 * alone, flops=1e12, nbytes=1e8),
                Op(K.SYNC_DEVICE)]
    return {0: ops(), 1: ops()}


def _two_gpus(**factors):
    spec = load_cluster("h200-2gpu-nvlink")
    for k, v in factors.items():
        setattr(spec.nccl, k, v)
    return spec


def test_a_collective_and_the_kernels_beside_it_slow_each_other_by_the_measured_factors():
    spec = _two_gpus()
    alone, _ = Network(spec).time_alone("all_gather", (0, 1), 256 * MiB)
    off_eng, off = run(_two_gpus(sharing_compute=1.0, sharing_memory=1.0, sharing_collective=1.0),
                       _sharing_program(alone))
    eng, _ = run(spec, _sharing_program(alone))
    cs, ce = off_eng.collectives[0]["start"], off_eng.collectives[0]["end"]
    assert ce - cs == pytest.approx(alone, rel=1e-9)           # without sharing: what the network says
    n = spec.nccl
    kernels = [r for r in by_rank(off, 0) if r[2].kind == K.KERNEL]
    overlap = [max(0.0, min(r[5], ce) - max(r[4], cs)) for r in kernels]
    assert all(o > 0 for o in overlap)                        # all three ran beside the collective
    factors = [n.sharing_compute, n.sharing_memory, n.sharing_compute]
    delay = sum(o * (f - 1) for o, f in zip(overlap, factors))
    busy = min(kernels[-1][5], ce) - max(kernels[0][4], cs)  # stream 0 was busy without a gap
    # the collective ends later by the time compute ran beside it times its factor less one ...
    assert eng.collectives[0]["end"] == pytest.approx(ce + busy * (n.sharing_collective - 1), rel=1e-9)
    # ... and the compute stream finishes later by each kernel's overlapped time times its factor less one
    assert eng.ranks[0].cpu == pytest.approx(max(kernels[-1][5] + delay, eng.collectives[0]["end"]), rel=1e-9)
    assert off_eng.ranks[0].cpu == pytest.approx(max(kernels[-1][5], ce), rel=1e-9)


def test_kernels_kept_for_streams_side_by_side_do_not_grow_with_the_run():
    """The engine keeps recent kernels to find those of other streams they overlap; a one-stream program (most)
    must not keep every kernel it ever ran (50,000 here, each ≥ streams.min_us)."""
    spec = load_cluster("h100-hgx")
    ops = [Op(K.KERNEL, duration=1e-4, cpu_delta=2e-4) for _ in range(50_000)] + [Op(K.SYNC_DEVICE)]
    eng, _ = run(spec, {0: ops}, simulated=[0])
    assert sum(len(v) for v in eng.ranks[0].side.values()) <= 64
