"""`phantora run` end to end: real rank processes under the stubs, connected to the engine server.

Checks: torchrun's environment; real values through collectives computed here independently (sums, maxima, gathers
of what each rank contributes, with mirrored ranks contributing their representative's value); failures reported with
the right rank and a readable trace; every collective of a live run lasting what the network model says that
collective takes alone (the nccl-tests table of `phantora net bench`); `--ranks auto` giving the numbers of
`--ranks all` on a symmetric workload; replay of a live trace reproducing it exactly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from phantora.cluster import load_cluster
from phantora.net.bench import bench
from phantora.replay import replay
from phantora.trace.reader import TraceReader

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = Path(__file__).resolve().parent / "scripts"
# deterministic CPU side: framework CPU time scaled to 0, so only the modelled launch overhead remains
DETERMINISTIC = ("--set", "host.cpu_time_scale=0")


def phantora_run(*args: str, timeout: int = 300, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    env.pop("PYTORCH_ALLOC_CONF", None)
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "phantora.cli", "run", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=str(ROOT), env=env)


def results(stdout: str) -> list[dict]:
    out = []
    for line in stdout.splitlines():
        if "RESULT " in line:
            out.append(json.loads(line.split("RESULT ", 1)[1]))
    return out


def test_torchrun_environment_and_values_across_ranks(tmp_path):
    world = 4
    proc = phantora_run("--gpus-per-node", str(world), "--no-trace", "--", "python",
                        str(SCRIPTS / "live_values.py"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = sorted(results(proc.stdout), key=lambda r: r["rank"])
    assert [r["rank"] for r in res] == list(range(world))
    ports = {r["env"]["MASTER_PORT"] for r in res}
    assert len(ports) == 1
    for r in res:
        env = r["env"]
        assert env["RANK"] == str(r["rank"]) and env["WORLD_SIZE"] == str(world)
        assert env["LOCAL_RANK"] == str(r["rank"]) and env["LOCAL_WORLD_SIZE"] == str(world)
        assert env["MASTER_ADDR"] == "127.0.0.1" and env["GROUP_RANK"] == "0"
        assert r["sum"] == sum(k + 1 for k in range(world))
        assert r["max"] == world - 1
        assert r["objs"] == [{"rank": k} for k in range(world)]
        assert r["bcast"] == [(world - 1) * 10]
        assert r["gathered"] == [2.0 * k for k in range(world)]
        assert r["ids_ok"] is True                   # a long integer id list (DeepSpeed ZeRO-3's) keeps its values
        # a long float tensor, filled with rank + 1, broadcast: too big to carry; the root keeps its constant, the
        # receivers forget theirs (stale) and read placeholders
        assert r["floats_from_root"] == (1.0 if r["rank"] == 0 else 0.0)
        assert r["a2a"] == [k * 100 + r["rank"] for k in range(world)]    # chunk r of every rank's list
        # unequal sizes: rank k sent rank r r + 1 copies of k * 100 + r, in every form
        expect = [[k * 100 + r["rank"]] * (r["rank"] + 1) for k in range(world)]
        assert r["uneven"] == expect
        assert r["single"] == r["functional"] == [v for chunk in expect for v in chunk]
        assert r["made"] == [[f"cuda:{r['rank']}", [3], "torch.bfloat16"], [f"cuda:{r['rank']}", [2], "torch.float32"],
                             [f"cuda:{r['rank']}", [], "torch.float32"], [5.0, 5.0]]


def test_point_to_point_values_arrive_also_inside_nccl_groups():
    # each rank sends its numbers to the next around a ring; plain ops and NCCL groups alike deliver them (a real GPU
    # would), a group's receives when the group ends: Megatron's pipeline schedules send tensor shapes in a group
    world = 4
    proc = phantora_run("--gpus-per-node", str(world), "--no-trace", "--", "python", str(SCRIPTS / "p2p_values.py"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = sorted(results(proc.stdout), key=lambda r: r["rank"])
    assert [r["rank"] for r in res] == list(range(world))
    for r in res:
        prv = (r["rank"] - 1) % world
        assert r["batch"] == [prv, 10 + prv, 20 + prv]
        assert r["two"] == [100 + prv, 200 + prv]              # two messages to one peer keep their order
        assert r["coalesced"] == [300 + prv, 400 + prv]
        assert r["plain"] == [500 + prv]
    # sender and receiver count the messages that carry values alike, whatever dtype each gives the bytes
    assert res[1]["after_other_dtype"] == [7, 8, 9]
    assert res[1]["into_int32"] == [0, 0]          # unknown, not [1, 2] converted


@pytest.mark.parametrize("call, expect", [
    ("dist.recv(t)", "ProcessGroupNCCL does not support recvAnysource"),     # NCCL's own refusal
    ("dist.send(t, dst=5)", "invalid peer rank 5 for a send in a process group of 2 rank(s)"),
])
def test_point_to_point_misuse_raises_in_the_program(tmp_path, call, expect):
    script = tmp_path / "p2p_misuse.py"
    script.write_text("import os, torch, torch.distributed as dist\n"
                      "dist.init_process_group('nccl'); torch.cuda.set_device(int(os.environ['LOCAL_RANK']))\n"
                      "t = torch.zeros(4, device='cuda')\n"
                      f"{call}\n")
    proc = phantora_run("--gpus-per-node", "2", "--no-trace", "--", "python", str(script))
    assert proc.returncode == 1
    assert expect in proc.stdout + proc.stderr


def test_point_to_point_from_mirrored_ranks_never_waits_for_values_nobody_posts():
    # ranks 0 and 2 of 4 simulated: around the ring each receives from a mirrored rank, whose representative sent to
    # a rank that is mirrored too; the documented rule makes those values unknown (placeholders), and the run ends
    proc = phantora_run("--gpus-per-node", "4", "--ranks", "0,2", "--no-trace", "--", "python",
                        str(SCRIPTS / "p2p_values.py"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = sorted(results(proc.stdout), key=lambda r: r["rank"])
    assert [r["rank"] for r in res] == [0, 2]
    for r in res:
        assert r["batch"] == [0, 0, 0] and r["two"] == [0, 0] and r["coalesced"] == [0, 0] and r["plain"] == [0]


def test_ops_on_large_host_tensors_cost_their_bytes_at_the_host_rates():
    """An op on fake host tensors charges the rank's CPU its bytes over the host preset's measured rate for the op's
    kind at the rank's threads (OMP_NUM_THREADS=4: a measured point of every table but the reduction's): a copy to
    bf16 at the downcast rate, back to fp32 at the upcast rate, fp32 to fp32 at the copy rate; a blocking upload that
    casts converts on the host first, at the downcast rate, and then waits for its copy; a non-blocking one converts
    on the GPU (PyTorch's copy_kernel_cuda), costing the host no conversion, but from pageable memory holds the thread
    while the driver stages the source, as on a GPU host (phantora.probes.copyprobe): between the nominal PCIe Gen5
    rate and the pageable rate measured there; from pinned memory it returns at once."""
    from phantora.cluster import HostSpec

    proc = phantora_run("--gpus-per-node", "1", "--no-trace", "--", "python", str(SCRIPTS / "host_compute.py"),
                        env_extra={"OMP_NUM_THREADS": "4"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    (res,) = results(proc.stdout)
    host, n = HostSpec(), res["n"]

    def expect(nbytes: float, table: list) -> float:
        threads, gbps = zip(*table)
        return nbytes / (float(np.interp(4, threads, gbps)) * 1e9)

    for key, nbytes, table in (("mul_s", 8 * n, host.elementwise_gbps), ("copy_s", 6 * n, host.downcast_gbps),
                               ("norm_s", 4 * n + 4, host.reduction_gbps), ("upcast_s", 6 * n, host.upcast_gbps),
                               ("same_s", 8 * n, host.copy_gbps)):
        want = expect(nbytes, table)
        assert want <= res[key] <= want * 1.01 + 50e-6, (key, res[key], want)
    measured = json.loads((ROOT / "groundtruth" / "hostcpu" / "copies-h200.json").read_text())["copies"]
    pageable = min(r["gbps"] for r in measured if not r["pinned"] and r["direction"] == "h2d" and r["bytes"] >= 1 << 28)

    def staged(nbytes: float) -> tuple[float, float]:        # (fastest, slowest) a pageable upload can take
        return nbytes / 64e9, nbytes / (pageable * 1e9) * 1.2
    lo, hi = staged(2 * n)                              # blocking: bf16 crosses after the host's conversion
    conversion = expect(6 * n, host.downcast_gbps)
    assert conversion + lo <= res["h2d_cast_s"] <= conversion + hi, res["h2d_cast_s"]
    lo, hi = staged(4 * n)                              # non-blocking: the fp32 source is staged, no conversion
    assert lo <= res["h2d_cast_nb_s"] <= hi, res["h2d_cast_nb_s"]
    assert res["h2d_pinned_nb_s"] < 50e-6               # launch only


def test_a_hosts_cores_set_the_threads_of_its_host_compute():
    """With OMP_NUM_THREADS unset a rank's host compute runs at the cluster's `[host] cpu_cores`: `--set
    host.cpu_cores=32` (what the harness passes for a record's `hardware.host_cpu_cores`) prices the in-place multiply
    at the 32-thread point of the element-wise table (measured: groundtruth/deepspeed/h200x2-threads/), and the run
    says so once."""
    from phantora.cluster import HostSpec

    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    proc = subprocess.run([sys.executable, "-m", "phantora.cli", "run", "--gpus-per-node", "1", "--no-trace", "--set",
                           "host.cpu_cores=32", "--", "python", str(SCRIPTS / "host_compute.py")],
                          capture_output=True, text=True, timeout=300, cwd=str(ROOT),
                          env={k: v for k, v in env.items() if k != "PYTHONPATH"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    (res,) = results(proc.stdout)
    rate = dict(HostSpec().elementwise_gbps)[32] * 1e9
    assert 8 * res["n"] / rate <= res["mul_s"] <= 8 * res["n"] / rate * 1.01 + 50e-6, res["mul_s"]
    notes = [ln for ln in proc.stderr.splitlines() if "host compute (" in ln]
    assert len(notes) == 1 and "runs at 32 thread(s) per rank" in notes[0], notes


def test_event_query_is_answered_in_virtual_time():
    """An event after a collective whose peer joins 1 s later (and late in wall time) is not complete at once, and
    is after 2 s more: the answer never depends on how far the peer's process has got (ZeRO-3 polls such events)."""
    proc = phantora_run("--gpus-per-node", "2", "--no-trace", "--", "python", str(SCRIPTS / "event_query.py"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = {r["rank"]: r for r in results(proc.stdout)}
    assert (res[0]["first"], res[0]["second"]) == (False, True)
    assert res[1]["second"] is True
    # polling an event after an 8192^3 bf16 GEMM: the loop's own host time moves the clock, the event completes no
    # earlier than the GEMM could (989 TFLOP/s is the H100's dense bf16 peak) and within a few polls of its end
    for r in res.values():
        assert 0 < r["polls"] < 1_000_000, r
        assert r["kernel_s"] >= 2 * 8192 ** 3 / 989e12, r
        assert r["kernel_s"] <= r["spin_s"] <= r["kernel_s"] + 50e-6, r
        assert "device not ready" in r["early"], r          # elapsed_time before the end event completed
    # polling the work of an asynchronous all_reduce: not complete at once, complete when the network model says
    (expected,) = bench(load_cluster("h100-hgx", gpus_per_node=2), "all_reduce", [64 * 1024 * 1024 * 4])
    for r in res.values():
        assert r["work_first"] is False and 0 < r["work_polls"] < 1_000_000, r
        assert expected.time_us * 1e-6 <= r["work_s"] <= expected.time_us * 1e-6 + 100e-6, (r, expected.time_us)


def test_batch_norm_dtype_mixes_fail_where_a_gpu_fails():
    """groundtruth/deepspeed/bn_dtypes.py prints, per BatchNorm dtype mix, what forward and backward do; under
    simulation it prints what it printed on an H200 (h200x2/bn_dtypes.txt), errors included."""
    gt = ROOT / "groundtruth" / "deepspeed"
    proc = phantora_run("--gpus-per-node", "1", "--no-trace", "--", "python", str(gt / "bn_dtypes.py"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    simulated = ["CASE" + line.split("CASE", 1)[1] for line in proc.stdout.splitlines() if "CASE " in line]
    measured = [line for line in (gt / "h200x2" / "bn_dtypes.txt").read_text().splitlines() if line.startswith("CASE")]
    assert simulated == measured


@pytest.mark.parametrize("args, measured", [((), "chain.txt"), (("--heads", "4", "--seq", "2048"), "chain-h4-s2048.txt"),
                                           (("--sweep",), "sweep.txt")])
def test_softmax_backward_holds_the_memory_it_holds_on_a_gpu(args, measured):
    """groundtruth/insitu/softmax_chain.py prints the peaks of allocated memory of softmax chains' backward (CUDA's
    softmax backward allocates a temporary of its input's size, log_softmax's does not); under simulation it prints
    what it printed on an H200 (h200-softmax/)."""
    gt = ROOT / "groundtruth" / "insitu"
    proc = phantora_run("--cluster", "h200-1gpu", "--no-trace", "--", "python", str(gt / "softmax_chain.py"), *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    simulated = [line.split("]: ", 1)[1] for line in proc.stdout.splitlines() if "peak" in line and "]: " in line]
    assert simulated == (gt / "h200-softmax" / measured).read_text().splitlines()


# measured on the GPU, not modelled (stubs/phantora_stubs/cuda_scratch.py says why): cuDNN workspaces and reserve
# space, CUB's sort and scan temporaries
_SCRATCH_NOT_MODELLED = {("conv2d", "forward"), ("conv2d", "backward"), ("batch_norm", "forward"),
                         ("batch_norm", "backward"), ("sort_topk", "argsort"), ("reductions", "cumsum")}


def _scratch_lines(script: str) -> tuple[dict, dict]:
    """groundtruth/insitu/<script>.py run under simulation on one H200, and its H200 output (h200-scratch/), as
    {(case, part): (peak, kept, beyond)} in MiB; both name the same lines."""
    gt = ROOT / "groundtruth" / "insitu"
    proc = phantora_run("--cluster", "h200-1gpu", "--no-trace", "--", "python", str(gt / f"{script}.py"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    simulated = _scratch_rows(line.split("]: ", 1)[1] for line in proc.stdout.splitlines() if "]: " in line)
    measured = _scratch_rows((gt / "h200-scratch" / f"{script}.txt").read_text().splitlines())
    assert simulated.keys() == measured.keys()
    return simulated, measured


def _scratch_rows(lines):
    out = {}
    for line in lines:
        words = line.split()
        if "peak" in words:
            at = words.index("peak")
            out[(words[0], words[1])] = (float(words[at + 1]), float(words[at + 4]), float(words[at + 7]))
    return out


def test_ops_hold_the_temporaries_they_hold_on_a_gpu():
    """groundtruth/insitu/op_scratch.py prints, per common training op, its peak of allocated memory, what it keeps
    and what it held beyond that; under simulation each modelled op prints what it printed on an H200
    (h200-scratch/), within 1 MiB."""
    simulated, measured = _scratch_lines("op_scratch")
    for key, (peak, kept, beyond) in measured.items():
        if key in _SCRATCH_NOT_MODELLED:
            continue
        got = simulated[key]
        assert abs(got[0] - peak) <= 1.0 and abs(got[1] - kept) <= 1.0 and abs(got[2] - beyond) <= 1.0, (key, got)


def test_attention_backward_holds_what_it_holds_on_a_gpu_over_shapes():
    """groundtruth/insitu/sdpa_scratch.py: SDPA's backward (default, cuDNN, flash, memory-efficient) at seven shapes,
    with and without grouped-query attention, on an H200 (h200-scratch/sdpa_scratch.txt). Simulated, every line's
    peak, kept and held-beyond memory is within 1.5 MiB of the GPU's (cuDNN's softmax statistics are one or two
    vectors depending on the shape; the memory-efficient kernel's dq accumulator at seq 1000 x head_dim 96 is padded
    to 1024 x 128, 4.3 MiB more than the query's size)."""
    simulated, measured = _scratch_lines("sdpa_scratch")
    for key, want in measured.items():
        got = simulated[key]
        assert all(abs(g - w) <= 1.5 for g, w in zip(got, want)), (key, got, want)


def test_gemm_workspaces_are_allocated_as_on_a_gpu():
    """groundtruth/insitu/blas_workspace.py: what cuBLAS and cuBLASLt take from the caching allocator, GEMM after GEMM
    on the default stream, in a backward (the autograd engine's thread), on two side streams, measured on an H200
    (h200-scratch/blas_workspace.txt). Simulated, each line is the GPU's, but the last: a GEMM the program issues
    from a thread it started itself is not intercepted (docs/stubs.md, "Threads")."""
    gt = ROOT / "groundtruth" / "insitu"
    proc = phantora_run("--cluster", "h200-1gpu", "--no-trace", "--", "python", str(gt / "blas_workspace.py"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    simulated = [line.split("]: ", 1)[1] for line in proc.stdout.splitlines() if "beyond the tensors" in line]
    measured = [line for line in (gt / "h200-scratch" / "blas_workspace.txt").read_text().splitlines()
                if "beyond the tensors" in line]
    assert len(simulated) == len(measured) == 10
    assert simulated[:-1] == measured[:-1]


def test_autograd_grad_frees_its_gradients_at_del_on_one_busy_core():
    """The autograd engine's device thread drops its reference to a backward's returned gradients after it wakes
    the caller; on a loaded machine (all on one core) the caller ran on first and the gradients outlived `del`
    (19 or 20 of 20 calls). The memory after each `del` must be what it was before the call, however the simulating
    machine schedules its threads (stubs/phantora_stubs/grad_fence.py)."""
    import shutil
    if shutil.which("taskset") is None:
        pytest.skip("taskset is not installed")
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(["taskset", "-c", "0", sys.executable, "-m", "phantora.cli", "run", "--cluster",
                           "h200-1gpu", "--no-trace", "--", "python", str(SCRIPTS / "grad_release.py")],
                          capture_output=True, text=True, timeout=300, cwd=str(ROOT), env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = results(proc.stdout)[0]
    assert out["after"] == [out["base"]] * len(out["after"]), out


def test_local_rank_argument_and_deepspeed_launcher_variables():
    """--local-rank-arg passes --local_rank=N (N = the rank's GPU on its node) after the script, before the script's
    own arguments, and every rank gets the deepspeed launcher's LOCAL_SIZE / CROSS_RANK / CROSS_SIZE."""
    nodes, gpn = 2, 2
    proc = phantora_run("--nodes", str(nodes), "--gpus-per-node", str(gpn), "--no-trace", "--local-rank-arg", "--",
                        "python", str(SCRIPTS / "local_rank_arg.py"), "--tag", "x")
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = sorted(results(proc.stdout), key=lambda r: int(r["RANK"]))
    assert len(res) == nodes * gpn
    for r in res:
        rank = int(r["RANK"])
        assert r["local_rank"] == rank % gpn == int(r["LOCAL_RANK"]) and r["tag"] == "x"
        assert (r["LOCAL_SIZE"], r["CROSS_RANK"], r["CROSS_SIZE"]) == (str(gpn), str(rank // gpn), str(nodes))
    without = phantora_run("--gpus-per-node", "1", "--no-trace", "--", "python", str(SCRIPTS / "local_rank_arg.py"))
    assert without.returncode != 0 and "--local_rank" in without.stdout + without.stderr


def test_mirrored_ranks_contribute_their_representatives_values():
    world, listed = 4, [0, 2]
    proc = phantora_run("--gpus-per-node", str(world), "--ranks", "0,2", "--no-trace", "--", "python",
                        str(SCRIPTS / "live_values.py"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = results(proc.stdout)
    assert sorted(r["rank"] for r in res) == listed
    rep = [max(s for s in listed if s <= k) for k in range(world)]    # the documented mirroring rule
    for r in res:
        assert r["sum"] == sum(rep[k] + 1 for k in range(world))
        assert r["max"] == max(rep)
        assert r["objs"] == [{"rank": rep[k]} for k in range(world)]
        assert r["gathered"] == [2.0 * rep[k] for k in range(world)]


@pytest.mark.parametrize("mode,expect", [
    ("raise", "rank 1 exited with code 1"),
    ("raise-slow", "rank 1 exited with code 1"),
    ("mismatch", "mismatched collectives"),
    ("exit", "rank 1 exited (code 0) before its program finished"),
    ("hang", "rank 1 made no progress"),
    ("recv", "rank 0 waits for the values of its receive #1 of small tensors from rank 1"),
])
def test_failures_stop_the_run_and_name_the_rank(tmp_path, mode, expect):
    trace = tmp_path / f"{mode}.h5"
    summary = tmp_path / "s.json"
    hang = ("--hang-timeout", "5") if mode == "hang" else ()
    proc = phantora_run("--gpus-per-node", "2", "--trace", str(trace), *hang, "--summary-json", str(summary), "--",
                        "python", str(SCRIPTS / "live_fail.py"), "--mode", mode)
    assert proc.returncode == 1
    assert expect in proc.stderr, proc.stderr[-3000:]
    if mode.startswith("raise"):
        assert "deliberate failure on rank 1" in proc.stderr
        # the summary's missing iteration time is the failure's, not advice to run more steps
        assert "the run stopped before its second iteration mark" in proc.stdout + proc.stderr
    with TraceReader(trace) as rd:                 # closed and readable, with the error recorded
        assert rd.error and expect.split(" (")[0] in rd.error
        assert rd.ranks == [0, 1]
    assert json.loads(summary.read_text())["error"]


def test_live_collectives_last_what_the_network_model_says(tmp_path):
    trace = tmp_path / "ddp.h5"
    dim, layers = 1024, 2
    proc = phantora_run("--gpus-per-node", "4", "--trace", str(trace), "--quiet", "--", "python",
                        str(SCRIPTS / "live_ddp.py"), "--dim", str(dim), "--layers", str(layers), "--steps", "3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    spec = load_cluster("h100-hgx", gpus_per_node=4)
    nbytes = dim * dim * 2                            # one bf16 weight gradient
    (expected,) = bench(spec, "all_reduce", [nbytes])
    with TraceReader(trace) as rd:
        colls = rd.collectives
        names = rd.names
        ar = colls[[names[i] == "all_reduce" for i in colls["name"]]]
        big = ar[ar["nbytes"] == nbytes]
        assert len(big) == layers * 3
        durations = big["end"] - big["start"]
    # the gradients' all-reduces do not overlap one another (one communication stream), so each runs alone
    np.testing.assert_allclose(durations, expected.time_us * 1e-6, rtol=1e-9)


@pytest.mark.parametrize("ranks", ["auto", "all"])
def test_a_device_mesh_made_before_any_process_group(ranks):
    """`init_device_mesh` calls the `init_process_group` that `torch.distributed.device_mesh` imported by name: the
    simulated one, as `dist.init_process_group` is. The original's TCP rendezvous waited, silently and for ever, for
    the ranks that `--ranks auto` does not start. The all-reduce's value: the members' rank + 1 summed (under
    `auto` every member mirrors rank 0, which contributes 1)."""
    world = 2
    proc = phantora_run("--gpus-per-node", str(world), "--ranks", ranks, "--no-trace", "--", "python",
                        str(SCRIPTS / "mesh_without_init.py"), timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = results(proc.stdout)
    assert res and all(r["world"] == world for r in res)
    total = float(sum(range(1, world + 1))) if ranks == "all" else float(world)
    assert all(r["sum"] == [total] * 4 for r in res)


def test_ranks_auto_equals_all_and_replay_reproduces_the_live_run(tmp_path):
    figures = {}
    for mode in ("all", "auto"):
        trace = tmp_path / f"{mode}.h5"
        js = tmp_path / f"{mode}.json"
        proc = phantora_run("--nodes", "2", "--gpus-per-node", "4", "--ranks", mode, *DETERMINISTIC, "--trace",
                            str(trace), "--summary-json", str(js), "--quiet", "--", "python",
                            str(SCRIPTS / "live_ddp.py"), "--dim", "1024", "--steps", "4", timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        figures[mode] = json.loads(js.read_text())
    assert figures["auto"]["simulated_ranks"] == [0]
    assert figures["all"]["simulated_ranks"] == list(range(8))
    assert len(figures["all"]["iterations_s"]) == 3
    np.testing.assert_allclose(figures["auto"]["iterations_s"], figures["all"]["iterations_s"], rtol=1e-9)
    for mode in ("all", "auto"):
        again = replay(tmp_path / f"{mode}.h5")
        np.testing.assert_allclose(again.iterations_s, figures[mode]["iterations_s"], rtol=1e-12)


@pytest.mark.parametrize("conf, reserved_mib", [("", 46), ("expandable_segments:True", 40)])
def test_rank_allocator_follows_its_alloc_conf_and_replay_keeps_it(tmp_path, conf, reserved_mib):
    """3 MiB and 12 MiB blocks share a 20 MiB segment; freed, a 25 MiB block does not fit in it: PyTorch takes a new
    26 MiB segment by default (46 MiB reserved), or grows the expandable segment by one 20 MiB page (40 MiB)."""
    trace = tmp_path / "alloc.h5"
    proc = phantora_run("--gpus-per-node", "1", "--trace", str(trace), "--", "python",
                        str(SCRIPTS / "alloc_pattern.py"), env_extra={"PYTORCH_CUDA_ALLOC_CONF": conf})
    assert proc.returncode == 0, proc.stderr[-3000:]
    (res,) = results(proc.stdout)
    assert res["reserved"] == reserved_mib << 20
    with TraceReader(trace) as rd:
        assert rd.meta["allocator"] == conf
    assert replay(trace).peak_reserved_bytes == {0: reserved_mib << 20}


@pytest.mark.parametrize("pin", ["nopin", "pin"])
def test_dataloader_worker_processes_feed_the_rank_real_batches(pin):
    """DataLoader workers are forked processes computing on real tensors; the rank receives their batches through
    shared memory, in its main thread (no pin memory) or in the pin-memory thread, and gets them whole and in order."""
    proc = phantora_run("--gpus-per-node", "1", "--no-trace", "--", "python",
                        str(ROOT / "tests" / "scripts" / "dataloader_workers.py"), pin)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (line,) = [ln for ln in proc.stdout.splitlines() if '"labels"' in ln]
    labels = json.loads(line.split("]: ", 1)[-1])["labels"]
    assert labels == [list(range(i, i + 8)) for i in range(0, 64, 8)]


def test_torch_save_writes_a_checkpoint_of_shapes_and_costs_its_device_to_host_copies(tmp_path):
    """A checkpoint of fake tensors (stubs/phantora_stubs/saving.py): the file holds every key and shape as meta
    tensors and loads anywhere; each CUDA storage saved is copied to the host once, as torch.save does."""
    import torch

    from phantora.engine.ops import Memcpy, OpKind
    from phantora.trace.reader import TraceReader

    ckpt, trace = tmp_path / "ckpt.pt", tmp_path / "t.h5"
    proc = phantora_run("--gpus-per-node", "1", "--trace", str(trace), "--", "python",
                        str(ROOT / "tests" / "scripts" / "save_checkpoint.py"), str(ckpt))
    assert proc.returncode == 0, proc.stderr[-3000:]
    (line,) = [ln for ln in proc.stdout.splitlines() if "cuda_bytes" in ln]
    said = json.loads(line.split("]: ", 1)[-1])
    state = torch.load(ckpt)
    assert state["step"] == 1
    assert {k: list(v.shape) for k, v in state["model"].items()} == said["shapes"]
    assert all(v.device.type == "meta" for v in state["model"].values())
    assert set(state["opt"]["state"]) == {0, 1, 2, 3}
    assert ckpt.stat().st_size < 100_000            # shapes, not the 2 MB of data
    with TraceReader(trace) as r:
        ops = r.ops(0)
    d2h = ops[(ops["kind"] == OpKind.MEMCPY) & (ops["arg"] == Memcpy.D2H)]
    assert int(d2h["nbytes"].sum()) == said["cuda_bytes"]


def test_fake_tensors_have_distinct_data_pointers_shared_by_their_views():
    """A meta storage's pointer is 0 for all: read as data, every tensor would share memory with every other."""
    proc = phantora_run("--gpus-per-node", "1", "--no-trace", "--", "python",
                        str(ROOT / "tests" / "scripts" / "data_pointers.py"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    (line,) = [ln for ln in proc.stdout.splitlines() if '"view"' in ln]
    p = json.loads(line.split("]: ", 1)[-1])
    assert p["a"] != p["b"] and p["a"] != 0 and p["b"] != 0
    assert p["view"] == p["a"] + 10 * 4                       # float32 elements
    assert p["a_storage"] == p["view_storage"] == p["a"]
    assert p["a"] % 512 == 0 and p["b"] % 512 == 0             # the CUDA caching allocator's alignment
    assert p["empty"] == 0
    assert len(set(p["params"])) == 4


def test_fsdp1_trains_and_gathers_a_full_state_dict():
    """FSDP1 records streams with the modes switched off (no_dispatch), which reaches the CUDA backend; its sharded
    state dict asks the process group for its default device (the backends' device types)."""
    proc = phantora_run("--gpus-per-node", "2", "--no-trace", "--", "python",
                        str(ROOT / "tests" / "scripts" / "fsdp1_steps.py"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "trained 24" in proc.stdout
    assert "sharded 24 ['cuda']" in proc.stdout          # an NCCL group serves CUDA tensors, as its backend says


def test_torch_profiler_with_its_cuda_activity_runs_on_the_cpu_activity(tmp_path):
    """A CPU build of torch has no CUDA profiler: asked for, it warned with a stack trace around every op."""
    out = tmp_path / "profile.json"
    proc = phantora_run("--gpus-per-node", "1", "--no-trace", "--", "python",
                        str(ROOT / "tests" / "scripts" / "torch_profiler.py"), str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Failed to record CUDA event" not in proc.stdout + proc.stderr
    (line,) = [ln for ln in proc.stdout.splitlines() if "]: profiled " in ln]
    aten_events, legacy_events = (int(x) for x in line.split("profiled", 1)[1].split())
    assert aten_events > 10 and legacy_events > 0
    assert (proc.stdout + proc.stderr).count("torch.profiler runs without its CUDA activity") == 1


def test_setting_data_moves_a_fake_tensor_and_its_value():
    """`t.data = new` swapped a fake tensor's storage but kept its device and known value: a CPU model under FSDP2
    (fully_shard moves its parameters so) stopped with "Expects the parameter to already be moved to device"."""
    proc = phantora_run("--gpus-per-node", "2", "--no-trace", "--", "python",
                        str(ROOT / "tests" / "scripts" / "set_data.py"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    (line,) = [ln for ln in proc.stdout.splitlines() if '"param"' in ln]
    out = json.loads(line.split("]: ", 1)[-1])
    assert out["param"] == ["cuda:0", "torch.bfloat16", True]
    assert out["value"] == [[5.0, 6.0, 7.0], "cuda:0"]
    assert out["forgotten"] == [0.0, 0.0]
    assert out["sharded"] == ["cuda:0"]


def test_a_compiled_ddp_model_breaks_its_graph_where_torch_calls_cpp():
    """torch.compile over DistributedDataParallel: Dynamo took the stand-ins of torch's C++ (`_broadcast_coalesced`,
    reached from DDP's forward) for frames to compile, and stopped at the process group ("unregistered member on an
    OpaqueObject"). They are skipped as C functions are: the run trains, with graph breaks there."""
    proc = phantora_run("--gpus-per-node", "2", "--no-trace", "--", "python",
                        str(ROOT / "tests" / "scripts" / "compiled_ddp.py"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "trained" in proc.stdout
    (report,) = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "[rank0]: phantora: torch.compile:" in ln]
    breaks = int(report.split(" graph break(s)")[0].rsplit(" ", 1)[-1])
    assert breaks >= 1, report


def test_reading_data_runs_no_counted_python(tmp_path):
    """`t.data` is torch's C getter on a fake tensor too: 1,000 reads in a loop count the loop's 2,000 lines and no
    Python call each (a Python getter counted a call and a line per read)."""
    trace = tmp_path / "t.h5"
    proc = phantora_run("--gpus-per-node", "1", "--trace", str(trace), "--", "python",
                        str(ROOT / "tests" / "scripts" / "data_reads.py"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    with TraceReader(trace) as r:
        ops = r.ops(0)
    (loop,) = ops[ops["host_line"] >= 2000]
    assert int(loop["host_py"]) < 100 and int(loop["host_line"]) < 2100


def test_known_values_follow_views_and_collectives_as_on_a_gpu():
    """A collective into a view writes its base; an in-place gather keeps every member's row; a view overwritten
    with data of unknown value leaves its base unknown, not stale; f"{loss:.2f}" formats a 0-d tensor; isfinite of an
    unknown value agrees with isnan (no inf or NaN assumed), on a small or a large tensor; a tensor prints as torch prints one on a GPU; bf16 values travel through an all-reduce; reduce gives
    the root the sum and leaves the others' tensors; reduce-scatter gives each member its chunk of the sum; a known
    all-True operand decides a boolean or (Hugging Face's generate() stops at its max length)."""
    proc = phantora_run("--gpus-per-node", "2", "--no-trace", "--", "python", str(SCRIPTS / "value_views.py"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = sorted(results(proc.stdout), key=lambda r: r["rank"])
    assert len(res) == 2
    gathered = [[0.5, 7.0], [1.5, 7.0]]
    for r in res:
        assert r["into_view"] == gathered and r["in_place"] == gathered
        assert r["list_views"] == [0.5, 7.0, 1.5, 7.0]
        assert r["overwritten"][:2] != [3.0, 3.0]                # not the value the elements had before the copy
        assert r["fmt_known"] == "1.500" and float(r["fmt_unknown"]) >= 0.0
        assert r["isfinite"] is True and r["isfinite_method"] is True and r["isnan"] is False
        # a gradient check on a tensor of 2^20 elements agrees with isnan too, whichever way it is written
        assert (r["grad_finite_all"], r["grad_nonfinite_any"], r["grad_finite_rows"], r["grad_nan_any"]) == \
            (True, False, True, False)
        assert r["grad_views_all"] == [True] * 4          # its views and aliases hold the same value
        assert r["grad_written_all"] is False             # zeroed through a view: not all True any more
        assert r["bf16_all_reduce"] == [2.0] * 4                    # numpy has no bf16: carried as float32
        assert r["reduce_scattered"] == [2.0 * x for x in range(4 * r["rank"], 4 * r["rank"] + 4)]
        assert r["stop"] is True                                  # generate() stops at its max length
        if r["rank"] == 0:                                        # the root's own chunk, as NCCL copies it
            assert r["scatter_root"] == [5.0, 5.0] and r["gather_root_own"] == [0.5, 7.0]
        assert r["unknown_or"] == [False, False]                  # False | unknown stays unknown: placeholders
        dev = f"device='cuda:{r['rank']}'"                       # as torch prints a tensor on a GPU
        assert r["repr_known"] == f"tensor([1.5000, 2.5000], {dev})"
        assert r["repr_grad"] == f"tensor([2., 2.], {dev}, grad_fn=<MulBackward0>)"
        assert r["repr_leaf"] == f"tensor([1., 1.], {dev}, requires_grad=True)"
        assert r["repr_bf16"] == f"tensor(1., {dev}, dtype=torch.bfloat16)"
        assert float(r["print_loss"]) == float(r["fmt_unknown"])
    assert res[0]["reduced"] == [3.0] * 4 and res[1]["reduced"] == [2.0] * 4    # the root's sum; the other's own


def test_copies_between_host_and_gpu_hold_the_thread_as_on_a_gpu_host():
    """What copy_ between host and GPU does to the calling thread, against what phantora.probes.copyprobe measured on
    an H200 host (groundtruth/hostcpu/copies-h200.json): a blocking copy returns when it is done, and behind a busy
    stream waits for it; a non-blocking one to or from pinned memory returns at once; a non-blocking download to
    pageable memory waits like a blocking one; pageable copies run at the measured share of the pinned rate. Views
    and `.data` of pinned memory are pinned (CUDA checks the pointer), and pinning a small tensor keeps its value."""
    proc = phantora_run("--cluster", "h200-1gpu", "--no-trace", "--", "python", str(SCRIPTS / "copy_semantics.py"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    (res,) = results(proc.stdout)
    measured = json.loads((ROOT / "groundtruth" / "hostcpu" / "copies-h200.json").read_text())
    real = {f"{r['direction']}_{'pinned' if r['pinned'] else 'pageable'}_{'nb' if r['non_blocking'] else 'blocking'}":
            (r["return_ms"], r["done_ms"]) for r in measured["copies"] if r["bytes"] == 1 << 30}
    for case, (real_back, real_done) in real.items():
        back, done = res[case]
        # returns at once where the real copy did (under a tenth of its time), else when done, as the real one
        assert (back < 0.1 * done) == (real_back < 0.1 * real_done), (case, back, done, real_back, real_done)
    for direction in ("h2d", "d2h"):
        ratio = res[f"{direction}_pageable_blocking"][1] / res[f"{direction}_pinned_blocking"][1]
        real_ratio = real[f"{direction}_pageable_blocking"][1] / real[f"{direction}_pinned_blocking"][1]
        assert ratio == pytest.approx(real_ratio, rel=0.15), (direction, ratio, real_ratio)
    busy = measured["behind_busy_stream"]
    for case in ("pinned_blocking", "pinned_nb", "pageable_blocking"):
        back, done = res[f"busy_h2d_{case}"]
        real_back = busy[f"after_busy_h2d_{case.replace('nb', 'non_blocking')}"]["return_ms"]
        waited = real_back > 0.5 * measured["busy_ms"]
        assert (back > 0.5 * done) == waited, (case, back, done)
    assert res["pinned_views"] == [True, True, True, False]
    assert res["small_pinned"] == [[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]]


def test_ddp_with_a_parameter_that_gets_no_gradient_behaves_as_on_a_gpu(tmp_path):
    """DDP over a model with an unused layer: with find_unused_parameters=True every step all-reduces the whole
    gradient (the unused layer's bucket too, as the Reducer marks its parameters ready) and the map of used
    parameters (int32, one per parameter), and leaves the unused layer's gradient None, as measured on two H200
    (a layer only rank 0 uses gets its gradient on both ranks); without it the second step raises the Reducer's
    "Expected to have finished reduction in the prior iteration" error."""
    trace = tmp_path / "t.h5"
    proc = phantora_run("--nodes", "1", "--gpus-per-node", "2", "--trace", str(trace), "--", "python",
                        str(SCRIPTS / "ddp_unused.py"), "1")
    assert proc.returncode == 0 and "TRAINED" in proc.stdout, proc.stderr[-3000:]
    grad_bytes = int(proc.stdout.split("GRAD_BYTES ", 1)[1].split()[0])
    res = results(proc.stdout)
    assert len(res) == 2
    for r in res:
        assert r["grad"] == {"a": True, "b": True, "unused": False, "part": False}, r
    from phantora.engine.ops import OpKind
    with TraceReader(str(trace)) as r:
        ops, names = r.ops(0), r.names
    coll = ops[ops["kind"] == int(OpKind.COLLECTIVE)]
    sizes = [int(b) for n, b in zip(coll["name"], coll["nbytes"]) if names[int(n)] == "all_reduce"]
    map_bytes = 4 * res[0]["params"]
    assert sizes.count(map_bytes) == 3, sizes
    assert sum(b for b in sizes if b != map_bytes) == 3 * grad_bytes, (sizes, grad_bytes)
    # a backward pass that raises (caught by the script) all-reduces no map
    proc = phantora_run("--nodes", "1", "--gpus-per-node", "2", "--trace", str(trace), "--overwrite", "--", "python",
                        str(SCRIPTS / "ddp_unused.py"), "1", "raise")
    assert proc.returncode == 0 and "TRAINED" in proc.stdout, proc.stderr[-3000:]
    with TraceReader(str(trace)) as r:
        ops, names = r.ops(0), r.names
    coll = ops[ops["kind"] == int(OpKind.COLLECTIVE)]
    sizes = [int(b) for n, b in zip(coll["name"], coll["nbytes"]) if names[int(n)] == "all_reduce"]
    assert sizes.count(map_bytes) == 3, sizes
    proc = phantora_run("--nodes", "1", "--gpus-per-node", "2", "--no-trace", "--", "python",
                        str(SCRIPTS / "ddp_unused.py"), "1", "half")
    assert proc.returncode == 0, proc.stderr[-3000:]
    for r in results(proc.stdout):
        assert r["grad"] == {"a": True, "b": True, "unused": False, "part": True}, r
    proc = phantora_run("--nodes", "1", "--gpus-per-node", "2", "--no-trace", "--", "python",
                        str(SCRIPTS / "ddp_unused.py"), "0")
    assert proc.returncode != 0 and "Expected to have finished reduction" in proc.stdout + proc.stderr
    assert "TRAINED" not in proc.stdout


def test_object_collectives_carry_tensors_as_pickles_do():
    """all_gather_object, broadcast_object_list and send/recv_object_list of objects holding tensors: each rank gets
    tensors of the sender's shape, dtype and device (as unpickling a CUDA tensor gives), with the sender's known
    values."""
    proc = phantora_run("--gpus-per-node", "2", "--no-trace", "--", "python", str(SCRIPTS / "object_tensors.py"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = sorted(results(proc.stdout), key=lambda r: r["rank"])
    assert len(res) == 2
    for r in res:
        assert r["gathered"] == [[0, 1, 2, 3], [0, 2, 4, 6]] and r["steps"] == [3.0, 4.0]
        assert r["big"] == [[1 << 20], [1 << 20]] and r["devices"] == ["cuda:0", "cuda:1"]
        assert r["broadcast"] == [[0, 1, 2, 3], "x"]
    assert res[1]["received"] == [7, 8]


def test_safetensors_files_of_simulated_tensors(tmp_path):
    """safetensors reads a tensor's memory through its data pointer, which a simulated tensor lacks: save_file
    writes a file safetensors itself reads back (names, shapes, dtypes; the data zeros, in a sparse file), after the
    device-to-host copy of each CUDA tensor (at least its bytes over PCIe Gen5's 64 GB/s); load_file and safe_open
    give the saved shapes."""
    safetensors = pytest.importorskip("safetensors")
    path = tmp_path / "m.safetensors"
    proc = phantora_run("--cluster", "h200-1gpu", "--no-trace", "--", "python", str(SCRIPTS / "safetensors_save.py"),
                        str(path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    (res,) = results(proc.stdout)
    with safetensors.safe_open(str(path), framework="pt") as f:          # the real library, outside the run
        assert sorted(f.keys()) == ["b", "steps", "w"] and f.metadata() == {"format": "pt"}
        assert list(f.get_slice("w").get_shape()) == [1024, 1024] and f.get_slice("w").get_dtype() == "BF16"
        assert int(f.get_tensor("b").abs().sum()) == 0
    assert path.stat().st_blocks * 512 < 1 << 20                         # 2 MiB of data, not written
    assert res["save_s"] >= (2 * 1024 * 1024 + 4 * 1024 + 24) / 64e9
    assert res["loaded"] == {"w": [[1024, 1024], "torch.bfloat16", "cuda:0"], "b": [[1024], "torch.float32", "cuda:0"],
                             "steps": [[3], "torch.int64", "cuda:0"]}
    assert res["opened"] == {"b": [1024], "steps": [3], "w": [1024, 1024]} and res["sliced"] == [10, 1024]


@pytest.mark.parametrize("where,weight,step", [("none", "cuda:0", "cpu"), ("cpu", "cpu", "cpu"),
                                               ("cuda", "cuda:0", "cuda:0")])
def test_a_checkpoint_loads_back_and_training_resumes(tmp_path, where, weight, step):
    """torch.load of a rank's checkpoint puts each tensor where a GPU run's torch.load would (its saved device, or
    map_location's), with the small values it had (AdamW's step count, a saved metric), and the optimizer steps on."""
    proc = phantora_run("--cluster", "h100-1gpu", "--no-trace", "--", "python", str(SCRIPTS / "resume_checkpoint.py"),
                        str(tmp_path / "ck.pt"), where)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (res,) = results(proc.stdout)
    assert res["weight"] == weight and res["step"] == step and res["shape"] == [16, 16]
    assert res["step_value"] == 1.0 and res["best"] == 0.25 and res["epoch"] == 3
    assert res["size"] == ["Size", 256]
    assert res["pair"] == ["Pair", "w", weight, [16, 16]]


def test_datasets_of_the_rank_s_tensors_and_shuffled_samplers_give_the_batches_plain_pytorch_gives():
    """Workers (forked and spawned) read a dataset the rank built from its own tensors, and a shuffled
    DistributedSampler picks from 10,000 samples: each rank receives what plain PyTorch gives the same rank, values
    included, and the CPU generator is left where PyTorch leaves it. A forked worker that touches a GPU tensor fails
    with CUDA's own error (torch/cuda/__init__.py, `_lazy_init`)."""
    script = str(ROOT / "tests" / "scripts" / "dataloader_datasets.py")
    proc = phantora_run("--gpus-per-node", "2", "--no-trace", "--hang-timeout", "120", "--", "python", script, "cuda")
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    got = {}
    for line in proc.stdout.splitlines():
        if "RESULT " in line:
            got[int(line.split("[rank", 1)[1].split("]", 1)[0])] = json.loads(line.split("RESULT ", 1)[1])
    assert sorted(got) == [0, 1]
    for rank in (0, 1):
        env = {k: v for k, v in os.environ.items() if not k.startswith("PHANTORA")}
        env.update(RANK=str(rank), WORLD_SIZE="2")
        plain = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=300, env=env)
        assert plain.returncode == 0, plain.stderr[-3000:]
        want = json.loads(plain.stdout.split("RESULT ", 1)[1])
        assert "Cannot re-initialize CUDA in forked subprocess" in got[rank].pop("cuda")
        assert got[rank] == want
    assert got[0]["sampled"] != got[1]["sampled"]          # the ranks read different samples


@pytest.mark.parametrize("mode", ["ahead", "sync"])
def test_kernel_flops_per_iteration_whether_or_not_the_host_runs_ahead(tmp_path, mode):
    """The summary's kernel FLOPs per iteration are the GEMMs' 22 x 2 x 8192^3 (the element-wise kernels add under
    0.1%) whether the host waits for the GPU each iteration or issues iterations ahead of it (they were counted by
    when the host issued them, and read 0 when it ran ahead), and the kernel rate stays under the H100's peak."""
    js = tmp_path / "s.json"
    proc = phantora_run("--gpus-per-node", "1", "--trace", str(tmp_path / "t.h5"), "--summary-json", str(js), "--",
                        "python", str(SCRIPTS / "host_ahead.py"), mode)
    assert proc.returncode == 0, proc.stderr[-3000:]
    s = json.loads(js.read_text())
    gemms = 22 * 2 * 8192 ** 3
    assert gemms <= s["flops_per_iteration"] <= gemms * 1.001, s["flops_per_iteration"]
    assert s["flops_per_iteration"] / s["iteration_s"] < 989e12


def test_nvtx_profiling_data_parallel_and_sparse_gradients():
    """emit_nvtx() runs (a CPU build's C++ profiler refused it); nn.DataParallel over one device runs and over two
    stops with a message naming DistributedDataParallel (was an AttributeError of torch._C); a sparse embedding's
    gradient, whose number of elements depends on the data (a fake one stores none: it would cost nothing), stops
    with a message (the memory tracker stopped on the sparse tensor's storage, with an internal error)."""
    proc = phantora_run("--gpus-per-node", "2", "--ranks", "0", "--no-trace", "--", "python",
                        str(SCRIPTS / "surfaces_more.py"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    (r,) = results(proc.stdout)
    assert r["emit_nvtx"] is True and r["dp_one"] == [8, 64]
    assert r["dp_two"].startswith("UnsupportedOpError") and "DistributedDataParallel" in r["dp_two"]
    assert r["sparse"].startswith("UnsupportedOpError") and "depends on the data" in r["sparse"]
    # a data-dependent op reads back its count, not its input: under the time a 64 MiB mask takes over the host
    # link even pinned (55 GB/s measured on an H200 host: groundtruth/hostcpu/copies-h200.json)
    assert r["nonzero_s"] < (64 << 20) / 55e9, r["nonzero_s"]
    # PyTorch's words under a memory fraction: the device's total capacity, then what the fraction allows
    total = load_cluster("h100-hgx", nodes=1, gpus_per_node=2).vram_bytes()
    assert f"has a total capacity of {total / 2**30:.2f} GiB" in r["oom"], r["oom"]
    assert f"{int(total * 0.1) / 2**30:.2f} GiB allowed; Of the allocated memory" in r["oom"], r["oom"]


@pytest.mark.parametrize("gpu, runs", [("a100-sxm-80gb", False), ("rtx-3090", False), ("h100-sxm-80gb", True)])
def test_fp8_gemms_need_fp8_tensor_cores(gpu, runs):
    """torch._scaled_mm runs on sm89+ and raises CUDA's message on an A100 (sm80) or an RTX 3090 (sm86): the GPU
    presets' compute capabilities, as ATen checks them."""
    proc = phantora_run("--gpus-per-node", "1", "--gpu", gpu, "--no-trace", "--", "python",
                        str(SCRIPTS / "fp8_capability.py"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    (r,) = results(proc.stdout)
    if runs:
        assert r["result"] == "ran"
    else:
        assert "compute capability >= 9.0 or 8.9" in r["result"], r


@pytest.mark.parametrize("mode, note", [("turns", True), ("phases", False)])
def test_two_optimizers_taking_turns_are_named_and_a_replaced_one_is_not(mode, note):
    """Each outermost optimizer step marks an iteration. Two optimizers that take turns within a training step
    (a GAN's) make the summary's iterations per optimizer step: the run says so. An optimizer replaced by a new one
    (a new phase; the old one freed, whose id() the new one may or may not reuse) still marks one iteration per
    training step, and gets no note."""
    proc = phantora_run("--gpus-per-node", "1", "--no-trace", "--", "python", str(SCRIPTS / "optimizer_turns.py"),
                        mode)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (r,) = results(proc.stdout)
    assert r["steps"] == 6
    out = proc.stdout + proc.stderr
    assert ("optimizer step marks an iteration" in out) is note, out[-3000:]


@pytest.mark.parametrize("mode, note", [("split", True), ("one", False)])
def test_one_process_driving_two_gpus_is_told_it_is_simulated_as_one(mode, note):
    """A model split over cuda:0 and cuda:1 in one process runs on one simulated GPU's timeline and memory (one
    process per GPU is what is simulated): the run must say so, and a process on one device must not."""
    proc = phantora_run("--gpus-per-node", "2", "--ranks", "0", "--no-trace", "--", "python",
                        str(SCRIPTS / "two_devices.py"), mode)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert ("runs kernels on cuda:0 and cuda:1" in proc.stdout + proc.stderr) is note, proc.stderr[-3000:]


def test_sdpa_restricted_to_backends_that_refuse_the_inputs_fails_as_on_a_gpu():
    """`sdpa_kernel([FLASH_ATTENTION])` with inputs flash refuses (fp32, a mask) raises PyTorch's "No available
    kernel" on a CUDA build; it ran the math backend the program had disabled, costed ~40 times a flash kernel."""
    proc = phantora_run("--gpus-per-node", "1", "--no-trace", "--", "python", str(SCRIPTS / "sdpa_restricted.py"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    (r,) = results(proc.stdout)
    assert r["flash_fp32"].startswith("No available kernel") and r["flash_bf16_mask"].startswith("No available")
    assert r["flash_bf16"] == "ran" and r["flash_math_fp32"] == "ran"


def test_device_generic_streams_and_events_order_and_time_the_work():
    """torch.Event / torch.Stream / torch.accelerator (the device-generic API) as on a GPU: an event pair's elapsed
    time is the GPU time between them (it read 0.0), reading it before the GPU got there fails as c10::Event's
    check does on a GPU ("Both events must be completed"), and a side stream that waits for the current one runs after it (its wait was dropped: twenty dependent
    GEMMs took the time of ten)."""
    proc = phantora_run("--gpus-per-node", "1", "--no-trace", "--", "python", str(SCRIPTS / "generic_streams.py"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    (r,) = results(proc.stdout)
    gemm_ms = 2 * 8192 ** 3 / load_cluster("h100-hgx", nodes=1).gpu_spec().peak_flops("bf16") * 1e3
    assert r["serial_ms"] >= 10 * gemm_ms                     # no faster than the GPU's peak
    assert r["event_ms"] == pytest.approx(r["serial_ms"], rel=0.01)
    assert "must be completed" in r["early"]
    assert r["dependent_ms"] >= 2 * r["serial_ms"] * 0.99


def test_all_gather_into_tensors_of_different_sizes_runs_as_with_nccl():
    """A list all_gather whose members contribute different sizes is valid with NCCL (a coalesced broadcast of each
    member's tensor); it was refused as mismatched collectives. The small tensors' values arrive, and the time is at
    least what the bytes a rank receives take over its NVLink (physics, not the model's figure)."""
    proc = phantora_run("--gpus-per-node", "2", "--no-trace", "--", "python", str(SCRIPTS / "uneven_gather.py"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = results(proc.stdout)
    assert len(out) == 2
    gpu = load_cluster("h100-hgx", nodes=1, gpus_per_node=2).gpu_spec()
    for r in out:
        assert r["values"] == [[0.0], [1.0, 1.0]]
        assert r["ms"] * 1e-3 >= r["bytes_in"] / (gpu.nvlink_gbyte_per_s * 1e9)


def test_replay_forces_the_collective_choice_the_live_run_forced(tmp_path):
    """A run with `--proto LL` is replayed with LL again (the trace records it): a plain replay on the recorded
    cluster reproduces the run; `--proto auto` gives NCCL's own choice, which for these all-reduces of a few MiB
    over two nodes differs (a replay that dropped the forced protocol read 87.6 against 244.6 ms, with no word)."""
    trace = tmp_path / "ll.h5"
    js = tmp_path / "ll.json"
    proc = phantora_run("--nodes", "2", "--gpus-per-node", "2", "--ranks", "auto", "--proto", "LL", *DETERMINISTIC,
                        "--trace", str(trace), "--summary-json", str(js), "--quiet", "--", "python",
                        str(SCRIPTS / "live_ddp.py"), "--dim", "2048", "--steps", "4", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    live = json.loads(js.read_text())["iterations_s"]
    again = replay(trace)
    assert again.recorded_choice == "--proto LL"
    # the run's own --set (host.cpu_time_scale=0) is not a change of the preset since the trace
    assert again.preset_drift == [], again.preset_drift
    np.testing.assert_allclose(again.iterations_s, live, rtol=1e-12)
    auto = replay(trace, proto="auto")
    assert auto.recorded_choice == "" and auto.iteration_s != pytest.approx(again.iteration_s, rel=1e-3)


def test_a_fill_makes_an_unknown_small_tensor_known():
    """Writing a known number into every element of a small tensor whose value is unknown (`fill_`, `zero_`,
    `nn.init.constant_`, `t[:] = 2`) makes it read that number, as on a GPU (it read zeros: the placeholder)."""
    proc = phantora_run("--gpus-per-node", "1", "--no-trace", "--", "python", str(SCRIPTS / "fill_values.py"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    (r,) = results(proc.stdout)
    assert r == {"fill": [3.0] * 4, "zero": [0.0] * 4, "bias": [0.5] * 4, "slice": [2.0] * 4,
                 "fill_tensor": [1.5] * 4, "sum": 20.0}
