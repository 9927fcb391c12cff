"""Pieces of the rank-side stubs that run without torch: allocator model, LocalRuntime timelines, clock, config,
and the build of the fake CUDA library. Nothing here loads the library or patches this process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from phantora.engine.ops import Memcpy, Op, OpKind

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "stubs"))

from phantora_stubs import build  # noqa: E402
from phantora.errors import PhantoraError, SimulationError  # noqa: E402
from phantora.engine.allocator import (AllocatorConfig, CachingAllocatorModel, DeviceOutOfMemory,  # noqa: E402
                                       round_block)
from phantora_stubs.clock import CpuMeter, VirtualClock  # noqa: E402
from phantora_stubs.config import StubConfig  # noqa: E402
from phantora_stubs.errors import StubBuildError, StubConfigError  # noqa: E402
from phantora_stubs.runtime import LocalRuntime, local_cluster  # noqa: E402

MiB = 1 << 20


# ---- allocator -------------------------------------------------------------------------------------------------------

def test_block_rounding_follows_the_cuda_caching_allocator():
    # c10/cuda/CUDACachingAllocator.cpp: round_size() returns kMinBlockSize (512) for smaller requests and
    # otherwise rounds up to a multiple of kMinBlockSize.
    assert round_block(0) == 512
    assert round_block(1) == 512
    assert round_block(512) == 512
    assert round_block(513) == 1024
    assert round_block(10 * MiB + 1) == 10 * MiB + 512


def test_allocator_counts_peaks_and_frees():
    a = CachingAllocatorModel(1 << 30)
    a.alloc(1000, 1)
    a.alloc(3 * MiB, 2)
    assert a.allocated.current == 1024 + 3 * MiB
    a.free(1)
    assert a.allocated.current == 3 * MiB
    assert a.allocated.peak == 1024 + 3 * MiB
    assert a.free(1) == 0                                   # unknown / already freed ids are ignored
    a.reset_peak()
    assert a.allocated.peak == 3 * MiB
    assert a.stats["allocation.all.current"] == 1


def test_reserved_is_cached_until_empty_cache():
    # segment sizes of c10/cuda/CUDACachingAllocator.cpp: 2 MiB small-pool segments (blocks <= 1 MiB), 20 MiB
    # for large blocks under 10 MiB, larger ones rounded up to 2 MiB
    a = CachingAllocatorModel(1 << 30)
    a.alloc(3 * MiB, 1)
    assert a.reserved.current == 20 * MiB
    a.alloc(1000, 2)
    assert a.reserved.current == 22 * MiB
    a.alloc(17 * MiB + 1, 3)                                # more than the 17 MiB left in the first segment
    assert a.reserved.current == 22 * MiB + 18 * MiB
    a.free(1)
    a.free(3)
    assert a.reserved.current == 40 * MiB                   # the caching allocator keeps the segments
    a.empty_cache()
    assert a.reserved.current == 2 * MiB                    # the small segment still holds a live block
    assert a.reserved.peak == 40 * MiB


def test_cached_blocks_are_split_and_kept_per_stream():
    a = CachingAllocatorModel(1 << 30)
    a.alloc(3 * MiB, 1)                                     # a 20 MiB segment, 17 MiB of it cached free
    a.alloc(8 * MiB, 2)                                     # fits in the rest of that segment
    assert a.reserved.current == 20 * MiB
    a.alloc(8 * MiB, 3, stream=7)                           # another stream does not take this stream's blocks
    assert a.reserved.current == 40 * MiB
    a.free(2)
    a.alloc(8 * MiB, 4)                                     # the freed block is reused on its own stream
    assert a.reserved.current == 40 * MiB
    assert a.stats["segment.all.current"] == 2


def test_expandable_segments_map_pages_and_unmap_free_ones():
    a = CachingAllocatorModel(1 << 30, AllocatorConfig.parse("expandable_segments:True"))
    a.alloc(3 * MiB, 1)                                     # one 20 MiB page of the large pool's segment
    a.alloc(30 * MiB, 2)                                    # grows by one page into the 17 MiB left free
    assert a.reserved.current == 40 * MiB
    a.alloc(1000, 3)                                        # small pool: 2 MiB pages
    assert a.reserved.current == 42 * MiB
    a.free(2)
    a.empty_cache()                                         # whole free pages are unmapped
    assert a.reserved.current == 20 * MiB + 2 * MiB
    assert a.stats["segment.all.current"] == 0              # PyTorch counts no segments for expandable ones


def test_allocator_settings_are_read_like_pytorch():
    assert AllocatorConfig.from_env({}).expandable_segments is False
    assert AllocatorConfig.from_env({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}).expandable_segments
    assert AllocatorConfig.from_env({"PYTORCH_ALLOC_CONF": "max_split_size_mb:128,expandable_segments:True"}) \
        .expandable_segments
    with pytest.raises(PhantoraError, match="expandable_segments expects True or False"):
        AllocatorConfig.parse("expandable_segments:yes")
    with pytest.raises(PhantoraError, match="not 'key:value'"):
        AllocatorConfig.parse("expandable_segments")


def test_out_of_memory_when_live_blocks_exceed_capacity():
    a = CachingAllocatorModel(100 * MiB)
    a.alloc(60 * MiB, 1)
    with pytest.raises(DeviceOutOfMemory) as info:
        a.alloc(60 * MiB, 2)
    assert info.value.rounded == 60 * MiB and info.value.capacity == 100 * MiB
    assert a.stats["num_ooms"] == 1
    assert a.allocated.current == 60 * MiB                  # the failed request left no trace
    a.free(1)
    a.alloc(60 * MiB, 3)                                    # the cache is released before giving up


# ---- LocalRuntime ----------------------------------------------------------------------------------------------------
# LocalRuntime runs the engine in process (this rank simulated, the rest of its world mirroring it). The checks are
# physics of the timeline (causality, stream order, the host blocking where it must), the network's bandwidth bound
# for collectives, and identity with an Engine fed the same ops directly.

def kernel(stream: int, duration: float, cpu: float = 0.0) -> Op:
    return Op(OpKind.KERNEL, stream=stream, duration=duration, cpu_delta=cpu)


def d2h(stream: int, duration: float) -> Op:
    return Op(OpKind.MEMCPY, stream=stream, arg=int(Memcpy.D2H), duration=duration, nbytes=4)


def test_a_launch_starts_after_the_host_issued_it_and_lasts_its_cost():
    rt = LocalRuntime(capacity_bytes=1 << 30, launch_overhead_s=3e-6, record=True)
    issued = []
    for i, (dur, cpu) in enumerate([(1e-3, 0.0), (1e-5, 2e-3), (4e-4, 1e-6), (2e-3, 0.0)]):
        before = rt.now()
        rt.submit(kernel(i % 2, dur, cpu))
        issued.append(rt.now())
        assert issued[-1] >= before + cpu + 3e-6 * (1 - 1e-9)     # the framework's time and the launch's, at least
    rt.wait(Op(OpKind.SYNC_DEVICE))
    for (start, end), op, t in zip(rt.op_times, rt.ops, issued):
        assert start >= t * (1 - 1e-12)                          # no kernel runs before the host launched it
        # and it runs its cost, longer only while a kernel of the other stream shares the GPU (docs/cost-model.md,
        # "Streams of one GPU": at most the largest [streams] factor over the time they overlap)
        assert op.duration * (1 - 1e-9) <= end - start <= op.duration * 3.47 * (1 + 1e-9)


def test_one_stream_runs_in_program_order_while_the_host_runs_ahead():
    rt = LocalRuntime(capacity_bytes=1 << 30, launch_overhead_s=1e-6, record=True)
    for dur in (1e-3, 5e-4, 2e-3):
        rt.submit(kernel(0, dur))
    ahead = rt.now()
    t = rt.wait(Op(OpKind.SYNC_DEVICE))
    times = rt.op_times[:3]
    assert all(b[0] >= a[1] for a, b in zip(times, times[1:]))  # FIFO, no overlap
    assert ahead < times[-1][1]                                 # launches do not wait for the GPU
    assert t == pytest.approx(max(ahead, times[-1][1]))          # the sync ends when the GPU does, not before
    assert t >= sum(e - s for s, e in times)


def test_streams_overlap_until_an_event_orders_them():
    rt = LocalRuntime(capacity_bytes=1 << 30, launch_overhead_s=0.0, record=True)
    rt.submit(kernel(1, 5e-3))
    rt.submit(kernel(2, 5e-3))
    rt.submit(kernel(1, 2e-3))
    rt.submit(Op(OpKind.EVENT_RECORD, stream=1, arg=7))
    rt.submit(Op(OpKind.STREAM_WAIT, stream=2, arg=7))
    rt.submit(kernel(2, 1e-3))
    end = rt.wait(Op(OpKind.SYNC_STREAM, stream=2))
    (a0, a1), (b0, b1), (_, c1), (rec, _), _, (d0, d1) = rt.op_times[:6]
    assert a0 < b1 and b0 < a1                                  # the two streams ran side by side
    assert rt.event_time(7) == pytest.approx(rec) and rec >= c1  # the event completes after stream 1's work
    assert d0 >= rec                                            # stream 2 waited for it
    assert end >= d1


def test_host_time_counts_and_an_event_on_an_idle_stream_completes_when_recorded():
    rt = LocalRuntime(capacity_bytes=1 << 30, launch_overhead_s=0.0)
    t0 = rt.now()
    rt.advance_cpu(1.0)
    assert rt.now() >= t0 + 1.0
    rt.submit(Op(OpKind.EVENT_RECORD, stream=0, arg=1, cpu_delta=0.5))
    assert rt.event_time(1) >= t0 + 1.5
    assert rt.event_time(1) == pytest.approx(rt.now())
    assert rt.wait(Op(OpKind.SYNC_EVENT, arg=1)) == pytest.approx(rt.event_time(1))
    assert rt.event_time(99) is None                            # never recorded


def test_a_device_to_host_copy_blocks_the_host_until_its_stream_is_done():
    rt = LocalRuntime(capacity_bytes=1 << 30, launch_overhead_s=1e-6, record=True)
    rt.submit(kernel(0, 2e-3))
    rt.submit(kernel(1, 9e-3))                                  # another stream: not waited for
    t = rt.wait(d2h(0, 1e-5))
    (_, k_end), (_, other_end), (c0, c1) = rt.op_times[:3]
    assert c0 >= k_end and c1 - c0 == pytest.approx(1e-5)
    assert t >= c1 and t < other_end
    rt.submit(d2h(1, 1e-5))                                     # submitted, it blocks just the same
    assert rt.now() >= other_end + 1e-5


def test_a_lone_ranks_collective_orders_its_streams():
    """comm.launch's pattern: the collective waits for the issuing stream, and the stream waits for it."""
    rt = LocalRuntime(capacity_bytes=1 << 30, launch_overhead_s=1e-6, record=True)
    rt.register_group(0, [0], "world")
    for op in (kernel(0, 2e-3), Op(OpKind.EVENT_RECORD, stream=0, arg=1), Op(OpKind.STREAM_WAIT, stream=5, arg=1),
               Op(OpKind.COLLECTIVE, stream=5, name="all_reduce", group=0, nbytes=1 << 20),
               Op(OpKind.EVENT_RECORD, stream=5, arg=2), Op(OpKind.STREAM_WAIT, stream=0, arg=2), kernel(0, 1e-3)):
        rt.submit(op)
    rt.wait(Op(OpKind.SYNC_DEVICE))
    (_, k_end), _, _, (c0, c1), _, _, (n0, _) = rt.op_times[:7]
    assert c0 >= k_end and c1 >= c0
    assert n0 >= c1
    assert rt.group_size(0) == 1


def test_collectives_in_a_mirrored_world_take_the_networks_time():
    """A world of 8 on one HGX node: each rank of an all-gather receives 7 of the 8 shards, so the collective takes
    at least 7 x shard bytes over a GPU's NVLink bandwidth; twice the bytes never take less time."""
    rt = LocalRuntime(capacity_bytes=1 << 34, rank=3, world_size=8, local_rank=3, launch_overhead_s=0.0, record=True)
    assert rt.cluster.world_size == 8 and rt.cluster.nodes == 1
    rt.register_group(0, list(range(8)), "world")
    durations = []
    for shard in (64 << 20, 128 << 20):
        rt.submit(Op(OpKind.COLLECTIVE, stream=5, name="all_gather", group=0, nbytes=shard))
        rt.wait(Op(OpKind.SYNC_STREAM, stream=5))
        start, end = rt.op_times[-2]
        durations.append(end - start)
        assert end - start >= 7 * shard / rt.cluster.intra.gpu_nvlink_bytes_per_s
    assert durations[1] >= durations[0]
    assert rt.exchange(0, "sum", [1.0], Op(OpKind.SYNC_STREAM, stream=5)) == [8.0]    # each member mirrors it


def _same_ops(world: int) -> list[Op]:
    return [kernel(0, 1e-3, 1e-5), Op(OpKind.EVENT_RECORD, stream=0, arg=1), Op(OpKind.STREAM_WAIT, stream=5, arg=1),
            Op(OpKind.COLLECTIVE, stream=5, name="reduce_scatter", group=0, nbytes=world << 22, cpu_delta=2e-6),
            Op(OpKind.EVENT_RECORD, stream=5, arg=2), kernel(0, 3e-4), Op(OpKind.STREAM_WAIT, stream=0, arg=2),
            kernel(0, 2e-4, 4e-6), Op(OpKind.ALLOC, stream=0, nbytes=1 << 20, arg=1), d2h(0, 1e-6),
            Op(OpKind.ITER_MARK, arg=1), kernel(1, 1e-3), Op(OpKind.SYNC_DEVICE, cpu_delta=1e-6)]


@pytest.mark.parametrize("world", [1, 8])
def test_local_runtime_times_are_the_engines(world):
    """The same ops fed to an Engine directly, as the engine server feeds it, come out at the same times."""
    from phantora.engine.core import Engine

    rt = LocalRuntime(capacity_bytes=1 << 34, world_size=world, launch_overhead_s=2e-6, record=True)
    for op in _same_ops(world):
        rt.submit(op)
    rt.close()
    got = sorted((i, s, e) for i, (s, e) in enumerate(rt.op_times))
    reports: list[tuple] = []
    engine = Engine(rt.cluster, simulated=[0], rank_map=[0] * world, launch_overhead_s=2e-6, cpu_time_scale=1.0,
                    vram_bytes=1 << 34, sink=lambda rank, idx, op, issue, start, end, coll: reports.append(
                        (idx, start, end)))
    engine.feed(0, _same_ops(world))
    engine.close(0)
    assert engine.run()
    assert got == sorted(reports)
    if world > 1:                                               # the collective held its stream's reports back
        assert [r[0] for r in reports] != sorted(r[0] for r in reports)
    assert len(got) == len(_same_ops(world))


def test_the_op_log_is_in_program_order(tmp_path):
    log = tmp_path / "ops.jsonl"
    rt = LocalRuntime(capacity_bytes=1 << 34, world_size=8, launch_overhead_s=1e-6, oplog=str(log))
    ops = _same_ops(8)
    for op in ops:
        rt.submit(op)
    rt.close()
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [d["kind"] for d in lines] == [OpKind(op.kind).name for op in ops]
    assert all(d["end"] >= d["start"] for d in lines)


def test_a_host_sync_that_can_never_complete_is_a_deadlock():
    rt = LocalRuntime(capacity_bytes=1 << 30)
    rt.submit(Op(OpKind.RECV, stream=4, group=0, arg=0, nbytes=16))   # from itself: no send will ever come
    with pytest.raises(SimulationError, match="stuck"):
        rt.wait(Op(OpKind.SYNC_DEVICE))


def test_a_send_to_itself_in_a_group_meets_the_matching_receive():
    """batch_isend_irecv to and from the rank itself (a world of one): the k-th send meets the k-th receive."""
    rt = LocalRuntime(capacity_bytes=1 << 30, record=True)
    for _ in range(2):
        for op in (Op(OpKind.GROUP_START), Op(OpKind.SEND, stream=4, group=0, arg=0, nbytes=40),
                   Op(OpKind.RECV, stream=4, group=0, arg=0, nbytes=40), Op(OpKind.GROUP_END)):
            rt.submit(op)
    t = rt.wait(Op(OpKind.SYNC_DEVICE))
    ends = [e for op, (_, e) in zip(rt.ops, rt.op_times) if op.kind == OpKind.GROUP_END]
    assert len(ends) == 2 and ends[1] >= ends[0] and t >= ends[1]


def test_register_group_rejects_conflicting_ranks():
    rt = LocalRuntime(capacity_bytes=1 << 30, world_size=4)
    rt.register_group(1, [0, 2], "a")
    rt.register_group(1, [0, 2], "a")
    with pytest.raises(SimulationError):
        rt.register_group(1, [0, 1], "b")
    with pytest.raises(SimulationError):
        rt.register_group(2, [0, 4], "outside")
    assert rt.group_size(1) == 2 and rt.group_size(0) == 4
    assert rt.intern_signature("x") == rt.intern_signature("x") != rt.intern_signature("y")


def test_local_cluster_is_the_configured_world():
    assert local_cluster().world_size == 1
    spec = local_cluster(16, 8, "h100-sxm-80gb")
    assert (spec.nodes, spec.gpus_per_node) == (2, 8)
    with pytest.raises(StubConfigError):
        local_cluster(12, 8)
    with pytest.raises(StubConfigError):
        LocalRuntime(capacity_bytes=1 << 30, world_size=2, cluster=local_cluster(4))


# ---- clock -----------------------------------------------------------------------------------------------------------

class _Clockless:
    def __init__(self):
        self.t = 0.0

    def now(self):
        return self.t

    def advance_cpu(self, s):
        self.t += s


def _burn(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_meter_charges_framework_time_but_not_stub_time():
    meter = CpuMeter()
    meter.enter()
    meter.exit()
    _burn(0.02)                                             # the framework's work
    meter.enter()
    framework = meter.claim()
    _burn(0.02)                                             # the stubs' own work
    meter.exit()
    meter.enter()
    after = meter.claim()
    meter.exit()
    assert 0.015 <= framework <= 0.2
    assert after < 0.01


def test_virtual_clock_sleep_and_epoch():
    rt = _Clockless()
    clock = VirtualClock(lambda: rt, epoch=1000.0)
    t0 = clock.perf_counter()
    wall = time.monotonic()
    clock.sleep(100.0)
    assert clock.perf_counter() - t0 >= 100.0
    assert time.monotonic() - wall < 5.0
    assert clock.time() == pytest.approx(1000.0 + clock.now(), abs=1e-3)
    with pytest.raises(ValueError):
        clock.sleep(-1)


# ---- config ----------------------------------------------------------------------------------------------------------

def test_config_errors_name_the_variable(monkeypatch):
    for k in list(os.environ):
        if k.startswith("PHANTORA_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("PHANTORA_RANK", "3")
    monkeypatch.setenv("PHANTORA_WORLD_SIZE", "2")
    with pytest.raises(StubConfigError, match="PHANTORA_RANK=3"):
        StubConfig.from_env()
    monkeypatch.setenv("PHANTORA_WORLD_SIZE", "16")
    monkeypatch.setenv("PHANTORA_VRAM_BYTES", "lots")
    with pytest.raises(StubConfigError, match="PHANTORA_VRAM_BYTES"):
        StubConfig.from_env()
    monkeypatch.delenv("PHANTORA_VRAM_BYTES")
    cfg = StubConfig.from_env()
    assert (cfg.rank, cfg.world_size, cfg.local_rank, cfg.runtime) == (3, 16, 3, "local")


# ---- building the fake CUDA library ----------------------------------------------------------------------------------

def test_missing_compiler_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CXX", raising=False)
    with pytest.raises(StubBuildError, match="C\\+\\+ compiler"):
        build.find_compiler()


def test_fake_cuda_mode_is_validated(monkeypatch):
    cpu_only = build.TorchInstall(root=Path("/nonexistent"), version="0", cuda_build=False)
    cuda = build.TorchInstall(root=Path("/nonexistent"), version="0", cuda_build=True)
    monkeypatch.delenv("PHANTORA_FAKE_CUDA", raising=False)
    assert build.wanted(cpu_only) and build.wanted(cuda)
    monkeypatch.setenv("PHANTORA_FAKE_CUDA", "cpu-only")
    assert build.wanted(cpu_only) and not build.wanted(cuda)
    monkeypatch.setenv("PHANTORA_FAKE_CUDA", "sometimes")
    with pytest.raises(StubBuildError, match="PHANTORA_FAKE_CUDA"):
        build.wanted(cuda)


def test_cache_key_depends_on_torch_install_and_source(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    t = build.find_torch()
    p = build.library_path(t)
    assert p.parent == tmp_path / "phantora"
    other = build.TorchInstall(root=t.root, version=t.version + ".other", cuda_build=False)
    assert build.library_path(other) != p


def test_concurrent_builds_are_atomic(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PHANTORA_")}
    env.update(XDG_CACHE_HOME=str(tmp_path), PYTHONPATH=f"{ROOT / 'stubs'}{os.pathsep}{ROOT}")
    env.pop("PHANTORA_FAKE_CUDA", None)
    code = ("from phantora_stubs import build; lib = build.ensure_fake_cuda(); "
            "print(lib.phantora_guard_installed(), lib.phantora_device_count())")
    procs = [subprocess.Popen([sys.executable, "-c", code], env={**env, "PHANTORA_LOCAL_DEVICES": "4"},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
        assert out.split() == ["1", "4"]
    files = list((tmp_path / "phantora").iterdir())
    assert [f.suffix for f in files] == [".so"] and files[0].read_bytes()[:4] == b"\x7fELF"
    mtime = files[0].stat().st_mtime_ns
    again = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and files[0].stat().st_mtime_ns == mtime      # reused, not rebuilt


def test_fake_cuda_library_exports_only_its_c_functions(stub_cache):
    """The library is loaded RTLD_GLOBAL before torch: a C++ symbol it defined (a standard-library template
    instantiation) would take the place of libtorch's own copy. Only the phantora_* functions may be exported."""
    import shutil

    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("needs nm (binutils)")
    lib = next((stub_cache / "phantora").glob("fake_cuda-*.so"))
    out = subprocess.run([nm, "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True).stdout
    names = [line.split()[-1] for line in out.splitlines() if line.strip()]
    exported = {n for n in names if not n.startswith("_init") and not n.startswith("_fini")}
    assert exported and all(n.startswith("phantora_") for n in exported), sorted(exported)[:20]
    assert {"phantora_force_guard", "phantora_get_stream", "phantora_set_stream"} <= exported


@pytest.mark.parametrize("gpu, threads, smem_sm, smem_block", [
    # CUDA C++ Programming Guide, "Technical Specifications per Compute Capability": 8.0 (A100) 2048 resident threads
    # and 164 KB shared memory per SM, 163 KB per block opted in; 8.6 (RTX 3090) 1536, 100 KB, 99 KB; 9.0 (H100)
    # 2048, 228 KB, 227 KB
    ("a100-sxm-80gb", 2048, 164 * 1024, 163 * 1024),
    ("rtx-3090", 1536, 100 * 1024, 99 * 1024),
    ("h100-sxm-80gb", 2048, 228 * 1024, 227 * 1024),
])
def test_device_properties_follow_the_compute_capability(gpu, threads, smem_sm, smem_block):
    from phantora.gpus import load_gpu
    from phantora_stubs.cuda_device import _DeviceProperties
    props = _DeviceProperties(load_gpu(gpu), 80 << 30, 0)
    assert (props.max_threads_per_multi_processor, props.shared_memory_per_multiprocessor,
            props.shared_memory_per_block_optin) == (threads, smem_sm, smem_block)


def test_cuda_build_refuses_a_real_copy_to_the_device_with_a_message():
    """On a CUDA build of torch (torch 2.11.0+cu130, an H200 host), DTensor's random-number tracker reached the
    fake mode with `aten.to.dtype_layout` of the host generator state to `cuda:1`; the fake mode ran it for real and
    torch stopped on an internal assertion of the real CUDA allocator. The rank now stops with a message that names
    the cause and the remedy; other ops, and copies of fake tensors, pass through."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PHANTORA_")}
    env["PYTHONPATH"] = f"{ROOT / 'stubs'}{os.pathsep}{ROOT}"
    code = """
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from phantora_stubs.fake import _moves_host_tensor_to_device as moves, _no_real_device_copies
aten = torch.ops.aten
host = torch.zeros(16, dtype=torch.uint8)
assert moves(aten.to.dtype_layout, (host,), {"dtype": torch.uint8, "device": torch.device("cuda", 1)})
assert moves(aten.to.device, (host, torch.device("cuda", 0), torch.uint8), {})
assert not moves(aten.to.dtype_layout, (host,), {"device": torch.device("cpu")})
assert not moves(aten._to_copy.default, (host,), {"device": torch.device("cuda", 0)})
with FakeTensorMode() as mode:
    fake = torch.empty(4)
assert not moves(aten.to.dtype_layout, (fake,), {"device": torch.device("cuda", 0)})
wrapped = _no_real_device_copies(lambda self, func, types, args, kwargs: "ran")
assert wrapped(None, aten.add.Tensor, (), (host, host), {}) == "ran"
assert wrapped(None, aten.to.dtype_layout, (), (fake,), {"device": torch.device("cuda", 0)}) == "ran"
try:
    wrapped(None, aten.to.dtype_layout, (), (host,), {"device": torch.device("cuda", 1)})
except RuntimeError as e:
    print(e)
else:
    raise SystemExit("not refused")
"""
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "CUDA build" in out.stdout and "pip install torch==2.13.0" in out.stdout and "docs/stubs.md" in out.stdout


def test_pipeline_layout_check_against_the_auto_plan(monkeypatch):
    """`--ranks auto` with P stages runs rank s*W/P as stage s; a program that says otherwise (another stage, another
    number of stages) is stopped; plans other than auto are not checked."""
    from phantora_stubs import pipeline_layout as pl
    from phantora_stubs.errors import UnsupportedOpError

    monkeypatch.setenv("PHANTORA_WORLD_SIZE", "8")
    monkeypatch.setenv("PHANTORA_RANKS_PLAN", "auto:2")
    monkeypatch.setenv("PHANTORA_RANK", "4")
    pl.check(1, 2, "here")                                   # rank 4 of 8 with 2 stages: stage 1
    with pytest.raises(UnsupportedOpError, match="rank 4 is stage 0"):
        pl.check(0, 2, "here")
    with pytest.raises(UnsupportedOpError, match="runs 4 pipeline stage"):
        pl.check(2, 4, "here")
    monkeypatch.setenv("PHANTORA_RANKS_PLAN", "all")
    pl.check(0, 2, "here")
    monkeypatch.setenv("PHANTORA_RANKS_PLAN", "auto:1")
    monkeypatch.setenv("PHANTORA_RANK", "0")
    with pytest.raises(UnsupportedOpError, match="pass --pp-degree 2"):
        pl.check(0, 2, "here")


def test_the_clock_goes_on_in_real_time_once_the_engine_is_gone():
    """An exit handler (multiprocessing's manager finalizer, atexit hooks) reads the clock after the engine has
    closed the connection: it gets the virtual time reached, advancing at the real rate, not EngineGone."""
    from phantora_stubs.clock import VirtualClock
    from phantora_stubs.errors import EngineGone

    class Runtime:
        gone = False

        def advance_cpu(self, seconds):
            pass

        def now(self):
            if self.gone:
                raise EngineGone("rank 0: the phantora engine is gone (handle is closed)")
            return 12.5

    rt = Runtime()
    clock = VirtualClock(lambda: rt, epoch=1000.0)
    assert clock.now() == 12.5
    rt.gone = True
    a = clock.now()
    time.sleep(0.01)
    b = clock.now()
    assert 12.5 <= a < b and b - a >= 0.009
    assert clock.time() >= 1012.5
