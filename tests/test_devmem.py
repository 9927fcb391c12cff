"""GPU memory outside PyTorch's caching allocator (phantora/engine/devmem.py), against what a real H200 process held
(groundtruth/devmem/: cudaMemGetInfo's used memory less torch.cuda.memory_reserved, stage by stage)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from phantora.cluster import DeviceMemorySpec
from phantora.engine.allocator import CachingAllocatorModel, DeviceOutOfMemory
from phantora.engine.devmem import MIB, OutsideMemory
from phantora.engine.ops import Op, OpKind

from test_live_run import phantora_run, results

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "groundtruth" / "devmem"


def stages(name: str) -> dict[str, float]:
    data = json.loads((DATA / name).read_text())
    return {s["stage"]: s["outside"] / MIB for s in data["stages"]}


@pytest.mark.parametrize("name", ["h200x2/g2.rank0.json", "h200x2/g2.rank1.json", "h200x4/g4.rank0.json",
                                  "h200x4/g4.rank3.json"])
def test_outside_memory_follows_the_measured_process_stage_by_stage(name):
    measured = stages(name)
    world = 4 if "g4" in name else 2
    rank = int(name.split("rank")[1][0])
    alloc = CachingAllocatorModel(141 * 2 ** 30)
    out = OutsideMemory(alloc, DeviceMemorySpec())
    model = {"sdpa_fwd_bwd": alloc.outside / MIB}            # context and library workspaces, before any NCCL
    out.op(Op(OpKind.COLLECTIVE, group=0))                     # the world group's first all_reduce
    out.op(Op(OpKind.COLLECTIVE, group=0))                     # its all_gather / reduce_scatter: no new buffers
    model["nccl_world_allreduce"] = model["nccl_world_ag_rs"] = alloc.outside / MIB
    for i in range(4):                                         # four new_group()s, each with one all_reduce
        out.op(Op(OpKind.COLLECTIVE, group=1 + i))
        model[f"nccl_groups_{i + 2}"] = alloc.outside / MIB
    # batch_isend_irecv: send to the next rank, receive from the previous one (one peer of 2 ranks, two of 4)
    out.op(Op(OpKind.SEND, group=0, arg=(rank + 1) % world))
    out.op(Op(OpKind.RECV, group=0, arg=(rank - 1) % world))
    model["nccl_p2p"] = alloc.outside / MIB
    for stage, mib in model.items():
        assert mib == pytest.approx(measured[stage], rel=0.01), stage


def test_one_gpu_process_holds_context_and_libraries():
    measured = stages("h200x2/g1.rank0.json")
    alloc = CachingAllocatorModel(141 * 2 ** 30)
    OutsideMemory(alloc, DeviceMemorySpec())
    assert alloc.outside / MIB == pytest.approx(measured["sdpa_fwd_bwd"], rel=0.01)
    assert alloc.outside / MIB > measured["context"]


def test_allocator_refuses_what_fits_only_without_the_outside_memory():
    def used_allocator(outside: int) -> CachingAllocatorModel:
        alloc = CachingAllocatorModel(2 * 2 ** 30)
        alloc.alloc(1 << 30, 1)                                # 1 GiB fits in 2 GiB and stays cached
        alloc.free(1)
        alloc.outside = outside
        return alloc

    request = (1 << 30) + (64 << 20)                           # larger than the cached 1 GiB segment
    used_allocator(0).alloc(request, 2)                        # control: the cache is given back, the request fits
    with pytest.raises(DeviceOutOfMemory) as exc:
        used_allocator(1 << 30).alloc(request, 2)              # beside 1 GiB held outside the allocator it cannot
    assert exc.value.outside == 1 << 30


def test_a_live_run_runs_out_of_memory_where_nccl_buffers_leave_no_room(tmp_path):
    """2 GiB devices: 600 MiB fits before the first collective (context and workspaces take 703 MiB) and not after
    it (the communicator's 840 MiB more leave 505 MiB)."""
    proc = phantora_run("--nodes", "1", "--gpus-per-node", "2", "--set", "vram_gib=2", "--no-trace", "--",
                        "python", str(ROOT / "tests" / "scripts" / "outside_memory.py"), "600")
    assert proc.returncode == 0, proc.stderr[-3000:]
    (res,) = results(proc.stdout)
    spec = DeviceMemorySpec()
    assert res["before"] is True and res["after"] is False
    expect_free = 2 * 2 ** 30 - int(spec.context_mib * MIB) - int(spec.libraries_mib * MIB) \
        - int(spec.nccl_first_comm_mib * MIB)
    assert res["free_after"] <= expect_free
    assert "outside PyTorch" in proc.stdout
