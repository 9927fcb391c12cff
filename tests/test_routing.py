"""The expert routing a simulated MoE step assumes (`phantora run --routing`, phantora/routing.py) and how the rank
stubs apply it (stubs/phantora_stubs/routes.py): a router on placeholder scores gets per-expert counts, the counts
become all-to-all split sizes and grouped-GEMM offsets, and the tokens travel as NCCL moves them.

The checks are the definition of routing (every token picks top_k distinct experts: the counts add up to
tokens x top_k and none exceeds the tokens), the distribution's shape, and conservation across ranks (what one rank
sends another receives), not values the code printed once.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from phantora.cli import main
from phantora.routing import BALANCED, RoutingError, expert_counts, parse

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "scripts" / "moe_routing.py"
sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_stubs_live import rank_env, read_oplog  # noqa: E402


# ---- the distribution ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("spec", ["balanced", "zipf:0.8", "zipf:2.5", "loads:5,1,0,3,1,1,2,9"])
@pytest.mark.parametrize("tokens,top_k", [(4096, 2), (1000, 8), (7, 3)])
def test_counts_follow_the_definition_of_routing(spec, tokens, top_k):
    counts = expert_counts(parse(spec), tokens, top_k, 8)
    assert sum(counts) == tokens * top_k
    assert all(0 <= c <= tokens for c in counts)


def test_balanced_gives_every_expert_the_same_share():
    counts = expert_counts(BALANCED, 4096, 8, 128)
    assert max(counts) - min(counts) <= 1


def test_zipf_shares_fall_as_a_power_of_the_expert_rank():
    s = 1.2
    counts = expert_counts(parse(f"zipf:{s}"), 100_000, 1, 16)
    for e in range(1, 16):
        assert counts[e] / counts[0] == pytest.approx((e + 1) ** -s, rel=1e-3)


def test_loads_are_relative_and_a_full_expert_passes_its_excess_on():
    counts = expert_counts(parse("loads:2,1,1"), 900, 1, 3)
    assert counts == [450, 225, 225]
    # an expert cannot take a token twice: with top-2 the busiest expert holds at most every token
    capped = expert_counts(parse("loads:100,1,1,0"), 1000, 2, 4)
    assert capped[0] == 1000 and capped[1] == capped[2] == 500 and capped[3] == 0


def test_loads_must_fit_the_model():
    with pytest.raises(RoutingError, match="--routing.*3 expert loads.*8 experts"):
        expert_counts(parse("loads:1,2,3"), 10, 1, 8)


@pytest.mark.parametrize("bad,why", [("zipf:0", "positive"), ("zipf:-1", "positive"), ("zipf:abc", "number"),
                                     ("zipf:nan", "positive"), ("loads:1,x", "not a number"),
                                     ("loads:1,-1", "non-negative"), ("loads:0,0", "all zero"),
                                     ("uniform", "expected balanced"), ("file:no-such-file.txt", "cannot read")])
def test_bad_values_name_the_option(bad, why):
    with pytest.raises(RoutingError, match=why) as info:
        parse(bad)
    assert "--routing" in str(info.value)


def test_loads_from_a_file(tmp_path):
    f = tmp_path / "loads.txt"
    f.write_text("# measured on a real run\n3 1\n2, 2\n")
    spec = parse(f"file:{f.name}", base=tmp_path)
    assert spec.loads == (3.0, 1.0, 2.0, 2.0) and spec.source == "loads.txt"
    assert parse(spec.text()).loads == spec.loads          # what the ranks are given reads back the same


def test_phantora_run_refuses_a_bad_routing_without_a_traceback():
    res = CliRunner().invoke(main, ["run", "--routing", "zipf:-2", "--", "python", "-c", "pass"])
    assert res.exit_code != 0
    assert "--routing" in res.output and "Traceback" not in res.output


# ---- the stubs: a router on placeholder scores, then expert parallelism --------------------------------------------

def run_moe(stub_cache, tmp_path, routing: str, world: int, tokens=4096, experts=8, top_k=2):
    oplog = tmp_path / f"ops-{routing.replace(':', '_')}.jsonl"
    env = rank_env(stub_cache, PHANTORA_WORLD_SIZE=str(world), PHANTORA_ROUTING=routing, PHANTORA_OPLOG=str(oplog))
    proc = subprocess.run([sys.executable, str(SCRIPT), str(tokens), str(experts), str(top_k)], env=env,
                          capture_output=True, text=True, timeout=300, cwd=str(ROOT))
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), read_oplog(oplog)


@pytest.mark.parametrize("routing", ["balanced", "zipf:1.0"])
def test_a_router_on_placeholder_scores_routes_every_token(stub_cache, tmp_path, routing):
    tokens, experts, top_k, world = 4096, 8, 2, 4
    out, ops = run_moe(stub_cache, tmp_path, routing, world, tokens, experts, top_k)
    counts = out["counts"]
    assert sum(counts) == tokens * top_k and max(counts) <= tokens
    assert sum(out["top1_counts"]) == tokens                     # argmax + one_hot: one expert per token
    assert out["offsets"][-1] == out["received_rows"]            # grouped-GEMM offsets cover the received tokens
    per_rank = experts // world
    assert out["input_splits"] == [sum(counts[p * per_rank:(p + 1) * per_rank]) for p in range(world)]
    # token dropping at a capacity (Megatron-core's logical_and of the map and a capacity mask): each expert keeps
    # at most `capacity` of its tokens, through a transpose and masked_select; an all-ones mask keeps them all
    # (the dropped map's counts read 0 and Megatron's unpermute failed)
    capped = [min(c, out["capacity"]) for c in counts]
    assert out["capped_counts"] == capped and out["capped_rows"] == sum(capped)
    assert out["uncapped_counts"] == counts
    if routing == "balanced":
        assert len(set(counts)) == 1
        a2a = [op for op in ops if op["kind"] == "COLLECTIVE" and op["name"] == "all_to_all"]
        assert a2a[-1]["nbytes"] == tokens * top_k * out["row_bytes"]           # the tokens, as one collective
        return
    assert counts == sorted(counts, reverse=True) and counts[0] > counts[-1]
    # uneven splits: one NCCL group with a transfer per peer of exactly its split's bytes, none to itself
    start = max(i for i, op in enumerate(ops) if op["kind"] == "GROUP_START")
    group = ops[start:next(i for i in range(start, len(ops)) if ops[i]["kind"] == "GROUP_END")]
    sends = {op["arg"]: op["nbytes"] for op in group if op["kind"] == "SEND"}
    recvs = {op["arg"]: op["nbytes"] for op in group if op["kind"] == "RECV"}
    me, row = out["rank"], out["row_bytes"]
    assert sends == {p: out["input_splits"][p] * row for p in range(world) if p != me}
    assert recvs == {p: out["output_splits"][p] * row for p in range(world) if p != me}


def test_ranks_exchange_their_counts_and_the_trace_says_what_was_assumed(tmp_path):
    trace = tmp_path / "moe.h5"
    summary = tmp_path / "summary.json"
    res = CliRunner().invoke(main, ["run", "--nodes", "1", "--gpus-per-node", "2", "--routing", "zipf:1.5",
                                    "--trace", str(trace), "--summary-json", str(summary), "--",
                                    "python", str(SCRIPT), "2048", "8", "2"], catch_exceptions=False)
    assert res.exit_code == 0, res.output[-3000:]
    outs = {}
    for line in res.output.splitlines():
        if line.startswith("[rank") and "{" in line:
            d = json.loads(line[line.index("{"):])
            outs[d["rank"]] = d
    assert sorted(outs) == [0, 1]
    for src in (0, 1):
        for dst in (0, 1):                     # what each rank sends another is what that rank receives from it
            assert outs[src]["input_splits"][dst] == outs[dst]["output_splits"][src]
    assert outs[0]["received_rows"] > outs[1]["received_rows"]      # the first experts are the busiest
    from phantora.trace.reader import TraceReader
    assert TraceReader(str(trace)).meta["routing"] == {"kind": "zipf", "exponent": 1.5}
    replayed = CliRunner().invoke(main, ["replay", str(trace)])
    assert replayed.exit_code == 0 and "expert routing assumed by the recorded run: zipf:1.5" in replayed.output
    inspected = CliRunner().invoke(main, ["inspect", str(trace)])
    assert inspected.exit_code == 0 and "expert routing assumed: zipf:1.5" in inspected.output
