"""Pieces of the rank-side stubs that run without torch: allocator model, LocalRuntime timelines, clock, config,
and the build of the fake CUDA library. Nothing here loads the library or patches this process."""

from __future__ import annotations

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
from phantora.errors import PhantoraError  # noqa: E402
from phantora.engine.allocator import (AllocatorConfig, CachingAllocatorModel, DeviceOutOfMemory,  # noqa: E402
                                       round_block)
from phantora_stubs.clock import CpuMeter, VirtualClock  # noqa: E402
from phantora_stubs.config import StubConfig  # noqa: E402
from phantora_stubs.errors import StubBuildError, StubConfigError  # noqa: E402
from phantora_stubs.runtime import LocalRuntime  # noqa: E402

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

def kernel(stream: int, duration: float, cpu: float = 0.0) -> Op:
    return Op(OpKind.KERNEL, stream=stream, duration=duration, cpu_delta=cpu)


def test_kernels_on_one_stream_serialise_and_the_host_runs_ahead():
    rt = LocalRuntime(capacity_bytes=1 << 30, launch_overhead_s=1e-6, record=True)
    for _ in range(3):
        rt.submit(kernel(0, 1e-3))
    assert rt.now() == pytest.approx(3e-6)                  # launches are asynchronous
    t = rt.wait(Op(OpKind.SYNC_DEVICE))
    assert t == pytest.approx(1e-6 + 3e-3)                  # first launch, then three kernels back to back
    starts = [s for s, _ in rt.op_times[:3]]
    assert starts == sorted(starts) and starts[1] == pytest.approx(starts[0] + 1e-3)


def test_streams_overlap_until_an_event_orders_them():
    rt = LocalRuntime(capacity_bytes=1 << 30, launch_overhead_s=0.0)
    rt.submit(kernel(1, 5e-3))
    rt.submit(kernel(2, 5e-3))
    assert rt.wait(Op(OpKind.SYNC_DEVICE)) == pytest.approx(5e-3)      # concurrent
    rt.submit(kernel(1, 2e-3))
    rt.submit(Op(OpKind.EVENT_RECORD, stream=1, arg=7))
    rt.submit(Op(OpKind.STREAM_WAIT, stream=2, arg=7))
    rt.submit(kernel(2, 1e-3))
    assert rt.event_time(7) == pytest.approx(7e-3)
    assert rt.wait(Op(OpKind.SYNC_STREAM, stream=2)) == pytest.approx(8e-3)


def test_event_on_an_idle_stream_completes_when_recorded_and_cpu_delta_counts():
    rt = LocalRuntime(capacity_bytes=1 << 30, launch_overhead_s=0.0)
    rt.advance_cpu(1.0)
    rt.submit(Op(OpKind.EVENT_RECORD, stream=0, arg=1, cpu_delta=0.5))
    assert rt.event_time(1) == pytest.approx(1.5)
    assert rt.wait(Op(OpKind.SYNC_EVENT, arg=1)) == pytest.approx(1.5)


def test_blocking_copy_waits_for_the_stream_and_collectives_cost_nothing_locally():
    rt = LocalRuntime(capacity_bytes=1 << 30, launch_overhead_s=0.0)
    rt.submit(kernel(0, 2e-3))
    rt.submit(Op(OpKind.COLLECTIVE, stream=3, name="all_reduce", group=0, nbytes=1 << 20))
    t = rt.wait(Op(OpKind.MEMCPY, stream=0, arg=int(Memcpy.D2H), duration=1e-5, nbytes=4))
    assert t == pytest.approx(2e-3 + 1e-5)
    assert rt.stream_tail(3) == pytest.approx(0.0)


def test_register_group_rejects_conflicting_ranks():
    rt = LocalRuntime(capacity_bytes=1 << 30)
    rt.register_group(1, [0, 2], "a")
    rt.register_group(1, [0, 2], "a")
    with pytest.raises(ValueError):
        rt.register_group(1, [0, 1], "b")
    assert rt.intern_signature("x") == rt.intern_signature("x") != rt.intern_signature("y")


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
