"""Megatron-core 0.16.1 run unmodified under `phantora run` (presets/workloads/megatron_gpt.py, the local layer spec).

Checks, against the framework's own behaviour and physics rather than recorded numbers:
- TP 2 x DP 2 with Megatron's DDP, the distributed optimizer (overlapped grad reduce and param gather) and gradient
  clipping: every parameter element enters the gradient norm exactly once over the four ranks (the replicated norm
  weights on TP rank 0 only), so the elements normed add up to the model's parameter count, computed here from the
  preset's shapes; the gradients reduced over DP cover every local parameter (fp32 grads);
- the parameters keep the attributes Megatron sets on them through `.cuda()` / `Float16Module`;
- PP 2 with interleaving (`batch_p2p_comm` on) and full recompute runs to the end, and every pipeline rank's
  program is complete in the trace;
- the workload's own step times are the simulated iteration times;
- with `--torch-fsdp2` (Megatron-core's TorchFullyShardedDataParallel, PyTorch's FSDP2) over DP 2: every parameter's
  gradient reduce-scattered once per step, every parameter gathered for forward and at most once more for backward,
  and the optimizer's gradient norm over each rank's own shards covering each parameter element once;
- with the Transformer Engine stand-in (`--transformer-engine`), Megatron's TE layer spec with sequence parallelism:
  the same gradient-norm coverage (through TE's multi-tensor L2 norm), and per step exactly the collectives of
  Megatron's and TE's sequence-parallel design, with the bytes of the activations they move.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

from phantora.trace.reader import TraceReader

pytestmark = pytest.mark.skipif(importlib.util.find_spec("megatron") is None
                                or importlib.util.find_spec("megatron.core") is None,
                                reason="megatron-core is not installed (pip install phantora[megatron])")

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "presets" / "workloads" / "megatron_gpt.py"
MODEL = "llama-tiny"


def phantora_run(tmp: Path, gpus: int, *args: str, cache: Path,
                 run_options: tuple[str, ...] = ()) -> tuple[subprocess.CompletedProcess, Path, dict]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env["XDG_CACHE_HOME"] = str(cache)
    trace = tmp / "t.h5"
    summary = tmp / "summary.json"
    proc = subprocess.run([sys.executable, "-m", "phantora.cli", "run", "--cluster", "h100-hgx", "--gpus-per-node",
                           str(gpus), "--trace", str(trace), *run_options, "--", "python", str(SCRIPT),
                           "--model", MODEL,
                           "--json-out", str(summary), *args],
                          capture_output=True, text=True, timeout=900, cwd=str(tmp), env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc, trace, json.loads(summary.read_text())


def preset_params() -> tuple[int, int]:
    """(all parameters, parameters of the replicated norms) of the preset's Llama shape, counted from its TOML."""
    m = tomllib.loads((ROOT / "presets" / "models" / f"{MODEL}.toml").read_text())
    d, layers, heads, kv, vocab, ffn = (m[k] for k in ("dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size",
                                                       "ffn_dim"))
    head = d // heads
    per_layer = d * (d + 2 * kv * head) + d * d + 3 * d * ffn       # qkv, proj, gate+up, down
    norms = (2 * layers + 1) * d                                    # two RMSNorms per layer and the final one
    return layers * per_layer + 2 * vocab * d + norms, norms


def norm_elements(trace: TraceReader, rank: int, lo: float, hi: float) -> int:
    """Elements of the tensors whose L2 norm a rank computes in the issue window [lo, hi): one tensor per
    `linalg_vector_norm` (Megatron's local norm), or the lists of `_foreach_norm` (TE's multi-tensor norm, whose
    signature lists (shape, dtype, count) runs; the norm of its per-tensor norms that follows is not a gradient)."""
    names, sigs = trace.names, trace.signatures
    ops = trace.ops(rank)
    single = lists = 0
    for o in ops[(ops["issue"] >= lo) & (ops["issue"] < hi)]:
        name = names[o["name"]]
        if name == "aten.linalg_vector_norm.default":
            shape = json.loads(sigs[o["sig"]])[1][0]
            single += int(np.prod(shape)) if shape else 1
        elif name == "aten._foreach_norm.Scalar":
            for shape, _dtype, count in json.loads(sigs[o["sig"]])[5][0][1]:
                lists += int(np.prod(shape)) * count
    return lists or single


def collectives_of(trace: TraceReader, rank: int, name: str, lo: float, hi: float,
                   group: list[int] | None = None) -> list[int]:
    """Bytes of each `name` collective a rank issues in [lo, hi) (on the group of these ranks, if given)."""
    names, groups = trace.names, trace.groups
    ops = trace.ops(rank)
    sel = ops[(ops["issue"] >= lo) & (ops["issue"] < hi)]
    return [int(o["nbytes"]) for o in sel if names[o["name"]] == name
            and (group is None or sorted(groups[int(o["group"])][1]) == group)]


def collective_bytes(trace: TraceReader, rank: int, name: str, lo: float, hi: float,
                     group: list[int] | None = None) -> int:
    return sum(collectives_of(trace, rank, name, lo, hi, group))


def check_norms_and_dp_reductions(path: Path, summary: dict) -> None:
    params, norms = preset_params()
    assert summary["params"] == params          # the workload counts the same model
    with TraceReader(path) as t:
        assert t.meta["complete_simulation"] is True
        its = {r: t.iterations(r) for r in t.ranks}
        # one whole step (the second: after set-up), on each rank's own clock
        window = {r: (its[r][0], its[r][1]) for r in t.ranks}
        normed = {r: norm_elements(t, r, *window[r]) for r in t.ranks}
        # TP groups {0, 1}, {2, 3}; DP groups {0, 2}, {1, 3}. The distributed optimizer norms the gradient shard
        # each DP rank owns; TP rank 0 (ranks 0, 2) also norms the replicated RMSNorm weights, TP rank 1 does not.
        # Over the four ranks, every parameter element is normed exactly once.
        assert sum(normed.values()) == params
        assert (normed[0] + normed[2]) - (normed[1] + normed[3]) == norms
        # DP: Megatron reduce-scatters fp32 gradients of every local parameter, bucket padding aside
        local = (params - norms) // 2 + norms
        for r in t.ranks:
            rs = collective_bytes(t, r, "reduce_scatter", *window[r], group=dp_group(t, r))
            assert local * 4 <= rs <= local * 4 * 1.05, (r, rs, local * 4)


def dp_group(trace: TraceReader, rank: int) -> list[int]:
    """TP 2 x DP 2 on four ranks: the data-parallel peers of a rank."""
    return sorted({rank, rank ^ 2})


def test_tp_dp_distributed_optimizer_norms_and_reductions_cover_the_model(tmp_path, stub_cache):
    proc, path, summary = phantora_run(tmp_path, 4, "--tp", "2", "--distributed-optimizer", "--overlap-grad-reduce",
                                       "--overlap-param-gather", "--steps", "3", "--seq", "256",
                                       cache=stub_cache)
    check_norms_and_dp_reductions(path, summary)
    # the workload's own step times are the simulated iteration times
    steps = summary["step_times_s"]
    with TraceReader(path) as t:
        sim = np.diff(t.iterations(0))
    assert abs(steps[-1] - sim[-1]) <= 0.02 * sim[-1]


def test_torch_fsdp2_shards_gradients_and_optimizer_over_dp(tmp_path, stub_cache):
    """Megatron-core's TorchFullyShardedDataParallel (PyTorch's FSDP2; Megatron-LM's --use-torch-fsdp2) over DP 2:
    it shards the GPTModel with DeviceMesh.from_group on Megatron's DP group and runs every step to the end. Per step,
    every parameter's bf16 gradient is reduce-scattered over DP once (the preset's dimensions are even: FSDP2 pads
    no shard), every parameter is all-gathered for forward and at most once more for backward (a gather's input is
    a rank's half), nothing as large as a gradient is all-reduced, and Megatron's optimizer norms each rank's own
    shards, so the elements normed over the two ranks are the model's parameters, each once."""
    steps = 3
    proc, path, summary = phantora_run(tmp_path, 2, "--torch-fsdp2", "--steps", str(steps), "--seq", "256",
                                       cache=stub_cache)
    params, _ = preset_params()
    assert summary["params"] == params
    grad_bytes = params * 2                                   # bf16 parameters (Float16Module), bf16 gradients
    with TraceReader(path) as t:
        assert t.meta["complete_simulation"] is True
        normed = 0
        for r in t.ranks:
            its = t.iterations(r)
            assert len(its) == steps, (r, its)
            lo, hi = its[0], its[1]
            dp = [0, 1]
            assert collective_bytes(t, r, "reduce_scatter", lo, hi, dp) == grad_bytes, r
            gathered = 2 * collective_bytes(t, r, "all_gather", lo, hi, dp)     # two ranks' halves
            assert grad_bytes <= gathered <= 2 * grad_bytes, (r, gathered, grad_bytes)
            assert max(collectives_of(t, r, "all_reduce", lo, hi), default=0) < grad_bytes // 100, r
            normed += norm_elements(t, r, lo, hi)
        assert normed == params
        sim = np.diff(t.iterations(0))
    steps_s = summary["step_times_s"]
    assert abs(steps_s[-1] - sim[-1]) <= 0.02 * sim[-1]


def test_torch_fsdp2_refuses_the_options_of_megatrons_ddp():
    spec = importlib.util.spec_from_file_location("megatron_gpt_args", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    for flag in ("--distributed-optimizer", "--overlap-grad-reduce"):
        with pytest.raises(mod.UsageError, match=flag):
            mod.parse_args(["--torch-fsdp2", flag])
    assert mod.parse_args(["--torch-fsdp2"]).torch_fsdp2


def test_parameter_attributes_survive_cuda_and_float16(tmp_path, stub_cache):
    script = tmp_path / "attrs.py"
    script.write_text(
        "import os, torch\n"
        "torch.cuda.set_device(int(os.environ['LOCAL_RANK']))\n"
        "m = torch.nn.Linear(8, 8)\n"
        "m.weight.tensor_model_parallel = True\n"
        "m.weight.partition_dim = 0\n"
        "m.cuda(torch.cuda.current_device()).bfloat16()\n"
        "m.to(torch.float32)\n"
        "t = torch.tensor([1.0], device='cuda')\n"
        "print('ATTRS', getattr(m.weight, 'tensor_model_parallel', None), getattr(m.weight, 'partition_dim', None),"
        " m.weight.device, m.weight.dtype, t.device, torch.cuda.current_device(), flush=True)\n")
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env["XDG_CACHE_HOME"] = str(stub_cache)
    proc = subprocess.run([sys.executable, "-m", "phantora.cli", "run", "--gpus-per-node", "2", "--trace",
                           str(tmp_path / "a.h5"), "--", "python", str(script)], capture_output=True, text=True,
                          timeout=300, cwd=str(tmp_path), env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = sorted(line.split("ATTRS ", 1)[1] for line in proc.stdout.splitlines() if "ATTRS " in line)
    assert lines == ["True 0 cuda:0 torch.float32 cuda:0 0", "True 0 cuda:1 torch.float32 cuda:1 1"]


def test_interleaved_pipeline_with_recompute_runs_to_the_end(tmp_path, stub_cache):
    proc, path, summary = phantora_run(tmp_path, 4, "--tp", "2", "--pp", "2", "--vpp", "2", "--global-batch", "4",
                                       "--recompute", "full", "--steps", "2", "--seq", "256", cache=stub_cache)
    with TraceReader(path) as t:
        assert t.meta["complete_simulation"] is True
        names = t.names
        for r in t.ranks:
            assert len(t.iterations(r)) == 2
            # batched p2p: NCCL groups of sends and receives between the two stages
            kinds = {names[i] for i in t.ops(r)["name"]}
            assert {"send", "recv"} <= kinds, kinds
    assert len(summary["step_times_s"]) == 2 and all(s > 0 for s in summary["step_times_s"])


def test_transformer_engine_spec_with_sequence_parallelism(tmp_path, stub_cache):
    seq = 256
    proc, path, summary = phantora_run(tmp_path, 4, "--tp", "2", "--spec", "te", "--sequence-parallel",
                                       "--distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather",
                                       "--steps", "3", "--seq", str(seq), cache=stub_cache,
                                       run_options=("--transformer-engine", "2.9"))
    check_norms_and_dp_reductions(path, summary)
    m = tomllib.loads((ROOT / "presets" / "models" / f"{MODEL}.toml").read_text())
    layers, dim = m["n_layers"], m["dim"]
    activation = seq * 1 * dim * 2                      # one micro-batch's [s, b, h] in bf16
    with TraceReader(path) as t:
        for r in t.ranks:
            lo, hi = t.iterations(r)[:2]
            tp = sorted({r, r ^ 1})
            gathers = collectives_of(t, r, "all_gather", lo, hi, tp)
            scatters = collectives_of(t, r, "reduce_scatter", lo, hi, tp)
            # Per layer, TE's column-parallel GEMMs (qkv, fc1) gather their input shard in forward and again in
            # backward (only the shard is kept), and reduce-scatter their input gradient; its row-parallel GEMMs
            # (proj, fc2) reduce-scatter their output and gather its gradient: 6 gathers, 4 reduce-scatters.
            # Megatron adds the embedding's reduce-scatter (backward: a gather) and the output layer's gather
            # (forward, again in backward; backward: a reduce-scatter).
            assert len(gathers) == 6 * layers + 3, (r, len(gathers))
            assert len(scatters) == 4 * layers + 2, (r, len(scatters))
            # a gather moves a rank's shard (1/tp of the activation); a reduce-scatter's input is the whole one
            assert set(gathers) == {activation // 2}, (r, set(gathers))
            assert set(scatters) == {activation}, (r, set(scatters))
            # Megatron all-reduces the gradients of the sequence-parallel norm weights (TE tags them) over TP:
            # two norms per layer and the final one, fp32
            norms_ar = collectives_of(t, r, "all_reduce", lo, hi, tp)
            assert (2 * layers + 1) * dim * 4 in norms_ar, (r, norms_ar)


MOE_TOML = """name = "moe-tiny"
family = "mixtral"
dim = 256
n_layers = 2
n_heads = 8
n_kv_heads = 4
vocab_size = 4096
ffn_dim = 512
max_seq_len = 2048
rope_theta = 1000000.0
norm_eps = 1e-5
num_experts = 8
experts_per_token = 2
moe_ffn_dim = 512
"""


def run_moe(tmp_path: Path, stub_cache: Path, *args: str) -> Path:
    """The Mixtral-shaped model of MOE_TOML with EP 2 on Transformer Engine's grouped GEMM, 2 GPUs: its trace."""
    model = tmp_path / "moe-tiny.toml"
    model.write_text(MOE_TOML)
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env["XDG_CACHE_HOME"] = str(stub_cache)
    trace = tmp_path / "moe.h5"
    proc = subprocess.run([sys.executable, "-m", "phantora.cli", "run", "--gpus-per-node", "2", "--trace", str(trace),
                           "--transformer-engine", "2.9", "--", "python", str(SCRIPT), "--model", str(model),
                           "--ep", "2", "--spec", "te", "--moe-grouped-gemm", *args], capture_output=True, text=True,
                          timeout=600, cwd=str(tmp_path), env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return trace


def test_mixture_of_experts_with_expert_parallelism_and_grouped_gemm(tmp_path, stub_cache):
    """A Mixtral-shaped MoE (8 experts, top-2) with EP 2 on Transformer Engine's grouped GEMM, balanced routing:
    per layer and micro-batch, the token dispatcher's all-to-alls of tokens (forward: dispatch and combine;
    backward: both again) each move every routed token row once (tokens x top-k x hidden, bf16), each local
    expert's GEMMs get ep x tokens x top-k / experts rows (the balanced split of what both EP ranks route), and the
    chained optimizer (dense and expert parameters) marks one iteration per step."""
    seq, dim, layers, experts, top_k, ffn = 256, 256, 2, 8, 2, 512
    steps = 3
    trace = run_moe(tmp_path, stub_cache, "--steps", str(steps), "--seq", str(seq))
    routed = seq * top_k * dim * 2
    rows_per_expert = 2 * seq * top_k // experts      # every EP rank's routed rows, spread over all the experts
    with TraceReader(trace) as t:
        names, sigs = t.names, t.signatures
        for r in t.ranks:
            its = t.iterations(r)
            assert len(its) == steps, (r, its)
            lo, hi = its[0], its[1]
            a2a = collectives_of(t, r, "all_to_all", lo, hi)
            tokens = [b for b in a2a if b > 4096]               # beside them: the small exchanges of the counts
            assert tokens == [routed] * (4 * layers), (r, a2a)
            ops = t.ops(r)
            sel = ops[(ops["issue"] >= lo) & (ops["issue"] < hi)]
            # the experts' GEMMs are the ones over an expert's rows: forward and dgrad [rows, k] x [k, n], wgrad
            # [n, rows] x [rows, k] (no other GEMM of this model has that dimension)
            expert_gemms = []
            for o in sel:
                if names[o["name"]] not in ("aten.mm.default", "aten.mm.out"):
                    continue
                a, b = json.loads(sigs[o["sig"]])[1][:2]
                if rows_per_expert in (a[0], a[1]):
                    expert_gemms.append((tuple(a), tuple(b)))
            # fc1 (gate and up) and fc2 of each of the 4 local experts, forward, dgrad and wgrad, per layer
            assert len(expert_gemms) == layers * 2 * (experts // 2) * 3, (r, len(expert_gemms))
            shapes = set(expert_gemms)
            fc1 = ((rows_per_expert, dim), (dim, 2 * ffn))       # the expert's rows through gate and up
            fc2 = ((rows_per_expert, ffn), (ffn, dim))
            assert fc1 in shapes and fc2 in shapes, (r, sorted(shapes))


def test_mixture_of_experts_all_gather_dispatcher_routes_the_gathered_tokens(tmp_path, stub_cache):
    """The all-gather token dispatcher with EP 2 (Transformer Engine's grouped GEMM, balanced routing) gathers the
    routing map and the tokens of both EP ranks and keeps its local experts' columns of the map: each local expert's
    GEMMs get ep x tokens x top-k / experts rows, as with the all-to-all dispatcher."""
    seq, dim, layers, experts, top_k = 256, 256, 2, 8, 2
    trace = run_moe(tmp_path, stub_cache, "--moe-dispatcher", "allgather", "--steps", "2", "--seq", str(seq))
    rows_per_expert = 2 * seq * top_k // experts
    with TraceReader(trace) as t:
        names, sigs = t.names, t.signatures
        for r in t.ranks:
            lo, hi = t.iterations(r)[:2]
            gathered = collectives_of(t, r, "all_gather", lo, hi)
            assert gathered.count(seq * dim * 2) >= layers, (r, gathered)      # each layer's tokens, bf16
            ops = t.ops(r)
            sel = ops[(ops["issue"] >= lo) & (ops["issue"] < hi)]
            expert_gemms = [o for o in sel if names[o["name"]] in ("aten.mm.default", "aten.mm.out")
                            and rows_per_expert in json.loads(sigs[o["sig"]])[1][0][:2]]
            assert len(expert_gemms) == layers * 2 * (experts // 2) * 3, (r, len(expert_gemms))


@pytest.mark.parametrize("order, ok", [("tp-cp-ep-dp-pp", True), ("tp-pp-dp", False)])
def test_ranks_auto_refuses_pipeline_stages_laid_out_otherwise(tmp_path, order, ok):
    """`--ranks auto` runs the first rank of each block of W/P ranks as that pipeline stage. Megatron's default order
    puts the pipeline dimension outermost and runs; "tp-pp-dp" puts stage 1 on ranks 2-3 and 6-7, where the plan
    would have rank 4 (a stage-0 rank there) stand for stage 1 and rank 0 answer its own stage-1 peer's messages:
    a step without its last stage. That run stops and says why."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    proc = subprocess.run([sys.executable, "-m", "phantora.cli", "run", "--gpus-per-node", "8", "--ranks", "auto",
                           "--pp-degree", "2", "--no-trace", "--", "python",
                           str(ROOT / "tests" / "scripts" / "megatron_order.py"), "--order", order],
                          capture_output=True, text=True, timeout=900, cwd=str(tmp_path), env=env)
    if ok:
        assert proc.returncode == 0, proc.stderr[-3000:]
        stages = sorted(line.split()[-2:] for line in proc.stdout.splitlines() if "STAGE" in line)
        assert stages == [["0", "0"], ["4", "1"]]
    else:
        assert proc.returncode != 0
        assert "rank 4 is stage 0 of the program's pipeline" in proc.stderr and "--ranks all" in proc.stderr
