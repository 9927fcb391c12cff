"""DeepSpeed ZeRO++ (ZeRO-3 with quantized weights, qwZ; quantized gradients, qgZ; a secondary partition per node,
hpZ) under `phantora run`, its quantizer kernels answered by the stand-ins of standins/deepspeed.py in the stubs.

presets/workloads/deepspeed_gpt.py (llama-tiny, ZeRO-3, bf16) on 2 nodes of 2 GPUs, once with its ZeRO++ flags
(`zero_quantized_weights`, `zero_quantized_gradients` and `zero_hpz_partition_size: 2`), once without; every parameter
gathered when used (`stage3_param_persistence_threshold: 0`) in both. Checked against the physics of the scheme, in
the second step (between the first two iteration marks) of rank 0:
- qwZ: the weights' all-gathers over the world move int8 values and one fp32 scale per group of thousands of values:
  just over half the bytes of the bf16 all-gathers of the run without ZeRO++;
- qgZ: the gradients leave each GPU as 4-bit values (a quarter of the bf16 reduce-scatter's bytes, plus the scales)
  through an all-to-all within the node; what crosses to the other node, through an all-to-all over the GPUs of the
  same local rank, has been summed over the node's 2 GPUs first: half the bytes of the intra-node one;
- hpZ: every all-gather that is not over the world (the secondary partition's) stays within the rank's node.
And without a run: the quantizer's functions that ZeRO++ does not call fail with an error naming them.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from phantora.trace.reader import TraceReader
from test_deepspeed_live import phantora_run, window_ops

ROOT = Path(__file__).resolve().parent.parent
NODES, GPN = 2, 2
# the workload's ZeRO++ flags: zero_quantized_weights, zero_quantized_gradients, zero_hpz_partition_size
ZEROPP = ("--quantized-weights", "--quantized-gradients", "--hpz", str(GPN))


def run(tmp: Path, flags: tuple[str, ...], cache: Path) -> Path:
    tmp.mkdir()
    config = tmp / "ds.json"
    config.write_text(json.dumps({"zero_optimization": {"stage3_param_persistence_threshold": 0}}))
    trace, summary = phantora_run(tmp, GPN, "--zero", "3", "--seq", "256", "--steps", "2", "--ds-config",
                                  str(config), *flags, cache=cache, run_args=("--nodes", str(NODES)))
    assert summary["config"]["world_size"] == NODES * GPN
    return trace


def collective_bytes(t: TraceReader, name: str) -> dict[tuple[int, ...], int]:
    """Rank 0's bytes of collective `name` in the second step, by the group's members."""
    its = t.iterations(0)
    out: dict[tuple[int, ...], int] = {}
    for o in window_ops(t, 0, its[0], its[1], name):
        members = tuple(t.groups[int(o["group"])][1])
        out[members] = out.get(members, 0) + int(o["nbytes"])
    return out


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None,
                    reason="deepspeed is not installed (pip install phantora[deepspeed])")
def test_zeropp_quantized_weights_gradients_and_node_local_secondary_gathers(tmp_path, stub_cache):
    base_path = run(tmp_path / "base", (), stub_cache)
    zpp_path = run(tmp_path / "zeropp", ZEROPP, stub_cache)
    world = tuple(range(NODES * GPN))
    node = lambda r: r // GPN                                                   # noqa: E731
    with TraceReader(base_path) as base, TraceReader(zpp_path) as zpp:
        for t in (base, zpp):
            assert t.meta["complete_simulation"] is True
            assert all(len(t.iterations(r)) == 2 for r in t.ranks)
        base_gather, zpp_gather = collective_bytes(base, "all_gather"), collective_bytes(zpp, "all_gather")
        base_rs = collective_bytes(base, "reduce_scatter")[world]
        a2a = collective_bytes(zpp, "all_to_all")

        # qwZ: int8 values plus fp32 scales against bf16
        ratio = zpp_gather[world] / base_gather[world]
        assert 0.5 < ratio < 0.51, (zpp_gather, base_gather)

        # qgZ: 4-bit values within the node, then the node's sum across nodes
        intra = [m for m in a2a if len({node(r) for r in m}) == 1]
        inter = [m for m in a2a if len({node(r) for r in m}) == len(m)]
        assert len(intra) == 1 and len(inter) == 1 and len(a2a) == 2, a2a
        assert 0.25 < a2a[intra[0]] / base_rs < 0.27, (a2a, base_rs)
        assert a2a[inter[0]] == pytest.approx(a2a[intra[0]] / GPN, rel=0.01)

        # hpZ: the secondary partition's all-gathers stay within the node, on every rank
        secondary = 0
        for r in zpp.ranks:
            for o in zpp.ops(r):
                if zpp.names[o["name"]] == "all_gather":
                    members = zpp.groups[int(o["group"])][1]
                    if tuple(members) != world:
                        assert {node(m) for m in members} == {node(r)}, (r, members)
                        secondary += 1
        assert secondary > 0


def test_quantizer_functions_zeropp_does_not_call_fail_naming_them():
    sys.path.insert(0, str(ROOT / "stubs"))
    from phantora_stubs.standins.deepspeed import NoStandIn, QuantizationType, _quantizer_module
    mod = _quantizer_module()
    for name in ("ds_quantize_fp16", "dequantize_int8_to_half_experimental", "loco_swizzle_quant"):
        with pytest.raises(NoStandIn, match=name):
            getattr(mod, name)
    with pytest.raises(NoStandIn, match="Asymmetric"):
        mod.quantize(None, 1, 8, QuantizationType.Asymmetric)
