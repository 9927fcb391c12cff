"""The rank-side stubs, end to end: plain PyTorch scripts run in a subprocess with PYTHONPATH=stubs:. and
PHANTORA_RANK=0 PHANTORA_WORLD_SIZE=1 PHANTORA_RUNTIME=local. The checks are physics (roofline lower bounds from the
GPU preset's datasheet peaks), byte counts computed here from the shapes, the CUDA caching allocator's documented
rounding, and invariants of the op stream (each collective ordered after the stream that issued it).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from phantora.gpus import load_gpu

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = Path(__file__).resolve().parent / "scripts"
sys.path.insert(0, str(ROOT / "stubs"))

from phantora_stubs import build  # noqa: E402  (no torch import: safe in the test process)


def rank_env(cache: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PHANTORA_") or k == "PHANTORA_FAKE_CUDA"}
    env.update(PYTHONPATH=f"{ROOT / 'stubs'}{os.pathsep}{ROOT}", PHANTORA_RANK="0", PHANTORA_WORLD_SIZE="1",
               PHANTORA_RUNTIME="local", XDG_CACHE_HOME=str(cache))
    env.update(extra)
    return env


def run_script(name: str, cache: Path, *args: str, oplog: Path | None = None, **env: str) -> dict:
    extra = dict(env)
    if oplog is not None:
        extra["PHANTORA_OPLOG"] = str(oplog)
    proc = subprocess.run([sys.executable, str(SCRIPTS / name), *args], env=rank_env(cache, **extra),
                          capture_output=True, text=True, timeout=300, cwd=str(ROOT))
    assert proc.returncode == 0, f"{name} failed:\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def read_oplog(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def marker_line(script: str, marker: str) -> int:
    for i, line in enumerate((SCRIPTS / script).read_text().splitlines(), start=1):
        if marker in line:
            return i
    raise AssertionError(f"marker {marker} not in {script}")


# ---- training step: time and memory ---------------------------------------------------------------------------------

MLP = dict(batch=4096, d_in=2048, d_hidden=8192, d_out=2048, steps=2)


@pytest.fixture(scope="module")
def mlp_run(stub_cache, tmp_path_factory):
    oplog = tmp_path_factory.mktemp("mlp") / "ops.jsonl"
    out = run_script("train_mlp.py", stub_cache, *(str(MLP[k]) for k in ("batch", "d_in", "d_hidden", "d_out",
                                                                          "steps")), oplog=oplog)
    return out, read_oplog(oplog)


def test_training_step_time_is_at_least_the_matmul_roofline(mlp_run):
    out, ops = mlp_run
    gpu = load_gpu("h100-sxm-80gb")
    b, i, h, o = MLP["batch"], MLP["d_in"], MLP["d_hidden"], MLP["d_out"]
    # per step: forward x@W1, h@W2; backward dW2, dH, dW1 (x needs no gradient): 2*M*N*K FLOPs each
    matmuls = [(b, h, i), (b, o, h), (o, h, b), (b, h, o), (h, i, b)]
    bound = 0.0
    for m, n, k in matmuls:
        flops = 2.0 * m * n * k
        nbytes = 2.0 * (m * k + k * n + m * n)            # bf16 operands read once, result written once
        bound += max(flops / (gpu.peak_tflops["bf16"] * 1e12), nbytes / (gpu.hbm_bandwidth_gbyte_per_s * 1e9))
    bound *= MLP["steps"]
    assert bound > 1e-3                                    # the workload is big enough to matter
    # the costed matmul kernels respect the roofline ...
    mm_time = sum(op["duration"] for op in ops if op["kind"] == "KERNEL" and op["name"].split(".")[1] in
                  ("mm", "addmm"))
    assert mm_time >= bound
    # ... and the timed loop (ending in torch.cuda.synchronize) lasts at least as long as the GPU work in it
    syncs = [k for k, op in enumerate(ops) if op["kind"] == "SYNC_DEVICE"]
    first, last = syncs[-2], syncs[-1]
    gpu_busy = sum(op["duration"] for op in ops[first:last] if op["kind"] == "KERNEL")
    assert gpu_busy >= bound
    assert out["elapsed_s"] >= gpu_busy
    assert out["elapsed_s"] < 10.0                          # simulated, not wall-clock of this machine's CPU work


def test_memory_allocated_is_params_grads_and_adamw_state(mlp_run):
    out, _ = mlp_run
    i, h, o = MLP["d_in"], MLP["d_hidden"], MLP["d_out"]
    param_elems = [i * h, h, h * o, o]
    # bf16 parameters, their gradients, and AdamW's exp_avg / exp_avg_sq in the parameters' dtype; the step
    # counters of the default (foreach, non-capturable) AdamW live on the host
    exact = 4 * sum(2 * n for n in param_elems)
    n_tensors = 4 * len(param_elems)
    assert out["n_cuda_state_tensors"] == 2 * len(param_elems)
    # and the GEMM libraries' workspaces, kept once taken (groundtruth/insitu/h200-scratch/blas_workspace.txt, an
    # sm90 GPU as this H100): cuBLAS's 32 MiB and cuBLASLt's 1 MiB for the forward's biased Linear, cuBLAS's 32 MiB
    # on the autograd engine's thread for the backward's GEMMs
    exact += (32 + 1 + 32) * 2**20
    # c10/cuda/CUDACachingAllocator.cpp rounds every block up to a multiple of kMinBlockSize = 512 bytes
    assert exact <= out["memory_allocated"] <= exact + 511 * n_tensors
    activations = 2 * MLP["batch"] * MLP["d_hidden"]       # at least the hidden activation existed during a step
    assert out["max_memory_allocated"] >= out["memory_allocated"] + activations
    assert out["memory_reserved"] >= out["memory_allocated"]


def test_kernels_carry_costs_and_framework_cpu_time(mlp_run):
    _, ops = mlp_run
    kernels = [op for op in ops if op["kind"] == "KERNEL"]
    mms = [op for op in kernels if op["name"].split(".")[1] in ("mm", "addmm")]
    assert len(mms) >= 5 * MLP["steps"]
    assert all(op["duration"] > 0 and op["flops"] > 0 and op["sig"] >= 0 for op in mms)
    assert sum(op["cpu_delta"] for op in ops) > 0          # the framework's own CPU time is charged
    # allocations and frees pair up by block id; no block is freed twice
    allocs = {op["arg"] for op in ops if op["kind"] == "ALLOC"}
    frees = [op["arg"] for op in ops if op["kind"] == "FREE"]
    assert len(frees) == len(set(frees)) and set(frees) <= allocs
    # one iteration mark per optimizer step, each after that step's last kernel
    marks = [k for k, op in enumerate(ops) if op["kind"] == "ITER_MARK"]
    assert len(marks) == MLP["steps"]
    assert ops[marks[-1] - 1]["kind"] in ("KERNEL", "FREE", "ALLOC")


# ---- device queries, attention, events, values, clock --------------------------------------------------------------

FEATURE_GPU = "a100-sxm-80gb"


@pytest.fixture(scope="module")
def features_run(stub_cache, tmp_path_factory):
    oplog = tmp_path_factory.mktemp("features") / "ops.jsonl"
    t0 = time.monotonic()
    out = run_script("features.py", stub_cache, oplog=oplog, PHANTORA_GPU=FEATURE_GPU)
    return out, read_oplog(oplog), time.monotonic() - t0


def test_device_queries_come_from_the_preset(features_run):
    out, _, _ = features_run
    gpu = load_gpu(FEATURE_GPU)
    assert out["is_available"] is True
    assert out["device_count"] == 8
    assert out["device_name"] == gpu.display_name
    assert out["capability"] == [int(x) for x in gpu.compute_capability.split(".")]
    assert out["sm_count"] == gpu.sm_count
    assert out["total_memory"] == gpu.memory_bytes
    assert out["bf16"] is True                              # Ampere (sm_80) has bf16


def test_sdpa_runs_the_fused_kernels_a_gpu_would(features_run):
    _, ops, _ = features_run
    attention = [op["name"] for op in ops if "scaled_dot_product" in op["name"]]
    assert attention == [
        "aten._scaled_dot_product_flash_attention.default",           # bf16, causal, no mask
        "aten._scaled_dot_product_flash_attention_backward.default",
        "aten._scaled_dot_product_efficient_attention.default",       # fp32 with a boolean mask
        "aten._scaled_dot_product_flash_attention.default",           # under inference_mode
    ]
    assert not any("_softmax" in op["name"] or ".bmm." in op["name"] for op in ops)   # no math path


def test_flex_attention_is_seen_forward_and_backward(features_run):
    _, ops, _ = features_run
    flex = [op for op in ops if op["kind"] == "KERNEL" and op["name"].startswith("flex_attention")]
    assert [op["name"] for op in flex] == ["flex_attention", "flex_attention_backward"]
    # causal attention over 256 queries and keys, 2 heads of 64: at least half of the full QK^T and PV work
    assert flex[0]["flops"] >= 0.5 * 2 * (2 * 256 * 256 * 64 * 2)


def test_modules_move_and_side_streams_carry_their_kernels(features_run):
    out, ops, _ = features_run
    assert out["moved_devices"] == ["cuda:0"]
    side = out["side_stream"]
    assert side != 0
    side_kernels = [op["name"] for op in ops if op["kind"] == "KERNEL" and op["stream"] == side]
    assert any(name.startswith("aten.addmm") for name in side_kernels)     # the Linear ran on the side stream
    # wait_stream: an event recorded on the side stream, then waited on by the default stream
    recorded = {op["arg"] for op in ops if op["kind"] == "EVENT_RECORD" and op["stream"] == side}
    assert any(op["kind"] == "STREAM_WAIT" and op["stream"] == 0 and op["arg"] in recorded for op in ops)


def test_event_elapsed_time_matches_perf_counter(features_run):
    out, _, _ = features_run
    gpu = load_gpu(FEATURE_GPU)
    n = out["matmul_n"]
    bound_ms = out["n_matmul"] * 2.0 * n**3 / (gpu.peak_tflops["bf16"] * 1e12) * 1e3
    assert out["event_ms"] >= bound_ms
    # events bracket the same GPU-bound work inside the perf_counter window
    assert out["event_ms"] <= out["perf_ms"] + 1e-6
    assert out["event_ms"] >= 0.9 * out["perf_ms"]


def test_host_values_and_placeholders(features_run):
    out, _, _ = features_run
    assert out["small_sum"] == pytest.approx((1.5 + 2.0 + 4.0) * 2)
    assert out["small_list"] == [2.5, 3.0, 5.0]
    assert out["unknown_item"] == 0.0 and out["unknown_int"] == 0
    assert out["nonzero_known"] == [2, 1]                  # 2.0 and 4.0 exceed 1.8
    assert out["nonzero_unknown"] == [3 * 5, 2]            # upper bound: every element nonzero


def test_unsupported_op_names_the_op_and_the_line(features_run):
    out, _, _ = features_run
    kind, message = out["unsupported_error"]
    assert kind == "UnsupportedOpError"
    assert "phantora_test.twice" in message
    assert f"features.py:{marker_line('features.py', 'UNSUPPORTED-LINE')}" in message


def test_triton_is_stubbed_when_missing(features_run):
    out, _, _ = features_run
    if build.find_torch().cuda_build or importlib.util.find_spec("triton") is not None:
        pytest.skip("a real triton is installed")
    assert out["triton"] == {"stub": True, "cdiv": 3, "isinstance": False, "config": "Config"}


def test_host_reads_current_device_and_parameter_attributes_as_on_a_cuda_machine(stub_cache):
    out = run_script("host_reads.py", stub_cache, PHANTORA_LOCAL_DEVICES="2")
    assert out["current"] == 1
    assert out["tensor_device"] == "cuda:1" and out["ones_device"] == "cuda:1"
    assert out["stacked"] == [2.0, 3.0]
    assert out["rng_equal"] is True and out["rng_sum_real"] is True
    assert out["attrs"] == [True, 0, "cuda:1", "torch.float32"]


def test_a_spawned_child_imports_what_its_rank_imported(stub_cache):
    """A child started with spawn (multiprocessing Manager, as Megatron-core's checkpoint writer) re-imports the main
    module, `import triton` included, and runs as a plain process: no fake CUDA."""
    if build.find_torch().cuda_build or importlib.util.find_spec("triton") is not None:
        pytest.skip("a real triton is installed")
    out = run_script("spawn_child.py", stub_cache)
    assert out["exitcode"] == 0
    assert out["child"] == {"triton_stub": True, "cuda_tensor": False}


def test_sleep_advances_virtual_time_without_waiting(features_run):
    out, _, wall = features_run
    assert out["sleep_perf_s"] >= 30.0
    assert out["sleep_time_s"] == pytest.approx(out["sleep_perf_s"], rel=1e-6)
    assert wall < 30.0                                      # the 30 s sleep did not happen for real


# ---- OOM -------------------------------------------------------------------------------------------------------------

def test_allocation_beyond_vram_raises_out_of_memory(stub_cache):
    vram = 1 << 30
    out = run_script("oom.py", stub_cache, PHANTORA_VRAM_BYTES=str(vram))
    assert out["total_memory"] == vram
    chunk = int(vram * 0.6)
    assert chunk <= out["after_first"] <= chunk + 511
    assert out["raised"] is True
    assert "CUDA out of memory" in out["message"]
    assert f"oom.py:{marker_line('oom.py', 'OOM-LINE')}" in out["message"]
    assert out["after_free_and_realloc"] == out["after_first"]   # the first block was freed, the third fits


# ---- torch.distributed -----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def dist_run(stub_cache, tmp_path_factory):
    oplog = tmp_path_factory.mktemp("dist") / "ops.jsonl"
    out = run_script("dist_ops.py", stub_cache, oplog=oplog)
    return out, read_oplog(oplog)


def test_init_process_group_nccl_and_collectives_become_ops(dist_run):
    out, ops = dist_run
    assert out["backend"] == "nccl" and out["world_size"] == 1 and out["rank"] == 0
    colls = [(op["name"], op["group"], op["nbytes"]) for op in ops if op["kind"] == "COLLECTIVE"]
    # bytes of this rank's input buffer: 1000 fp32, 1000 bf16, 300 fp32, 1000 fp32, 64 fp32
    assert colls[:5] == [("all_reduce", 0, 4000), ("all_gather", 1, 2000), ("reduce_scatter", 0, 1200),
                         ("broadcast", 0, 4000), ("all_reduce", 1, 256)]
    assert ("barrier", 0, 0) in colls
    assert ("all_to_all", 0, 256) in colls
    assert out["split_group_size"] == 1
    assert out["mesh"] == [0] and out["mesh_group_size"] == 1
    assert out["all_reduce_value"] == 3.0                  # world of one: the local value is the result
    assert out["gathered_objects"] == [{"rank": 0}]


def test_collectives_are_ordered_after_their_stream_and_waited_on(dist_run):
    _, ops = dist_run
    group_end = None                     # inside an NCCL group: index of its GROUP_END
    for i, op in enumerate(ops):
        if op["kind"] == "GROUP_START":
            group_end = next(j for j in range(i, len(ops)) if ops[j]["kind"] == "GROUP_END")
        if group_end is not None and i > group_end:
            group_end = None
        if op["kind"] not in ("COLLECTIVE", "SEND", "RECV"):
            continue
        record, wait = ops[i - 2], ops[i - 1]
        assert record["kind"] == "EVENT_RECORD" and wait["kind"] == "STREAM_WAIT"
        assert wait["arg"] == record["arg"] and wait["stream"] == op["stream"] != record["stream"]
        # the completion event: right after the op, or, in a group, after the GROUP_END (the transfers of a
        # group run when it ends)
        done = ops[i + 1] if group_end is None else ops[group_end + 1]
        assert done["kind"] == "EVENT_RECORD" and done["stream"] == op["stream"]
    # the async reduce_scatter's work.wait(): the issuing stream waits for its completion event
    i = next(i for i, op in enumerate(ops) if op["name"] == "reduce_scatter")
    done_event = ops[i + 1]["arg"]
    assert any(op["kind"] == "STREAM_WAIT" and op["arg"] == done_event and op["stream"] == ops[i - 2]["stream"]
               for op in ops[i + 2:])


def test_batch_p2p_is_grouped_and_barrier_blocks_the_host(dist_run):
    _, ops = dist_run
    kinds = [op["kind"] for op in ops]
    start = kinds.index("GROUP_START")
    end = kinds.index("GROUP_END")
    inside = [op for op in ops[start:end] if op["kind"] in ("SEND", "RECV")]
    assert [(op["kind"], op["nbytes"], op["arg"]) for op in inside] == [("SEND", 40, 0), ("RECV", 40, 0)]
    b = next(i for i, op in enumerate(ops) if op["name"] == "barrier")
    assert any(op["kind"] == "SYNC_STREAM" for op in ops[b + 1:b + 5])


# ---- outside a rank --------------------------------------------------------------------------------------------------

def test_plain_import_torch_is_unaffected():
    env = {k: v for k, v in os.environ.items() if not k.startswith("PHANTORA_")}
    env["PYTHONPATH"] = f"{ROOT / 'stubs'}{os.pathsep}{ROOT}"
    code = ("import json, sys, time, torch; "
            "print(json.dumps({'stubs': 'phantora_stubs' in sys.modules, 'cuda': torch.cuda.is_available(), "
            "'clock': type(time.perf_counter).__name__, 'sum': torch.ones(3).sum().item(), "
            "'fake': type(torch.ones(1)).__name__}))")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["stubs"] is False
    assert out["clock"] == "builtin_function_or_method"
    assert out["sum"] == 3.0 and out["fake"] == "Tensor"
    if not build.find_torch().cuda_build:
        assert out["cuda"] is False


# ---- kernel choices of a CUDA build ----------------------------------------------------------------------------------
# What a real CUDA build ran for the reference workload (Llama 3 8B, 8 layers, bf16, torch 2.11 on an H100), from
# torch.profiler: groundtruth/insitu/h100-sxm-80gb/insitu-s4096-b2-none/ops.json.
INSITU_OPS = ROOT / "groundtruth" / "insitu" / "h100-sxm-80gb" / "insitu-s4096-b2-none" / "ops.json"


def _kernel_names(ops: list[dict]) -> set[str]:
    return {op["name"].split(".")[1] for op in ops if op["kind"] == "KERNEL" and op["name"].startswith("aten.")}


def _dispatch_run(stub_cache, tmp_path, **env) -> set[str]:
    oplog = tmp_path / "ops.jsonl"
    run_script("dispatch.py", stub_cache, oplog=oplog, **env)
    return _kernel_names(read_oplog(oplog))


def test_fused_kernels_match_what_a_cuda_build_launched(stub_cache, tmp_path):
    real = {op["op"].removeprefix("aten::") for op in json.loads(INSITU_OPS.read_text())["ops"]}
    # the release of the in-situ run (torch 2.11), whatever torch is installed here
    names = _dispatch_run(stub_cache, tmp_path, PHANTORA_GPU="h100-sxm-80gb", PHANTORA_TORCH_CUDA="2.11")
    for fused in ("_fused_rms_norm", "_fused_rms_norm_backward", "silu_backward"):
        assert fused in real and fused in names
    # the decompositions a CPU-only torch would otherwise record: none ran on the GPU
    for part in ("rsqrt", "pow", "sigmoid", "mean"):
        assert part not in real and part not in names
    # cuDNN attention on an H100 with torch >= 2.9, as the real run's _cudnn_attention_forward/backward
    assert {"_cudnn_attention_forward", "_cudnn_attention_backward"} <= real
    assert {"_scaled_dot_product_cudnn_attention", "_scaled_dot_product_cudnn_attention_backward"} <= names


def test_an_older_torch_release_keeps_rmsnorm_composite_and_flash_first(stub_cache, tmp_path):
    names = _dispatch_run(stub_cache, tmp_path, PHANTORA_GPU="h100-sxm-80gb", PHANTORA_TORCH_CUDA="2.6")
    assert "_fused_rms_norm" not in names and "rsqrt" in names       # F.rms_norm had no fused kernel before 2.8
    assert "silu_backward" in names
    assert "_scaled_dot_product_flash_attention" in names
    assert not any("cudnn" in n for n in names)


def test_forced_sdpa_order_and_gpu_without_cudnn_preference(stub_cache, tmp_path):
    forced = _dispatch_run(stub_cache, tmp_path, PHANTORA_GPU="h100-sxm-80gb", PHANTORA_SDPA="flash,efficient,math")
    assert "_scaled_dot_product_flash_attention_backward" in forced and "_fused_rms_norm" in forced
    assert not any("cudnn" in n for n in forced)
    # a release that puts cuDNN first on sm90: on sm80 flash still comes first
    a100 = _dispatch_run(stub_cache, tmp_path, PHANTORA_GPU="a100-sxm-80gb", PHANTORA_TORCH_CUDA="2.9")
    assert "_scaled_dot_product_flash_attention" in a100 and not any("cudnn" in n for n in a100)


def test_bad_sdpa_backend_is_a_clear_error(stub_cache):
    proc = subprocess.run([sys.executable, str(SCRIPTS / "dispatch.py")],
                          env=rank_env(stub_cache, PHANTORA_SDPA="flash,fast"), capture_output=True, text=True,
                          timeout=300, cwd=str(ROOT))
    assert proc.returncode != 0 and "unknown SDPA backend 'fast'" in proc.stderr


# ---- torch release boundaries ----------------------------------------------------------------------------------------
# F.rms_norm dispatches to the fused `_fused_rms_norm` kernel from torch 2.8 (pytorch/pytorch PR 153666; before, the
# CompositeImplicitAutograd decomposition: pow, mean, add, rsqrt, mul). From torch 2.9 SDPA prefers cuDNN attention
# on sm90/sm100 (`check_prefer_cudnn_attention` in aten/src/ATen/native/transformers/cuda/sdp_utils.cpp); 2.8 still
# tried flash attention first.

@pytest.fixture(scope="module")
def dispatch_names(stub_cache, tmp_path_factory):
    """Kernel names of tests/scripts/dispatch.py under an environment, each environment run once per module."""
    runs: dict[tuple, set[str]] = {}

    def names(**env: str) -> set[str]:
        key = tuple(sorted(env.items()))
        if key not in runs:
            runs[key] = _dispatch_run(stub_cache, tmp_path_factory.mktemp("dispatch"), **env)
        return runs[key]
    return names


def test_fused_rms_norm_arrives_with_torch_2_8(dispatch_names):
    before = dispatch_names(PHANTORA_GPU="h100-sxm-80gb", PHANTORA_TORCH_CUDA="2.7")
    after = dispatch_names(PHANTORA_GPU="h100-sxm-80gb", PHANTORA_TORCH_CUDA="2.8")
    assert not {"_fused_rms_norm", "_fused_rms_norm_backward"} & before
    assert {"rsqrt", "pow", "mean"} <= before                       # the composite's own ops
    assert {"_fused_rms_norm", "_fused_rms_norm_backward"} <= after
    assert not {"rsqrt", "pow", "mean"} & after


def test_cudnn_attention_first_on_hopper_from_torch_2_9(dispatch_names):
    flash = dispatch_names(PHANTORA_GPU="h100-sxm-80gb", PHANTORA_TORCH_CUDA="2.8")
    cudnn = dispatch_names(PHANTORA_GPU="h100-sxm-80gb", PHANTORA_TORCH_CUDA="2.9")
    assert {"_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_backward"} <= flash
    assert not any("cudnn" in n for n in flash)
    assert {"_scaled_dot_product_cudnn_attention", "_scaled_dot_product_cudnn_attention_backward"} <= cudnn
    assert not any("flash" in n for n in cudnn)


def test_forced_math_sdpa_runs_no_fused_attention(dispatch_names):
    """PHANTORA_SDPA=math overrides torch 2.9's cuDNN preference on an H100: attention runs as the math path's
    batched matmuls and softmax, forward and backward, and no fused attention kernel."""
    names = dispatch_names(PHANTORA_GPU="h100-sxm-80gb", PHANTORA_TORCH_CUDA="2.9", PHANTORA_SDPA="math")
    assert not any(part in n for n in names for part in ("flash", "cudnn", "efficient_attention",
                                                           "_scaled_dot_product"))
    assert "bmm" in names                                            # Q K^T and P V
    assert any("softmax" in n and "backward" not in n for n in names)
    assert "_softmax_backward_data" in names


def test_boolean_mask_indexing_picks_what_the_mask_says_or_the_upper_bound(stub_cache, tmp_path):
    """x[mask] is nonzero() and then indexing, as PyTorch runs it: a kernel for each, and the host reads the count
    back; a mask with a known value gives the real count, an unknown one every element (docs/stubs.md). x[mask] = a
    host scalar is one masked_fill_."""
    oplog = tmp_path / "ops.jsonl"
    out = run_script("mask_indexing.py", stub_cache, oplog=oplog)
    assert out["known"] == [1000 - len(range(0, 1000, 7)), 64]
    assert out["grad"] == [1000, 64]
    assert out["unknown"] == [8192, 256]
    assert out["middle"] == [4, 50, 16]
    assert out["put"] == [8192, 256]
    assert out["small"] == [1.0, 0.0, 0.0] and out["grid"] == [4, 100, 16]
    names = [op["name"] for op in read_oplog(oplog) if op["kind"] == "KERNEL"]
    # three masks read, and the backward of x[mask], which puts the gradient back through the same mask (index_put);
    # x[mask] = 0.0 is a masked_fill_, as ATen's index_put makes it (a scalar from the host: no nonzero, no read-back)
    assert sum(n == "aten.nonzero.default" for n in names) == 4
    assert sum(n.startswith("aten.index.") for n in names) == 3
    assert sum(n.startswith("aten.index_put") for n in names) == 1
    assert sum(n.startswith("aten.masked_fill_") for n in names) == 3
