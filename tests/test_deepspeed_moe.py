"""DeepSpeed's MoE layer (deepspeed.moe.layer.MoE) with expert parallelism 2 under `phantora run`: its gate
(argmax, one_hot, the sum of the two masks for top-2), its capacity and its all-to-all.

DeepSpeed dispatches a fixed (experts, capacity, dim) buffer with an all-to-all of equal chunks. With
`drop_tokens=True` the capacity comes from the capacity factor (top-2: ceil(2 x tokens / experts) at factor 1),
whatever the routing; with `drop_tokens=False` it is the busiest expert's token count, all-reduced with MAX over
the expert-parallel group: under a skewed routing every expert's buffer grows to the busiest one's.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("deepspeed")

from phantora.routing import expert_counts, parse  # noqa: E402
from phantora.trace.reader import TraceReader  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "scripts" / "deepspeed_moe.py"
EXPERTS, TOP_K, TOKENS, DIM = 8, 2, 2048, 512


def dispatch_bytes(tmp_path, routing: str, drop: bool) -> set[int]:
    trace = tmp_path / f"ds-moe-{drop}.h5"
    cmd = [sys.executable, "-m", "phantora.cli", "run", "--nodes", "1", "--gpus-per-node", "2", "--routing", routing,
           "--quiet", "--trace", str(trace), "--", "python", str(SCRIPT), str(EXPERTS), str(TOP_K),
           "1" if drop else "0", str(TOKENS)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=str(ROOT))
    assert proc.returncode == 0, proc.stderr[-3000:]
    with TraceReader(str(trace)) as r:
        names = r.names
        return {int(o["nbytes"]) for o in r.ops(0) if names[o["name"]] == "all_to_all"}


def test_no_drop_capacity_is_the_busiest_experts_count(tmp_path):
    busiest = max(expert_counts(parse("zipf:1.2"), TOKENS, TOP_K, EXPERTS))
    assert busiest > TOKENS * TOP_K // EXPERTS                      # the skew makes one expert busier
    assert dispatch_bytes(tmp_path, "zipf:1.2", drop=False) == {EXPERTS * busiest * DIM * 2}


def test_a_capacity_factor_bounds_the_dispatch_whatever_the_routing(tmp_path):
    capacity = math.ceil(TOKENS / EXPERTS * 2 * 1.0)               # DeepSpeed's _capacity for top-2, factor 1
    assert dispatch_bytes(tmp_path, "zipf:1.2", drop=True) == {EXPERTS * capacity * DIM * 2}


def test_deepspeed_gpt_trains_a_mixtral_shaped_moe(tmp_path):
    """presets/workloads/deepspeed_gpt.py on the mixtral-8x7b preset (2 of its layers), EP 2, ZeRO 2: the model it
    builds has the preset's parameter count (phantora.models counts it independently, routers included), and each
    MoE layer's all-to-all moves DeepSpeed's capacity-bound buffer: 2 x (experts x ceil(2 x tokens / experts) x dim)
    bytes of bf16 for top-2 at capacity factor 1."""
    import dataclasses
    import json

    from phantora.models import load_model

    summary = tmp_path / "summary.json"
    trace = tmp_path / "mixtral.h5"
    seq = 512
    cmd = [sys.executable, "-m", "phantora.cli", "run", "--nodes", "1", "--gpus-per-node", "2", "--quiet",
           "--trace", str(trace), "--", "python", str(ROOT / "presets" / "workloads" / "deepspeed_gpt.py"),
           "--model", "mixtral-8x7b", "--layers", "2", "--ep", "2", "--zero", "2", "--seq", str(seq), "--steps", "2",
           "--json-out", str(summary)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=str(ROOT))
    assert proc.returncode == 0, proc.stderr[-3000:]
    spec = load_model("mixtral-8x7b")
    assert json.loads(summary.read_text())["params"] == dataclasses.replace(spec, n_layers=2).num_params()
    capacity = math.ceil(2 * seq / spec.num_experts)
    with TraceReader(str(trace)) as r:
        names = r.names
        sizes = {int(o["nbytes"]) for o in r.ops(0) if names[o["name"]] == "all_to_all"}
    assert sizes == {spec.num_experts * capacity * spec.dim * 2}
