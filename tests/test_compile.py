"""torch.compile under simulation (stubs/phantora_stubs/compiled.py, docs/compile.md): Inductor's own fusion decides
the kernels, their traffic obeys the roofline, a compiled block does the same matrix work as the eager one with
fewer kernels, and what a user debugging a compiled run needs (graph breaks, compilation time) is reported."""

from __future__ import annotations

import pytest

from phantora.gpus import load_gpu
from test_stubs_live import read_oplog, run_script

N = 1 << 24                     # elements of the pointwise chain (tests/scripts/compiled_steps.py)
GEMMS = ("mm", "addmm", "bmm")


@pytest.fixture(scope="module")
def compiled_run(stub_cache, tmp_path_factory):
    oplog = tmp_path_factory.mktemp("compiled") / "ops.jsonl"
    out = run_script("compiled_steps.py", stub_cache, oplog=oplog)
    return out, _sections(oplog)


def _sections(oplog):
    """The kernels of an op log, in the sections its torch.cuda.synchronize() calls separate."""
    sections, cur = [], []
    for op in read_oplog(oplog):
        if op["kind"] == "SYNC_DEVICE":
            sections.append(cur)
            cur = []
        elif op["kind"] == "KERNEL":
            cur.append(op)
    return sections


def _packet(op):
    parts = op["name"].split(".")
    return parts[1] if len(parts) > 2 else op["name"]


def test_a_pointwise_chain_is_one_generated_kernel_at_the_memory_roofline(compiled_run):
    out, sections = compiled_run
    gpu = load_gpu("h100-sxm-80gb")
    compiled, eager = sections[2], sections[3]
    assert out["chain_shape"] == [N]
    assert len(compiled) == 1 and compiled[0]["name"].startswith("triton_poi_fused")
    # fused: the input read once and the output written once (bf16), no intermediate in memory
    assert compiled[0]["nbytes"] == 2 * N * 2
    assert compiled[0]["duration"] >= compiled[0]["nbytes"] / (gpu.hbm_bandwidth_gbyte_per_s * 1e9)
    # eager runs mul, add and relu as three kernels, each through memory
    assert len(eager) == 3 and sum(op["nbytes"] for op in eager) >= 3 * compiled[0]["nbytes"]
    assert sum(op["duration"] for op in eager) > compiled[0]["duration"]


def test_the_first_call_pays_the_compilation_and_later_calls_do_not(compiled_run):
    from phantora_stubs.compiled import COMPILE_FIRST_S
    out, _ = compiled_run
    assert out["first_call_s"] >= COMPILE_FIRST_S
    assert out["second_call_s"] < 0.01


def test_a_call_of_a_compiled_region_costs_the_host_its_call_and_its_generated_launches(compiled_run):
    # A compiled region's wrapper code is not run here (Inductor's Python, Triton's launcher); a host-bound compiled
    # step on a GPU host pays it per call and per generated kernel (groundtruth/hostcpu/h200x2-compile): the second
    # call of the chain is one call that launches one generated kernel, which carries that call
    from phantora.cluster import HostSpec
    out, sections = compiled_run
    (kernel,) = sections[2]
    assert kernel["arg"] == 2                                    # generated, and one call began before it
    host = HostSpec()
    assert out["second_call_s"] >= (host.launch_overhead_us + host.generated_launch_us + host.compiled_call_us) * 1e-6
    assert all(op["arg"] == -1 for op in sections[3])             # eager kernels: none of it
    # a region with no generated kernel (one matrix product, an extern kernel) still pays for its call
    assert [op["arg"] for op in sections[-1]] == [-1]
    assert out["extern_only_call_s"] >= (host.compiled_call_us + host.launch_overhead_us) * 1e-6


def test_a_compiled_block_does_the_eager_matrix_work_with_fewer_kernels_and_less_memory(compiled_run):
    out, sections = compiled_run
    eager, compiled = sections[4], sections[5]

    def gemms(ops):
        return sorted((op["flops"] for op in ops if _packet(op) in GEMMS))

    assert gemms(compiled) and gemms(compiled) == gemms(eager)           # the same GEMMs, on cuBLAS
    rest_c = [op for op in compiled if _packet(op) not in GEMMS]
    rest_e = [op for op in eager if _packet(op) not in GEMMS]
    assert any(op["name"].startswith("triton_") for op in rest_c)
    assert len(rest_c) < len(rest_e)
    assert sum(op["nbytes"] for op in rest_c) < sum(op["nbytes"] for op in rest_e)
    assert sum(op["duration"] for op in compiled) < sum(op["duration"] for op in eager)
    assert 0 < out["compiled_peak"] <= out["eager_peak"]


def test_checkpointed_attention_is_costed_as_attention_in_forward_and_recomputation(compiled_run):
    _, sections = compiled_run
    ac = sections[6]
    fwd = [op for op in ac if "attention" in op["name"] and "backward" not in op["name"]]
    bwd = [op for op in ac if "attention" in op["name"] and "backward" in op["name"]]
    assert len(bwd) == 2 and len(fwd) == 4                  # 2 steps: forward, and again in the backward
    assert all(op["flops"] > 0 for op in fwd)
    assert not any("rng_state" in op["name"] for op in ac)


def test_graph_breaks_are_reported(compiled_run):
    out, sections = compiled_run
    assert "1 graph break(s)" in out["report"]
    assert len([op for op in sections[7] if op["name"].startswith("triton_")]) == 2    # one kernel per side


# ---- Float8 (torchao) ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def float8_run(stub_cache, tmp_path_factory):
    pytest.importorskip("torchao")
    oplog = tmp_path_factory.mktemp("float8") / "ops.jsonl"
    out = run_script("float8_steps.py", stub_cache, oplog=oplog)
    return out, _sections(oplog)


@pytest.mark.parametrize("section", [1, 3], ids=["eager", "compiled"])
def test_float8_linear_runs_three_fp8_gemms_at_most_at_the_fp8_peak(float8_run, section):
    out, sections = float8_run
    gpu = load_gpu("h100-sxm-80gb")
    m, k, n = 8192, 4096, 8192                           # tests/scripts/float8_steps.py
    assert out["converted"] == "Float8Linear" and out["grad_dtype"] == "torch.bfloat16"
    fp8 = [op for op in sections[section] if _packet(op) == "_scaled_mm"]
    # forward, input gradient, weight gradient: each 2·M·N·K, none left in bf16
    assert [op["flops"] for op in fp8] == [2.0 * m * n * k] * 3
    assert not any(_packet(op) in GEMMS for op in sections[section])
    for op in fp8:
        assert op["duration"] >= op["flops"] / (gpu.peak_tflops["fp8"] * 1e12)
    # the scaling (amax, casts) around them: eager kernels one by one, fused when compiled
    if section == 3:
        assert any(op["name"].startswith("triton_") for op in sections[section])
        assert len(sections[3]) < len(sections[1])


# ---- determinism --------------------------------------------------------------------------------------------------

def test_a_compiled_tp_run_is_bit_identical_beside_busy_processes(tmp_path):
    """Compiling is the stubs' work (Dynamo's callback, Inductor's graph compilations) and its host time a fixed
    price: the simulated times of a compiled run do not depend on how fast the simulating machine compiles."""
    import numpy as np
    from test_hostcpu import TP_STEP, run_quiet_and_busy

    from phantora.trace.reader import TraceReader
    from phantora_stubs.compiled import COMPILE_FIRST_S

    quiet, busy = run_quiet_and_busy(tmp_path, TP_STEP + ("--compile",), timeout=600)
    with TraceReader(quiet) as a, TraceReader(busy) as b:
        for r in a.ranks:
            ta, tb = a.iterations(r), b.iterations(r)
            assert len(ta) >= 2 and ta[0] >= COMPILE_FIRST_S       # the first step compiled
            assert np.array_equal(ta, tb)                           # bit-identical, not merely close


def test_a_graph_compiled_for_dynamic_shapes_is_costed_at_each_call_s_sizes(stub_cache, tmp_path):
    """Dynamo compiles a function again at a second size, with dynamic shapes, and that graph serves a third: each
    call's fused kernel moves its own input and output once (2 bytes an element each way), as the static graph's
    does at its size; a compilation after the first iteration costs the later-compilation time, the reuse none."""
    from phantora_stubs.compiled import COMPILE_LATER_S
    oplog = tmp_path / "ops.jsonl"
    out = run_script("compiled_dynamic.py", stub_cache, oplog=oplog)
    sections = _sections(oplog)
    for i, n in enumerate(out["sizes"]):
        fused = [op for op in sections[2 + 2 * i] if op["name"].startswith("triton_poi_fused")]
        assert len(fused) == 1, sections[2 + 2 * i]
        assert fused[0]["nbytes"] == 2 * n * 2
    first, recompiled, reused = out["call_s"]
    assert recompiled >= COMPILE_LATER_S           # after an iteration: charged
    assert reused < 0.01                           # the dynamic graph serves the third size


def test_flex_attention_in_a_fullgraph_region_is_costed_as_eager_flex_attention(stub_cache, tmp_path):
    """A block with flex attention compiles whole (fullgraph=True, as TorchTitan compiles its flex-attention models):
    the forward and backward flex attention ops keep their place between the block's GEMMs and the signatures,
    FLOPs and costs of the eager block's, while the code around them is fused."""
    oplog = tmp_path / "ops.jsonl"
    out = run_script("compiled_flex.py", stub_cache, oplog=oplog)
    sections = _sections(oplog)
    eager, compiled = sections[2], sections[4]              # the second step of each: no compilation in it
    assert out["graph_breaks"] == 0

    def flex(ops):
        return [(op["name"], op["flops"], op["nbytes"], op["duration"]) for op in ops if "flex_attention" in op["name"]]

    assert [f[0] for f in flex(compiled)] == ["flex_attention", "flex_attention_backward"]
    assert flex(compiled) == flex(eager)
    # causal: about half the dense attention's 4·B·H·S²·D forward FLOPs
    assert 0.4 <= flex(compiled)[0][1] / (4 * 2 * 8 * 1024 * 1024 * 64) <= 0.6
    names = [op["name"] for op in compiled]
    first_flex = names.index("flex_attention")
    assert any(_packet(op) in GEMMS for op in compiled[:first_flex])          # the qkv projection before it
    assert any(_packet(op) in GEMMS for op in compiled[first_flex + 1:])      # the output projection after it
    assert any(n.startswith("triton_") for n in names)                         # the rest compiled


def test_a_static_kernel_in_a_dynamic_graph_does_not_fix_its_sizes(stub_cache):
    """Writing a static kernel's recipe reads its inputs' sizes without turning their symbols into constants (which
    would compile the graph again at every size, then fail)."""
    out = run_script("compiled_dynamic_mixed.py", stub_cache)
    assert out["graphs"] == 1


def test_a_frame_with_nothing_to_compile_costs_no_compilation(stub_cache):
    """Compiling a function whose frame gives Inductor no graph generates no code: its first call costs the host
    what the function's own work costs (it charged the 12.45 s of a first compilation). The first frame with a graph
    is charged the first step's compilation, measured on GPU hosts at 8.75 s or more (groundtruth/local)."""
    out = run_script("compile_empty_frame.py", stub_cache)
    assert out["empty_s"] < 1e-3, out
    assert out["graph_s"] >= 8.75, out


@pytest.mark.parametrize("kind", ["c10d", "functional"])
def test_a_gemm_whose_result_goes_straight_into_an_all_reduce_is_costed(tmp_path, kind):
    """Inductor names the collective's wait as the origin of a GEMM whose output it realizes for the all-reduce;
    the GEMM is still an extern kernel the region runs: each call costs one mm of 2·M·N·K FLOPs on each rank."""
    from test_live_run import SCRIPTS, phantora_run

    from phantora.trace.reader import TraceReader
    trace = tmp_path / "t.h5"
    proc = phantora_run("--gpus-per-node", "2", "--trace", str(trace), "--", "python",
                        str(SCRIPTS / "compiled_gemm_allreduce.py"), kind, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with TraceReader(trace) as r:
        names = r.names
        for rank in r.ranks:
            ops = r.ops(rank)
            mm = [op for op in ops if names[op["name"]].split(".")[-2:-1] == ["mm"]]      # aten.mm.default
            assert [op["flops"] for op in mm] == [2.0 * 4096 * 1024 * 2048] * 2, [names[o["name"]] for o in ops]


@pytest.mark.parametrize("kind", ["adamw", "sgd"])
def test_a_compiled_optimizer_step_runs_and_moves_at_least_the_update_s_bytes(stub_cache, tmp_path, kind):
    """`torch.compile` around `opt.step()` (Dynamo makes AdamW's moments while tracing, Inductor reinplaces the
    foreach ops): each compiled step's generated kernels move at least what the update must read and write in fp32
    (AdamW: parameter, gradient and both moments read, parameter and moments written, 7 x 4 bytes an element; SGD
    without momentum: 3 x 4), and the moments are the parameters' shapes on the GPU."""
    oplog = tmp_path / "ops.jsonl"
    out = run_script("compiled_optimizer.py", stub_cache, kind, oplog=oplog)
    sections = _sections(oplog)
    steps = sections[1::2][:3]                  # each step's section follows its backward's
    floor = (7 if kind == "adamw" else 3) * 4 * out["params"]
    for sec in steps:
        generated = [op for op in sec if op["name"].startswith("triton_")]
        assert generated and sum(op["nbytes"] for op in generated) >= floor, sec
        # a foreach kernel's FLOPs are its parts' own: an update does tens of operations an element, not one per
        # element of every parameter for each part (which would be 8 times that over these 8 tensors)
        assert 0 < sum(op["flops"] for op in generated) <= 64 * out["params"], sec
    if kind == "adamw":
        assert [sorted(s) for s in out["state"]] == [["exp_avg", "exp_avg_sq", "step"]] * out["tensors"]
        assert [s["exp_avg"] for s in out["state"]] == [[[1024, 1024], "cuda:0"], [[1024], "cuda:0"]] * 4


def test_frames_dynamo_gives_up_on_are_reported_apart_from_compiled_ones(stub_cache):
    """The report counts a frame as compiled when Dynamo converted it, and names the frames it gave up on with
    Dynamo's reason. With a recompile limit of 2, `sized` compiles at its first two sizes (one recompilation) and is
    given up at the third (the fourth is not tried again); `looped` breaks its graph inside a loop and is given up."""
    report = run_script("compile_given_up.py", stub_cache)["report"]
    assert "2 frame(s) compiled (1 recompilation(s))" in report, report
    assert "2 frame(s) Dynamo gave up on, run eagerly" in report, report
    assert "recompile limit" in report and "builtin operator" in report, report


def test_cuda_graphs_asked_for_by_config_are_announced_and_two_e5m2_operands_refused():
    """`torch._inductor.config.triton.cudagraphs = True` (set by the program) runs without CUDA graphs and says so,
    as `mode="reduce-overhead"` does; `torch._scaled_mm` of two e5m2 operands raises ATen's ValueError."""
    from test_live_run import SCRIPTS, phantora_run, results
    proc = phantora_run("--gpus-per-node", "1", "--no-trace", "--", "python", str(SCRIPTS / "cuda_graphs_config.py"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "simulated without CUDA graphs" in ln]
    assert len(said) == 1 and "triton.cudagraphs=True" in said[0], said
    (res,) = results(proc.stdout)
    assert res["e5m2"] == "Multiplication of two Float8_e5m2 matrices is not supported"
