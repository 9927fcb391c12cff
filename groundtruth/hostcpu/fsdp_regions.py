"""Host time of FSDP2's parts of a training step, measured the same way on a GPU host and under `phantora run`.

Wraps FSDP2's methods (the param group's unshard / wait / pre- and post-forward and backward / reshard, the
collectives' copy-in, all-gather, copy-out and reduce, the state's root pre-forward and final callback), the
optimizer's step and the process group's collectives in a timer (`time.perf_counter`, which Phantora makes the
rank's virtual clock), runs the reference workload as its `__main__`, and at exit prints, for rank 0, each
region's inclusive host time and calls per step (medians over the steps after the second). Regions nest: a
collective's time is also in the FSDP method that called it. `module.forward` is a module's own forward between
FSDP's hooks (for a compiled block, the call of its compiled region); `module.forward.root` the root's, which holds
the blocks' forwards and their hooks.

    torchrun --standalone --nproc-per-node 2 groundtruth/hostcpu/fsdp_regions.py --out R.json -- \\
        presets/workloads/llama.py --model llama-tiny --dp-mode fsdp --seq 256 --batch 1 --ac none --steps 12
    phantora run --cluster h200-2gpu-nvlink --gpus-per-node 2 --no-trace -- python groundtruth/hostcpu/fsdp_regions.py \\
        --out R.json -- presets/workloads/llama.py ...
"""

import functools
import json
import os
import runpy
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.fsdp._fully_shard import _fsdp_collectives as coll
from torch.distributed.fsdp._fully_shard import _fsdp_param_group as pg
from torch.distributed.fsdp._fully_shard import _fsdp_state as st

STEPS: list[dict] = [{}]       # per optimizer step: region -> [seconds, calls]


def _add(name, t0):
    slot = STEPS[-1].setdefault(name, [0.0, 0])
    slot[0] += time.perf_counter() - t0
    slot[1] += 1


def _timed(name, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            _add(name, t0)
    return wrapper


def _patch():
    for name in ("unshard", "wait_for_unshard", "pre_forward", "post_forward", "pre_backward", "post_backward",
                 "reshard", "finalize_backward"):
        setattr(pg.FSDPParamGroup, name, _timed(f"group.{name}", getattr(pg.FSDPParamGroup, name)))
    for name in ("foreach_all_gather", "foreach_all_gather_copy_out", "foreach_reduce",
                 "foreach_reduce_scatter_copy_in"):
        timed = _timed(f"coll.{name}", getattr(coll, name))
        setattr(coll, name, timed)
        if hasattr(pg, name):
            setattr(pg, name, timed)
    for name in ("_root_pre_forward", "_pre_forward", "_post_forward", "_root_post_backward_final_callback"):
        # FSDP keeps its hooks out of compiled regions (`_dynamo_disable`); the timers around them too
        setattr(st.FSDPState, name, torch._dynamo.disable(_timed(f"state.{name}", getattr(st.FSDPState, name))))
    _patch_module_forward()
    for name in ("all_gather_into_tensor", "reduce_scatter_tensor", "all_reduce",   # FSDP2 of torch 2.11
                 "all_gather_single", "reduce_scatter_single"):                     # of torch 2.13
        if hasattr(dist, name):
            setattr(dist, name, _timed(f"dist.{name}", getattr(dist, name)))
    orig_init = torch.optim.Optimizer.__init__

    def init(self, *args, **kwargs):
        orig_init(self, *args, **kwargs)
        step = self.step

        @functools.wraps(step)
        def marked(*a, **k):
            t0 = time.perf_counter()
            try:
                return step(*a, **k)
            finally:
                _add("optimizer.step", t0)
                STEPS.append({})
        self.step = marked
    torch.optim.Optimizer.__init__ = init


def _patch_module_forward():
    """The module's own forward between FSDP's pre- and post-forward hooks (for a compiled block: the call of its
    compiled region), as `module.forward` (the blocks) and `module.forward.root` (the root, which holds them)."""
    pre, post = st.FSDPState._pre_forward, st.FSDPState._post_forward

    @functools.wraps(pre)
    def pre_forward(self, *args, **kwargs):
        try:
            return pre(self, *args, **kwargs)
        finally:
            self._region_forward_t0 = time.perf_counter()

    @functools.wraps(post)
    def post_forward(self, *args, **kwargs):
        t0 = getattr(self, "_region_forward_t0", None)
        if t0 is not None:
            _add("module.forward.root" if getattr(self, "_is_root", False) else "module.forward", t0)
            self._region_forward_t0 = None
        return post(self, *args, **kwargs)

    st.FSDPState._pre_forward = torch._dynamo.disable(pre_forward)
    st.FSDPState._post_forward = torch._dynamo.disable(post_forward)


def _report(out):
    if int(os.environ.get("RANK", "0")) != 0:
        return
    steps = STEPS[2:-1] if len(STEPS) > 4 else STEPS[:-1]
    names = sorted({n for s in steps for n in s})
    rows = {n: {"ms_per_step": statistics.median(s.get(n, [0.0, 0])[0] * 1e3 for s in steps),
                "calls_per_step": statistics.median(s.get(n, [0.0, 0])[1] for s in steps)} for n in names}
    for n, r in rows.items():
        print(f"REGION {n:45s} {r['ms_per_step']:9.3f} ms {r['calls_per_step']:6.0f} calls", flush=True)
    if out:
        with open(out, "w") as f:
            json.dump({"steps": len(steps), "regions": rows}, f, indent=1)


def main():
    argv = sys.argv[1:]
    out = None
    if argv[:1] == ["--out"]:
        out, argv = argv[1], argv[2:]
    if argv[:1] == ["--"]:
        argv = argv[1:]
    _patch()
    sys.argv = argv
    try:
        runpy.run_path(argv[0], run_name="__main__")
    finally:
        _report(out)


if __name__ == "__main__":
    main()
