"""What a CUDA machine answers, and how it fails, for a few surfaces a simulated rank once answered differently:
stream priorities, `torch.Generator(device="cuda")`, and collectives of CPU tensors on process groups without a CPU
backend. Each expectation cites the PyTorch (or NCCL) source that decides it on a real GPU.

One run of the script below on 2 simulated GPUs (both ranks real processes) serves every test.
"""

from __future__ import annotations

import textwrap

import pytest

from test_live_run import phantora_run, results

SCRIPT = textwrap.dedent('''
    import json
    import struct

    import torch
    import torch.distributed as dist

    dist.init_process_group()                 # the default backend string ("undefined")
    rank = dist.get_rank()
    torch.cuda.set_device(rank)
    res = {"rank": rank, "torch": torch.__version__}


    def probe(name, fn):
        try:
            res[name] = {"value": fn()}
        except BaseException as exc:  # noqa: BLE001 - the test checks the exception
            res[name] = {"error": type(exc).__name__, "message": str(exc)}


    # ---- stream priorities
    requested = (0, -1, -2, -3, -4, -100, 1, 7)
    probe("pool_priorities", lambda: [torch.cuda.Stream(priority=p).priority for p in requested])
    probe("priority_range", lambda: list(torch.cuda.Stream.priority_range()))
    probe("priority_range_instance", lambda: list(torch.cuda.Stream().priority_range()))
    probe("current_priority", lambda: torch.cuda.current_stream().priority)
    probe("default_priority", lambda: torch.cuda.default_stream().priority)
    high = torch.cuda.Stream(priority=-1)


    def inside():
        with torch.cuda.stream(high):
            cur = torch.cuda.current_stream()
            return [cur.priority, cur == high]


    probe("current_priority_inside", inside)
    probe("unpacked_priority", lambda: torch.cuda.Stream(stream_id=high.stream_id, device_index=high.device_index,
                                                         device_type=high.device_type).priority)
    probe("external_with_priority", lambda: torch.cuda.ExternalStream(0x7F0000001000, priority=-1))

    # ---- generators
    def new_cuda_generator():
        g = torch.Generator(device="cuda")
        return [str(g.device), g.initial_seed(), isinstance(g, torch.Generator)]


    def generator_state():
        g = torch.Generator(device="cuda").manual_seed(1234)
        state = g.get_state()
        other = torch.Generator(device="cuda")
        other.set_state(state)
        drawn = torch.randn(3, device="cuda", generator=g)
        return [str(state.dtype), state.numel(), list(struct.unpack("<Qq", bytes(state.tolist()))),
                other.initial_seed(), str(drawn.device), isinstance(g.seed(), int)]


    probe("cuda_generator", new_cuda_generator)
    probe("cuda1_generator", lambda: str(torch.Generator("cuda:1").device))
    probe("cpu_generators", lambda: [str(torch.Generator().device), str(torch.Generator(device="cpu").device),
                                     isinstance(torch.default_generator, torch.Generator),
                                     isinstance(torch.cuda.default_generators[0], torch.Generator)])
    probe("generator_state", generator_state)
    probe("generator_bad_device", lambda: torch.Generator(device="cuda:7"))

    # ---- random ops given a generator of the other device type
    probe("gen/randperm_cuda", lambda: torch.randperm(10, generator=torch.Generator(device="cuda")).tolist())
    probe("gen/random_cpu_cuda", lambda: torch.empty((), dtype=torch.int64).random_(
        generator=torch.Generator(device="cuda")).item())
    probe("gen/randn_cuda_cpu", lambda: str(torch.randn(3, device="cuda", generator=torch.Generator()).device))
    probe("gen/normal_cuda_cpu", lambda: str(torch.empty(3, device="cuda").normal_(generator=torch.Generator()).device))
    probe("gen/randn_cuda_cuda", lambda: str(torch.randn(3, device="cuda",
                                                         generator=torch.Generator(device="cuda")).device))
    probe("gen/randperm_cuda_cpu", lambda: torch.randperm(10, device="cuda", generator=torch.Generator()).shape[0])
    probe("gen/randperm_out_cuda", lambda: str(torch.randperm(10, generator=torch.Generator(device="cuda"),
                                                              out=torch.empty(10, dtype=torch.long,
                                                                              device="cuda")).device))
    probe("gen/randperm_cpu_cpu", lambda: torch.randperm(10, generator=torch.Generator().manual_seed(3)).tolist())


    def shuffled_loader(device):
        data = torch.utils.data.TensorDataset(torch.arange(20))
        loader = torch.utils.data.DataLoader(data, batch_size=5, shuffle=True,
                                             generator=torch.Generator(device=device).manual_seed(0))
        return [b[0].tolist() for b in loader]


    probe("gen/dataloader_cuda", lambda: shuffled_loader("cuda"))


    # ---- a generator's state sent from rank 0 to the others through the GPU (accelerate's synchronize_rng_state)
    def synced_generator():
        g = torch.Generator().manual_seed(100 + rank)
        state = g.get_state().to("cuda")
        dist.broadcast(state, 0)
        g.set_state(state.cpu())
        return torch.randperm(40, generator=g).tolist()


    def synced_default_generator():
        torch.manual_seed(100 + rank)
        state = torch.get_rng_state().to("cuda")
        dist.broadcast(state, 0)
        torch.set_rng_state(state.cpu())
        return torch.randperm(40).tolist()


    # ---- random draws on the GPU: from the device's generator, whose offset advances per kernel
    def cuda_reseed():
        torch.cuda.manual_seed(5)
        a = torch.randint(0, 1000, (8,), device="cuda").tolist()
        torch.cuda.manual_seed(5)
        b = torch.randint(0, 1000, (8,), device="cuda").tolist()
        c = torch.randint(0, 1000, (8,), device="cuda").tolist()
        return [a == b, a == c]


    def cuda_offsets():
        torch.cuda.manual_seed(5)
        gen = torch.cuda.default_generators[torch.cuda.current_device()]
        out = [gen.get_offset()]
        for n in (10, 2_000_000, 0, 300_000_000):
            torch.empty(n, device="cuda").normal_()
            out.append(gen.get_offset())
        return out


    def host_untouched():
        torch.manual_seed(7)
        torch.randint(0, 1000, (8,), device="cuda")
        torch.rand(1000, device="cuda")
        return torch.randperm(10).tolist()


    def state_restore():
        g = torch.Generator(device="cuda").manual_seed(9)
        state = g.get_state()
        a = torch.randint(0, 1000, (8,), device="cuda", generator=g).tolist()
        g.set_state(state)
        return a == torch.randint(0, 1000, (8,), device="cuda", generator=g).tolist()


    probe("rng/cuda_reseed", cuda_reseed)
    probe("rng/cuda_offsets", cuda_offsets)
    probe("rng/host_untouched", host_untouched)
    probe("rng/state_restore", state_restore)
    probe("rng/sms", lambda: [torch.cuda.get_device_properties(0).multi_processor_count,
                              torch.cuda.get_device_properties(0).max_threads_per_multi_processor,
                              torch.cuda.get_device_name(0)])
    probe("gen/synced_generator", synced_generator)
    probe("gen/synced_default_generator", synced_default_generator)
    probe("gen/dataloader_cpu", lambda: shuffled_loader("cpu"))

    # ---- collectives of CPU tensors: each group's backends decide which devices it serves
    groups = {"default": None, "nccl": dist.new_group(backend="nccl"), "gloo": dist.new_group(backend="gloo"),
              "cpu:gloo,cuda:nccl": dist.new_group(backend="cpu:gloo,cuda:nccl")}
    for label, g in groups.items():
        def all_reduce(device, g=g):
            t = torch.tensor([rank + 1.0], device=device)
            dist.all_reduce(t, group=g)
            return t.item()

        def broadcast(g=g):
            t = torch.tensor([rank + 5.0])
            dist.broadcast(t, src=0, group=g)
            return t.item()

        def all_gather(g=g):
            out = torch.zeros(2)
            dist.all_gather_into_tensor(out, torch.tensor([rank + 1.0]), group=g)
            return out.tolist()

        def send_recv(g=g):
            t = torch.tensor([rank + 7.0])
            if rank == 0:
                dist.send(t, dst=1, group=g)
            else:
                dist.recv(t, src=0, group=g)
            return t.item()

        probe(f"{label}/all_reduce_cpu", lambda f=all_reduce: f("cpu"))
        probe(f"{label}/broadcast_cpu", broadcast)
        probe(f"{label}/all_gather_cpu", all_gather)
        probe(f"{label}/send_recv_cpu", send_recv)
        probe(f"{label}/all_reduce_cuda", lambda f=all_reduce: f("cuda"))
    import torch.distributed._functional_collectives as funcol
    for label in ("nccl", "gloo"):
        g = groups[label]
        probe(f"{label}/funcol_all_reduce_cpu", lambda g=g: funcol.all_reduce(torch.full((2,), rank + 1.0), "sum",
                                                                              g).tolist())
    g = groups["nccl"]
    one = lambda v: torch.tensor(v, device="cuda")   # noqa: E731
    probe("nccl/funcol_all_reduce_cuda", lambda: funcol.all_reduce(one([rank + 1.0] * 2), "sum", g).tolist())
    probe("nccl/funcol_all_reduce_avg", lambda: funcol.all_reduce(one([rank + 1.0]), "avg", g).tolist())
    probe("nccl/funcol_all_reduce_max", lambda: funcol.all_reduce(one([rank + 1.0]), "max", g).tolist())
    probe("nccl/funcol_all_gather", lambda: funcol.all_gather_tensor(one([rank + 1.0]), 0, g).tolist())
    probe("nccl/funcol_reduce_scatter", lambda: funcol.reduce_scatter_tensor(
        one([10.0 * (rank + 1), 100.0 * (rank + 1)]), "sum", 0, g).tolist())
    def coalesced(in_place):
        ts = [one([rank + 1.0]), one([10.0 * (rank + 1), 1.0])]
        op = torch.ops._c10d_functional.all_reduce_coalesced_ if in_place else \
            torch.ops._c10d_functional.all_reduce_coalesced
        outs = op(ts, "sum", g.group_name)
        outs = ts if in_place else outs
        return [funcol.wait_tensor(t).tolist() for t in outs]


    probe("nccl/funcol_all_reduce_coalesced", lambda: coalesced(False))
    probe("nccl/funcol_all_reduce_coalesced_", lambda: coalesced(True))
    probe("nccl/funcol_broadcast", lambda: funcol.broadcast(one([rank + 5.0]), 0, g).tolist())
    probe("nccl/barrier", lambda: dist.barrier(group=groups["nccl"]))
    probe("nccl/all_gather_object", lambda: (lambda out: (dist.all_gather_object(out, rank, group=groups["nccl"]),
                                                          out)[1])([None, None]))
    print("RESULT " + json.dumps(res))
''')


@pytest.fixture(scope="module")
def fidelity(tmp_path_factory):
    script = tmp_path_factory.mktemp("fidelity") / "fidelity.py"
    script.write_text(SCRIPT)
    proc = phantora_run("--nodes", "1", "--gpus-per-node", "2", "--ranks", "all", "--overwrite", "--no-trace",
                        "--", "python", str(script))
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    res = sorted(results(proc.stdout), key=lambda r: r["rank"])
    assert [r["rank"] for r in res] == [0, 1]
    return res


def answer(res, name):
    r = res[name]
    assert "error" not in r, f"{name} raised {r['error']}: {r['message']}"
    return r["value"]


def raised(res, name):
    r = res[name]
    assert "error" in r, f"{name} answered {r['value']!r} where a GPU run raises"
    return r["error"], r["message"]


def test_stream_priorities_are_the_pooled_levels_of_a_hopper_gpu(fidelity):
    # c10/cuda/CUDAStream.cpp: cudaDeviceGetStreamPriorityRange answers (0, -5) on an H100 (six levels), PyTorch
    # pools at most max_compile_time_stream_priorities = 4 of them (c10/cuda/CUDAStream.h), and
    # getStreamFromPool(priority) takes pool std::clamp(-priority, 0, 3) (pytorch#143849): a stream's priority
    # (cudaStreamGetPriority) is 0, -1, -2 or -3, values beyond either end mapped to the nearest
    for res in fidelity:
        assert answer(res, "pool_priorities") == [0, -1, -2, -3, -3, -3, 0, 0]
        # CUDAStream::priority_range(): (least, max(-max_compile_time_stream_priorities + 1, greatest)) = (0, -3),
        # a static method of torch._C._CudaStreamBase
        assert answer(res, "priority_range") == [0, -3]
        assert answer(res, "priority_range_instance") == [0, -3]
        # the default stream (the current one unless another is set) has the default priority, 0
        assert answer(res, "current_priority") == 0
        assert answer(res, "default_priority") == 0
        # the current stream inside `with torch.cuda.stream(s)` is s, with its priority; so is a stream unpacked
        # from s's id (THCPStream_pynew's unpack3: the priority is the stream's own)
        assert answer(res, "current_priority_inside") == [-1, True]
        assert answer(res, "unpacked_priority") == -1
        # THCPStream_pynew: TORCH_CHECK(priority == 0, "Priority was explicitly set for a external stream")
        assert raised(res, "external_with_priority") == ("RuntimeError",
                                                          "Priority was explicitly set for a external stream")


def test_a_cuda_generator_is_on_the_current_cuda_device(fidelity):
    for res in fidelity:
        rank = res["rank"]
        # THPGenerator_pynew -> CUDAHooks::getNewGenerator -> createCUDAGenerator(-1): the current device, seeded
        # with default_rng_seed_val = 67280421310721 (ATen/core/Generator.h), offset 0
        assert answer(res, "cuda_generator") == [f"cuda:{rank}", 67280421310721, True]
        assert answer(res, "cuda1_generator") == "cuda:1"
        assert answer(res, "cpu_generators") == ["cpu", "cpu", True, True]
        # CUDAGeneratorImpl::get_state: a 16-byte uint8 tensor, seed then offset (CUDAGeneratorImpl.cpp)
        assert answer(res, "generator_state") == ["torch.uint8", 16, [1234, 0], 1234, f"cuda:{rank}", True]
        # createCUDAGenerator: TORCH_CHECK(idx >= 0 && idx < num_gpus, "The device_index is invalid.")
        assert raised(res, "generator_bad_device") == ("RuntimeError", "The device_index is invalid.")


NO_CPU_BACKEND = ("RuntimeError", "No backend type associated with device type cpu")


def _version(v: str) -> tuple[int, int]:
    major, minor = v.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def test_cpu_tensors_on_a_group_without_a_cpu_backend_fail_as_in_c10d(fidelity):
    # c10d ProcessGroup::getBackend(DeviceType): TORCH_CHECK(false, "No backend type associated with device type ",
    # deviceType) when no backend of the group serves the tensor's device; an "nccl" group serves CUDA only
    # (Backend.backend_capability). Every collective and point-to-point call of CPU tensors dispatches there.
    groups = ["nccl"]
    # torch >= 2.6 (pytorch#142216): init_process_group() without a backend creates only the detected
    # accelerator's backend (BackendConfig("undefined"): {"cuda": "nccl"} on a CUDA machine); before, cpu:gloo too
    if _version(fidelity[0]["torch"]) >= (2, 6):
        groups.append("default")
    for res in fidelity:
        for g in groups:
            for op in ("all_reduce_cpu", "broadcast_cpu", "all_gather_cpu", "send_recv_cpu"):
                assert raised(res, f"{g}/{op}") == NO_CPU_BACKEND, (g, op)
            assert answer(res, f"{g}/all_reduce_cuda") == 3.0
        # the CUDA tensors that barrier and the object collectives use on an NCCL group are fine
        assert answer(res, "nccl/barrier") is None
        assert answer(res, "nccl/all_gather_object") == [0, 1]


def test_cpu_tensors_on_groups_with_a_cpu_backend_still_travel(fidelity):
    groups = ["gloo", "cpu:gloo,cuda:nccl"]
    if _version(fidelity[0]["torch"]) < (2, 6):
        groups.append("default")
    for res in fidelity:
        for g in groups:
            assert answer(res, f"{g}/all_reduce_cpu") == 3.0
            assert answer(res, f"{g}/broadcast_cpu") == 5.0
            assert answer(res, f"{g}/all_gather_cpu") == [1.0, 2.0]
            assert answer(res, f"{g}/send_recv_cpu") == 7.0          # rank 0's own value, received by rank 1
            assert answer(res, f"{g}/all_reduce_cuda") == 3.0



GEN_MISMATCH = "Expected a '{}' device type for generator but found '{}'"


def test_a_random_op_refuses_a_generator_of_the_other_device_type(fidelity):
    # at::check_generator<CPUGeneratorImpl / CUDAGeneratorImpl> (ATen/core/Generator.h): TORCH_CHECK(
    # T::device_type() == gen->device().type(), "Expected a '", T::device_type(), "' device type for generator but
    # found '", gen->device().type(), "'"), in every random kernel of either device
    import torch
    for res in fidelity:
        rank = res["rank"]
        for name in ("gen/randperm_cuda", "gen/random_cpu_cuda"):
            assert raised(res, name) == ("RuntimeError", GEN_MISMATCH.format("cpu", "cuda")), name
        # randperm on CUDA draws its keys with random_ on the device (aten/src/ATen/native/cuda/Randperm.cu)
        for name in ("gen/randn_cuda_cpu", "gen/normal_cuda_cpu", "gen/randperm_cuda_cpu"):
            assert raised(res, name) == ("RuntimeError", GEN_MISMATCH.format("cuda", "cpu")), name
        # a shuffled DataLoader draws its base seed with random_ of a host tensor from the loader's generator
        # (torch/utils/data/dataloader.py, _share_dist_seed): a CUDA generator stops it there
        assert raised(res, "gen/dataloader_cuda") == ("RuntimeError", GEN_MISMATCH.format("cpu", "cuda"))
        # generators of the op's own device run, drawing what plain PyTorch draws on the host
        assert answer(res, "gen/randn_cuda_cuda") == f"cuda:{rank}"
        assert answer(res, "gen/randperm_out_cuda") == f"cuda:{rank}"      # the out= tensor's device decides
        assert answer(res, "gen/randperm_cpu_cpu") == torch.randperm(
            10, generator=torch.Generator().manual_seed(3)).tolist()
        data = torch.utils.data.TensorDataset(torch.arange(20))
        loader = torch.utils.data.DataLoader(data, batch_size=5, shuffle=True,
                                             generator=torch.Generator().manual_seed(0))
        assert answer(res, "gen/dataloader_cpu") == [b[0].tolist() for b in loader]


def test_a_generator_state_broadcast_through_the_gpu_sets_every_rank_to_rank_0s_generator(fidelity):
    # accelerate's synchronize_rng_state: get_state() (5,056 bytes), .to(device), broadcast from rank 0, .cpu(),
    # set_state: on a GPU host every rank then draws what rank 0's generator draws, as plain PyTorch draws it here
    import torch
    expected = torch.randperm(40, generator=torch.Generator().manual_seed(100)).tolist()
    for res in fidelity:
        assert answer(res, "gen/synced_generator") == expected
        assert answer(res, "gen/synced_default_generator") == expected


def test_functional_collectives_carry_small_values_and_refuse_cpu_tensors_on_nccl(fidelity):
    # _c10d_functional ops (torch/csrc/distributed/c10d/Functional.cpp) run the group's collective: the CPU tensor
    # reaches ProcessGroup::getBackend(CPU) and fails there on an NCCL-only group, runs on a gloo one
    for res in fidelity:
        rank = res["rank"]
        assert raised(res, "nccl/funcol_all_reduce_cpu") == NO_CPU_BACKEND
        assert answer(res, "gloo/funcol_all_reduce_cpu") == [3.0, 3.0]
        # the values two ranks' NCCL collectives give: sum, mean, max of rank + 1, rank-ordered gather, the chunk of
        # the sum, the root's value
        assert answer(res, "nccl/funcol_all_reduce_cuda") == [3.0, 3.0]
        assert answer(res, "nccl/funcol_all_reduce_avg") == [1.5]
        assert answer(res, "nccl/funcol_all_reduce_max") == [2.0]
        assert answer(res, "nccl/funcol_all_gather") == [1.0, 2.0]
        assert answer(res, "nccl/funcol_reduce_scatter") == [[30.0], [300.0]][rank]
        assert answer(res, "nccl/funcol_broadcast") == [5.0]
        for form in ("nccl/funcol_all_reduce_coalesced", "nccl/funcol_all_reduce_coalesced_"):
            assert answer(res, form) == [[3.0], [30.0, 2.0]], form


def _philox_increment(numel: int, sms: int) -> int:
    # ATen/native/cuda/DistributionTemplates.h: calc_execution_policy(numel) gives blocks of 256 threads, grid =
    # min(SMs x (maxThreadsPerMultiProcessor / 256), ceil(numel / 256)) (2048 threads per SM on an H100), and
    # counter_offset = ((numel - 1) / (256 x grid x curand4_engine_calls) + 1) x curand4_engine_calls, with
    # curand4_engine_calls = 4; an empty tensor launches nothing
    if numel == 0:
        return 0
    grid = min(sms * (2048 // 256), (numel + 255) // 256)
    return ((numel - 1) // (256 * grid * 4) + 1) * 4


def test_random_draws_on_the_gpu_come_from_the_device_generator(fidelity):
    import torch
    for res in fidelity:
        # reseeding the CUDA generator draws the same numbers again; drawing on draws new ones
        assert answer(res, "rng/cuda_reseed") == [True, False]
        # the offset advances per kernel as the distribution kernels advance it
        sms, threads, name = answer(res, "rng/sms")
        assert "H100" in name and sms == 132 and threads == 2048      # the default cluster's GPU (SXM5: 132 SMs)
        offsets, total = [0], 0
        for n in (10, 2_000_000, 0, 300_000_000):
            total += _philox_increment(n, sms)
            offsets.append(total)
        assert answer(res, "rng/cuda_offsets") == offsets
        # draws on the GPU leave the host's generator alone: the host draws what plain PyTorch draws after the seed
        torch.manual_seed(7)
        assert answer(res, "rng/host_untouched") == torch.randperm(10).tolist()
        assert answer(res, "rng/state_restore") is True


VISIBLE = '''\
import json
import os

import torch

rank = int(os.environ["RANK"])
mine = os.environ.get("MINE_" + str(rank))
if mine is not None:                      # set by the script after `import torch`, before it first uses CUDA
    os.environ["CUDA_VISIBLE_DEVICES"] = mine
res = {"rank": rank}
try:
    n = res["count"] = torch.cuda.device_count()
    res["uuids"] = [str(torch.cuda.get_device_properties(i).uuid) for i in range(n)]
    res["generators"] = len(torch.cuda.default_generators)
    os.environ["CUDA_VISIBLE_DEVICES"] = "0"          # too late: CUDA read it when it initialised
    res["after"] = torch.cuda.device_count()
    try:
        torch.cuda.set_device(n)
        res["beyond"] = "ok"
    except RuntimeError as exc:
        res["beyond"] = str(exc)
    try:
        torch.ones(1, device=f"cuda:{n}")
        res["tensor_beyond"] = "ok"
    except RuntimeError as exc:
        res["tensor_beyond"] = str(exc)
except RuntimeError as exc:
    res["error"] = str(exc)
print("RESULT " + json.dumps(res))
'''


def test_cuda_visible_devices_is_read_as_cuda_reads_it(tmp_path):
    # CUDA reads CUDA_VISIBLE_DEVICES when it initialises (CUDA C++ Programming Guide, "CUDA Environment Variables"):
    # a comma-separated list of ordinals or of "GPU-" UUID prefixes, the devices in that order; the list ends at the
    # first entry that names no device, and a repeated entry hides every device (torch/cuda/__init__.py,
    # _parse_visible_devices and _device_count_nvml, read it so). A process that sees no device has no CUDA at all,
    # which a simulation of a GPU cluster refuses with a message naming the variable.
    script = tmp_path / "visible.py"
    script.write_text(VISIBLE)
    mine = {"MINE_1": "3,1", "MINE_2": "1,1", "MINE_3": "2,x,0"}
    # the launching machine's own variable names its GPUs, not the simulated host's: left out, and said so
    proc = phantora_run("--gpus-per-node", "4", "--no-trace", "--", "python", str(script),
                        env_extra={**mine, "CUDA_VISIBLE_DEVICES": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "CUDA_VISIBLE_DEVICES='1' names this machine's GPUs, not the simulated host's" in proc.stderr
    res = {r["rank"]: r for r in results(proc.stdout)}
    assert sorted(res) == [0, 1, 2, 3], proc.stdout[-2000:]
    every = res[0]["uuids"]
    assert res[0]["count"] == 4 and len(set(every)) == 4 and res[0]["generators"] == 4 and res[0]["after"] == 4
    assert "invalid device ordinal" in res[0]["beyond"]
    assert all("invalid device ordinal" in res[r]["tensor_beyond"] for r in (0, 1, 3))    # no tensor there either
    assert (res[1]["count"], res[1]["uuids"], res[1]["generators"], res[1]["after"]) == (2, [every[3], every[1]], 2, 2)
    assert "CUDA_VISIBLE_DEVICES='3,1'" in res[1]["beyond"] and "invalid device ordinal" in res[1]["beyond"]
    assert "CUDA_VISIBLE_DEVICES='1,1'" in res[2]["error"] and "none of" in res[2]["error"]
    assert res[3]["count"] == 1 and res[3]["uuids"] == [every[2]]
    # by UUID prefix: a list that starts with one is read as UUIDs up to the first entry that is not one
    proc = phantora_run("--gpus-per-node", "4", "--no-trace", "--", "python", str(script),
                        env_extra={"MINE_0": f"GPU-{every[3][:8]},GPU-{every[0]}", "MINE_1": f"GPU-{every[2][:8]},1",
                                   "MINE_2": "0,9,0", "MINE_3": "2,9,0"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = {r["rank"]: r for r in results(proc.stdout)}
    assert res[0]["uuids"] == [every[3], every[0]] and res[1]["uuids"] == [every[2]], proc.stdout[-2000:]
    assert "none of" in res[2]["error"]                 # repeated: none, whatever the range
    assert res[3]["uuids"] == [every[2]]                 # up to the ordinal past the host's GPUs
