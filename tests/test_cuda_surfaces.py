"""The torch.cuda and torch.distributed surfaces a training script or framework queries, under `phantora run`, each
checked against what a CUDA build of torch on an H100 node with NCCL answers (types and shapes as torch documents
them, memory_stats' key set as torch's C++ builds it), and batch_isend_irecv simulated like NCCL's grouped
send/recv: the trace holds every batched op and is complete, the summary has its compute and communication lines.

One run of tests/scripts/cuda_surfaces.py on 2 simulated GPUs serves every test.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from phantora.engine.ops import OpKind
from phantora.trace.reader import TraceReader
from test_live_run import SCRIPTS, phantora_run, results

# torch/csrc/cuda/Module.cpp (_cuda_memoryStats): nine stat arrays over the pools "all", "small_pool",
# "large_pool", two single stats, six counters; each stat has current / peak / allocated / freed
STAT_ARRAYS = ("allocation", "segment", "active", "inactive_split", "allocated_bytes", "reserved_bytes",
               "active_bytes", "inactive_split_bytes", "requested_bytes")
POOLS = ("all", "small_pool", "large_pool")
METRICS = ("current", "peak", "allocated", "freed")
MEMORY_STATS_KEYS = ({f"{s}.{p}.{m}" for s in STAT_ARRAYS for p in POOLS for m in METRICS}
                     | {f"{s}.{m}" for s in ("oversize_allocations", "oversize_segments") for m in METRICS}
                     | {"num_alloc_retries", "num_ooms", "max_split_size", "num_sync_all_streams",
                        "num_device_alloc", "num_device_free"})


@pytest.fixture(scope="module")
def surfaces(tmp_path_factory):
    trace = tmp_path_factory.mktemp("surfaces") / "surfaces.h5"
    proc = phantora_run("--nodes", "1", "--gpus-per-node", "2", "--ranks", "all", "--trace", str(trace), "--",
                        "python", str(SCRIPTS / "cuda_surfaces.py"))
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    (res,) = results(proc.stdout)
    return res, proc.stdout, trace


def answer(res, name):
    r = res[name]
    assert "error" not in r, f"{name} raised {r['error']}: {r['message']}"
    return r["value"]


def test_versions_and_capabilities_are_an_h100_with_cuda(surfaces):
    res, _, _ = surfaces
    assert re.fullmatch(r"\d+\.\d+", answer(res, "version_cuda"))          # torch.version.cuda: "12.8", "13.0"
    assert answer(res, "backends_cuda_is_built") is True
    assert answer(res, "capability") == [9, 0]
    assert answer(res, "capability_type") == ["int", "int", "tuple"]
    props = answer(res, "props")
    assert props["name"] == answer(res, "device_name") == "NVIDIA H100 80GB HBM3"
    assert (props["major"], props["minor"]) == (9, 0)
    assert props["multi_processor_count"] == 132
    assert props["L2_cache_size"] == 50 * 2**20
    assert 79 * 2**30 < props["total_memory"] < 80 * 2**30
    assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", props["uuid"])
    assert "sm_90" in answer(res, "arch_list")
    assert answer(res, "bf16") is True
    assert answer(res, "device_count") == 2
    assert answer(res, "is_initialized") is True
    handle = answer(res, "blas_handle")
    assert isinstance(handle, int) and handle != 0                       # an opaque cublasHandle_t pointer
    assert "error" not in res["cudart"]                                   # cudaProfilerStart/Stop: cudaSuccess
    assert answer(res, "tunable") is False                                # TunableOp is off by default


def test_nccl_and_cudnn_are_present(surfaces):
    res, _, _ = surfaces
    version = answer(res, "nccl_version")
    assert answer(res, "nccl_version_types") == ["int", "int", "int"]    # (major, minor, patch), no suffix
    assert tuple(version) >= (2, 18, 0)
    assert answer(res, "nccl_is_available") is True
    cudnn = answer(res, "cudnn_version")
    assert res["cudnn_version"]["type"] == "int" and 90000 <= cudnn < 100000     # cuDNN 9: 9xxyy
    assert answer(res, "cudnn_is_available") is True
    assert answer(res, "cudnn_enabled") is True
    assert answer(res, "cudnn_acceptable") is True                       # an fp32 CUDA tensor
    # torch.__config__.show() answers as a CUDA build, with the versions torch.version and cudnn report
    config = answer(res, "config_show")
    assert f"CUDA Runtime {answer(res, 'version_cuda')}" in config
    assert "USE_CUDA=ON" in config and f"CuDNN {cudnn // 10000}.{cudnn // 100 % 100}" in config


def test_memory_stats_have_every_key_of_the_cuda_caching_allocator(surfaces):
    res, _, _ = surfaces
    assert answer(res, "memory_stats_type") == "OrderedDict"
    assert answer(res, "memory_stats_sorted") is True
    stats = answer(res, "memory_stats")
    assert set(stats) == MEMORY_STATS_KEYS
    assert all(isinstance(v, int) for v in stats.values())
    assert answer(res, "memory_nested_keys") == sorted({k.split(".")[0] for k in MEMORY_STATS_KEYS})
    # values from the allocator: agree with the other queries, and the pools add up to the whole
    assert stats["allocated_bytes.all.current"] == answer(res, "memory_allocated") > 0
    assert stats["reserved_bytes.all.current"] == answer(res, "memory_reserved") > 0
    for s in STAT_ARRAYS:
        for m in ("current", "allocated", "freed"):
            assert stats[f"{s}.all.{m}"] == stats[f"{s}.small_pool.{m}"] + stats[f"{s}.large_pool.{m}"], (s, m)
    # the Linear's 4 MiB weight is a large-pool block, its 4 KiB bias a small-pool one
    assert stats["allocated_bytes.large_pool.current"] >= 4 * 2**20
    assert stats["allocated_bytes.small_pool.current"] >= 4096
    assert stats["max_split_size"] == -1 and stats["num_ooms"] == 0


def test_memory_queries(surfaces):
    res, _, _ = surfaces
    free, total = answer(res, "mem_get_info")
    assert answer(res, "mem_get_info_type") == "tuple"
    assert total == answer(res, "props")["total_memory"]
    # as cudaMemGetInfo: free excludes PyTorch's reserved memory and what the process holds outside it (a CUDA
    # context of about 0.6 GiB, library workspaces, NCCL's buffers: groundtruth/devmem/)
    outside = total - answer(res, "memory_reserved") - free
    assert 0.6 * 2 ** 30 < outside < 4 * 2 ** 30
    segments = answer(res, "snapshot")
    assert sum(s["total_size"] for s in segments) == answer(res, "memory_reserved")
    assert sum(s["allocated_size"] for s in segments) == answer(res, "memory_allocated")
    assert {s["segment_type"] for s in segments} == {"small", "large"}
    for s in segments:
        assert sum(b["size"] for b in s["blocks"]) == s["total_size"]
    assert {"segments", "device_traces"} <= set(answer(res, "snapshot_keys"))
    assert answer(res, "memory_fraction") == 1.0
    assert "PyTorch CUDA memory summary" in answer(res, "memory_summary")
    assert answer(res, "host_memory_stats_type") == "OrderedDict"
    ptr_type, grown, left = answer(res, "raw_alloc")
    assert ptr_type == "int" and grown == 1024 and left == 0          # 1000 B rounded to 512 B blocks, then freed


def test_cuda_rng_state_seeds_and_default_generators(surfaces):
    res, _, _ = surfaces
    assert answer(res, "rng_state") == ["torch.uint8", "cpu", 16]       # Philox: seed and offset, 8 bytes each
    assert answer(res, "rng_state_all") == 2
    seeding = answer(res, "seeding")
    assert seeding["initial_seed"] == seeding["state_seed"] == 1234 and seeding["state_offset"] == 0
    assert seeding["restored"] == 1234
    assert seeding["all"] == [7, 7]
    assert seeding["torch_manual_seed"] == 11                            # torch.manual_seed seeds CUDA too
    assert seeding["seed_changed"] is True
    gens = answer(res, "generators")
    assert gens["type"] == "tuple" and gens["len"] == 2
    assert gens["devices"] == ["cuda:0", "cuda:1"]
    assert gens["is_generator"] is True
    assert gens["restored"] is True and gens["tracked_seed"] == 2718
    assert gens["graphsafe_type"] is True and gens["graphsafe_restored"] == 2718
    assert gens["clone_state"] is True
    assert gens["randn_with_generator"] == [3]


def test_nvml_queries_fail_as_torch_does_without_nvidia_ml_py(surfaces):
    res, _, _ = surfaces
    if answer(res, "pynvml_installed"):
        pytest.skip("nvidia-ml-py is installed here: torch would query NVML")
    for name in ("utilization", "temperature", "power_draw"):
        assert res[name].get("error") == "ModuleNotFoundError", res[name]


def test_pin_memory_result_is_pinned(surfaces):
    res, _, _ = surfaces
    assert answer(res, "is_pinned") is True
    assert answer(res, "is_pinned_factory") is True          # torch.empty(..., pin_memory=True), as DDP's Reducer


def test_distributed_queries(surfaces):
    res, _, _ = surfaces
    assert answer(res, "dist_backend") == "nccl"
    assert answer(res, "dist_nccl") is True
    assert answer(res, "dist_available") is True
    assert answer(res, "dist_initialized") is True
    assert answer(res, "nccl_options_config") == -2147483648             # NCCL_CONFIG_UNDEF_INT


def test_batch_isend_irecv_is_simulated_and_traced_whole(surfaces):
    res, stdout, trace = surfaces
    assert res["batch_works"] == [1, 1, 1]          # ProcessGroupNCCL coalesces a batch into one work
    per_iter = [ln for ln in stdout.splitlines() if ln.strip().startswith("per iteration")]
    assert per_iter and "compute" in per_iter[0] and "communication" in per_iter[0]
    with TraceReader(trace) as t:
        assert t.complete and t.meta["complete_simulation"] is True
        for rank in (0, 1):
            kinds = t.ops(rank)["kind"]
            count = {k: int(np.sum(kinds == int(k))) for k in (OpKind.GROUP_START, OpKind.GROUP_END,
                                                               OpKind.SEND, OpKind.RECV, OpKind.ITER_MARK)}
            assert count == {OpKind.GROUP_START: 3, OpKind.GROUP_END: 3, OpKind.SEND: 6, OpKind.RECV: 6,
                             OpKind.ITER_MARK: 3}
            # the program went on after its last batch: its backward and optimizer kernels are in the trace
            last_end = int(np.flatnonzero(kinds == int(OpKind.GROUP_END))[-1])
            assert np.sum(kinds[last_end:] == int(OpKind.KERNEL)) > 0
        assert len(t.collectives) == 3 * 4           # the script's only collectives: 4 transfers per step


def test_allocator_keeps_pytorchs_counters_per_pool():
    from phantora.engine.allocator import CachingAllocatorModel

    a = CachingAllocatorModel(80 * 2**30)
    a.alloc(1000, 1)                  # small pool: a 2 MiB segment, a 1024 B block
    a.alloc(4 * 2**20, 2)             # large pool: a 20 MiB segment
    s = a.stats
    assert set(s) == MEMORY_STATS_KEYS
    assert (s["reserved_bytes.small_pool.current"], s["reserved_bytes.large_pool.current"]) == (2 << 20, 20 << 20)
    assert (s["segment.small_pool.current"], s["segment.large_pool.current"]) == (1, 1)
    assert (s["allocated_bytes.small_pool.current"], s["allocated_bytes.large_pool.current"]) == (1024, 4 << 20)
    assert s["requested_bytes.small_pool.current"] == 1000
    a.free(2)
    a.empty_cache()                   # gives back the large segment; every cache release syncs the device
    s = a.stats
    assert s["reserved_bytes.large_pool.current"] == 0 and s["segment.large_pool.freed"] == 1
    assert s["allocated_bytes.large_pool.peak"] == 4 << 20
    assert s["num_sync_all_streams"] == 1 and s["num_device_free"] == 1
    a.reset_accumulated()             # as resetAccumulatedStats: cumulative counts and the event counters
    s = a.stats
    assert s["allocated_bytes.all.allocated"] == 0 and s["num_device_alloc"] == 0 and s["num_sync_all_streams"] == 0
    assert s["allocated_bytes.all.current"] == 1024
    a.reset_peak()
    assert a.stats["allocated_bytes.large_pool.peak"] == 0
