"""The torch.cuda / torch.distributed surfaces that training scripts and frameworks query, then a two-stage pipeline
exchange with batch_isend_irecv; run by tests/test_cuda_surfaces.py under `phantora run` on 2 GPUs.

Rank 0 prints one `RESULT {json}` line: for every query what it answered (type, value) or the exception it raised.
"""

import importlib.util
import json
import struct
import time

import torch
import torch.distributed as dist
import torch.nn as nn

dist.init_process_group("nccl")
rank = dist.get_rank()
torch.cuda.set_device(rank)
res: dict = {}


def probe(name, fn):
    try:
        value = fn()
        res[name] = {"type": type(value).__name__, "value": value}
    except BaseException as exc:  # noqa: BLE001 - the test checks which exception a query raises
        res[name] = {"error": type(exc).__name__, "message": str(exc)}


def state_bytes(t):
    return [int(x) for x in t.tolist()]


props = torch.cuda.get_device_properties(rank)

# ---- versions and capabilities
probe("version_cuda", lambda: torch.version.cuda)
probe("backends_cuda_is_built", lambda: torch.backends.cuda.is_built())
probe("capability", lambda: list(torch.cuda.get_device_capability()))
probe("capability_type", lambda: [type(x).__name__ for x in torch.cuda.get_device_capability()] +
      [type(torch.cuda.get_device_capability()).__name__])
probe("props", lambda: {"name": props.name, "major": props.major, "minor": props.minor,
                        "total_memory": props.total_memory, "multi_processor_count": props.multi_processor_count,
                        "L2_cache_size": props.L2_cache_size, "uuid": str(props.uuid)})
probe("device_name", lambda: torch.cuda.get_device_name())
probe("arch_list", lambda: torch.cuda.get_arch_list())
probe("bf16", lambda: torch.cuda.is_bf16_supported())
probe("device_count", lambda: torch.cuda.device_count())
probe("is_initialized", lambda: torch.cuda.is_initialized())
probe("blas_handle", lambda: torch.cuda.current_blas_handle())
probe("cudart", lambda: torch.cuda.check_error(torch.cuda.cudart().cudaProfilerStart()) or
      torch.cuda.check_error(torch.cuda.cudart().cudaProfilerStop()))
probe("tunable", lambda: torch.cuda.tunable.is_enabled())

# ---- NCCL, cuDNN
probe("nccl_version", lambda: list(torch.cuda.nccl.version()))
probe("nccl_version_types", lambda: [type(x).__name__ for x in torch.cuda.nccl.version()])
probe("nccl_is_available", lambda: torch.cuda.nccl.is_available([torch.zeros(4, device="cuda")]))
probe("cudnn_version", lambda: torch.backends.cudnn.version())
probe("config_show", lambda: torch.__config__.show())
probe("cudnn_is_available", lambda: torch.backends.cudnn.is_available())
probe("cudnn_enabled", lambda: torch.backends.cudnn.enabled)
probe("cudnn_acceptable", lambda: torch.backends.cudnn.is_acceptable(torch.zeros(4, device="cuda")))

# ---- memory
model = nn.Linear(1024, 1024, device="cuda")
x = torch.randn(8, 1024, device="cuda")
model(x).sum().backward()
probe("memory_stats_type", lambda: type(torch.cuda.memory_stats()).__name__)
probe("memory_stats", lambda: dict(torch.cuda.memory_stats()))
probe("memory_stats_sorted", lambda: list(torch.cuda.memory_stats()) == sorted(torch.cuda.memory_stats()))
probe("memory_nested_keys", lambda: sorted(torch.cuda.memory_stats_as_nested_dict()))
probe("memory_allocated", lambda: torch.cuda.memory_allocated())
probe("memory_reserved", lambda: torch.cuda.memory_reserved())
probe("mem_get_info", lambda: list(torch.cuda.mem_get_info()))
probe("mem_get_info_type", lambda: type(torch.cuda.mem_get_info()).__name__)
probe("snapshot", lambda: [{k: s[k] for k in ("total_size", "allocated_size", "segment_type", "blocks")}
                           for s in torch.cuda.memory_snapshot()])
probe("snapshot_keys", lambda: sorted(torch.cuda.memory._snapshot()))
probe("memory_fraction", lambda: torch.cuda.get_per_process_memory_fraction())
probe("memory_summary", lambda: torch.cuda.memory_summary()[:400])
probe("host_memory_stats_type", lambda: type(torch.cuda.host_memory_stats()).__name__)


def raw_alloc():
    before = torch.cuda.memory_allocated()
    ptr = torch.cuda.caching_allocator_alloc(1000)
    during = torch.cuda.memory_allocated()
    torch.cuda.caching_allocator_delete(ptr)
    return [type(ptr).__name__, during - before, torch.cuda.memory_allocated() - before]


probe("raw_alloc", raw_alloc)

# ---- RNG
probe("rng_state", lambda: [str(torch.cuda.get_rng_state().dtype), str(torch.cuda.get_rng_state().device),
                            torch.cuda.get_rng_state().numel()])
probe("rng_state_all", lambda: len(torch.cuda.get_rng_state_all()))


def seeding():
    torch.cuda.manual_seed(1234)
    st = torch.cuda.get_rng_state()
    seed, offset = struct.unpack("<Qq", bytes(state_bytes(st)))
    out = {"initial_seed": torch.cuda.initial_seed(), "state_seed": seed, "state_offset": offset}
    torch.cuda.manual_seed(99)
    torch.cuda.set_rng_state(st)
    out["restored"] = torch.cuda.initial_seed()
    torch.cuda.manual_seed_all(7)
    out["all"] = [g.initial_seed() for g in torch.cuda.default_generators]
    torch.manual_seed(11)
    out["torch_manual_seed"] = torch.cuda.initial_seed()
    torch.cuda.seed()
    out["seed_changed"] = torch.cuda.initial_seed() != 11
    return out


probe("seeding", seeding)


def generators():
    gens = torch.cuda.default_generators
    out = {"type": type(gens).__name__, "len": len(gens),
           "devices": [str(g.device) for g in gens],
           "is_generator": all(isinstance(g, torch.Generator) for g in gens)}
    g = gens[rank]
    # Megatron's CudaRNGStatesTracker.add: remember, reseed, keep the new state, go back
    orig = g.get_state()
    torch.cuda.manual_seed(2718)
    tracked = g.get_state().clone()
    g.set_state(orig)
    out["restored"] = state_bytes(g.get_state()) == state_bytes(orig)
    g.set_state(tracked)
    out["tracked_seed"] = g.initial_seed()
    # graph-safe states (use_cudagraphable_rng)
    saved = g.graphsafe_get_state()
    out["graphsafe_type"] = isinstance(saved, torch.Generator)
    g.manual_seed(5)
    g.graphsafe_set_state(saved)
    out["graphsafe_restored"] = g.initial_seed()
    out["clone_state"] = isinstance(g.clone_state(), torch.Generator)
    out["randn_with_generator"] = list(torch.randn(3, device="cuda", generator=g).shape)
    return out


probe("generators", generators)

# ---- NVML queries, pinned memory
probe("utilization", lambda: torch.cuda.utilization())
probe("temperature", lambda: torch.cuda.temperature())
probe("power_draw", lambda: torch.cuda.power_draw())
probe("pynvml_installed", lambda: importlib.util.find_spec("pynvml") is not None)
probe("is_pinned", lambda: torch.empty(16).pin_memory().is_pinned())
probe("is_pinned_factory", lambda: torch.empty(16, pin_memory=True).is_pinned())

# ---- torch.distributed
probe("dist_backend", lambda: dist.get_backend())
probe("dist_nccl", lambda: dist.is_nccl_available())
probe("dist_available", lambda: dist.is_available())
probe("dist_initialized", lambda: dist.is_initialized())
probe("nccl_options_config", lambda: dist.ProcessGroupNCCL.Options().config.max_ctas)

# ---- a pipeline exchange: every step posts sends and receives in both directions in one batch
peer = 1 - rank
stage = nn.Linear(1024, 1024, device="cuda")
opt = torch.optim.SGD(stage.parameters(), lr=0.1)
n_works = []
for step in range(3):
    t0 = time.perf_counter()
    act = stage(torch.randn(16, 1024, device="cuda"))
    recv_act = torch.empty(16, 1024, device="cuda")
    grad_out = torch.empty(16, 1024, device="cuda")
    recv_grad = torch.empty(16, 1024, device="cuda")
    ops = [dist.P2POp(dist.isend, act.detach(), peer), dist.P2POp(dist.irecv, recv_act, peer),
           dist.P2POp(dist.isend, grad_out, peer), dist.P2POp(dist.irecv, recv_grad, peer)]
    works = dist.batch_isend_irecv(ops)
    n_works.append(len(works))
    for w in works:
        w.wait()
    (act * recv_act).sum().backward()
    opt.step()
    opt.zero_grad()
    torch.cuda.synchronize()
    print(f"step {step} {time.perf_counter() - t0:.6f}", flush=True)
res["batch_works"] = n_works

if rank == 0:
    print("RESULT " + json.dumps(res, default=str), flush=True)
dist.destroy_process_group()
