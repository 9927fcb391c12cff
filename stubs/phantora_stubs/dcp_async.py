"""`torch.distributed.checkpoint.async_save` in a simulated rank: staged as on a GPU, written without a second thread.

A real `async_save` copies every tensor of the state dict to host memory (the stager: plain, pinned or shared host
memory, blocking or non-blocking copies, on the calling thread or a staging thread), then writes the copies from a
background thread or process (`AsyncCheckpointerType.THREAD` / `PROCESS`) while training goes on, and returns a
future (an `AsyncSaveResponse` with a staging future as well when the stager stages asynchronously). Its stagers
copy each tensor's storage into host storage through the data pointer a fake tensor does not have, so it fails here.

Simulated (`patch_state_dict_saver` replaces the function when torch imports it): after the same check of a CPU backend, each simulated CUDA tensor is
copied to the host on the calling thread, a device-to-host copy on the cluster's PCIe link (to pinned host memory
when the stager pins, as `DefaultStager(StagingOptions(use_pinned_memory=True))` does), blocking; `dcp.save` then
writes the host copies with its Python left out of the rank's host work (it runs beside training in a real run;
its object collectives on the CPU group are kept); the futures returned are done. So a checkpoint step costs the
staging copies, as a blocking stager's does; a stager that copies without blocking, on a thread of its own, hides
part of them in a real run, which this does not model. State dicts without simulated tensors take torch's own path.
"""

from __future__ import annotations

import functools
import sys
from concurrent.futures import Future
from typing import Any

import torch
from torch.utils import _pytree as pytree

from .clock import unmetered
from .values import simulated


def _simulated(t: Any) -> bool:
    """A tensor of the simulation: on the (simulated) GPU, a DTensor among them, or a fake host tensor."""
    return isinstance(t, torch.Tensor) and (t.device.type == "cuda" or simulated(t))


def _done() -> Future:
    f: Future = Future()
    f.set_result(None)
    return f


def _staging_options(stager: Any) -> tuple[bool, bool]:
    """(pinned host memory, staged asynchronously) of the stager: a `DefaultStager`'s options, a
    `BlockingAsyncStager`'s pinned copies (`FileSystemWriter` is one); neither for no stager."""
    config = getattr(stager, "_config", None)
    if config is not None:
        return bool(getattr(config, "use_pinned_memory", False)), bool(getattr(config, "use_async_staging", False))
    from torch.distributed.checkpoint import staging
    blocking = getattr(staging, "BlockingAsyncStager", None)
    return (blocking is not None and isinstance(stager, blocking)), False


def patch_state_dict_saver(module: Any) -> None:
    original = module.async_save
    if getattr(original, "__phantora__", False):
        return
    save = module.save

    @functools.wraps(original)
    def async_save(state_dict: Any = None, *, checkpoint_id: Any = None, storage_writer: Any = None,
                   planner: Any = None, process_group: Any = None, async_checkpointer_type: Any = None,
                   async_stager: Any = None, no_dist: bool = False, use_collectives: bool = True) -> Any:
        if not any(_simulated(t) for t in pytree.tree_leaves(state_dict)) and \
                not any(isinstance(v, module.Stateful) for v in (state_dict or {}).values()):
            kwargs = {} if async_checkpointer_type is None else {"async_checkpointer_type": async_checkpointer_type}
            return original(state_dict, checkpoint_id=checkpoint_id, storage_writer=storage_writer, planner=planner,
                            process_group=process_group, async_stager=async_stager, no_dist=no_dist,
                            use_collectives=use_collectives, **kwargs)
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            pg = process_group or dist.distributed_c10d._get_default_group()
            if torch.device("cpu") not in pg._device_types:
                raise AssertionError("A CPU backend must be enabled for async save; try initializing process group "
                                     "with 'cpu:gloo,cuda:nccl'")
        stager = async_stager
        if stager is None and storage_writer is not None and hasattr(storage_writer, "stage"):
            stager = storage_writer          # an AsyncStager writer stages (torch's own rule)
        pinned, staged_async = _staging_options(stager)
        state_dict = module._stateful_to_state_dict(state_dict)

        def stage(x: Any) -> Any:
            if not isinstance(x, torch.Tensor) or x.device.type != "cuda":
                return x
            with torch.no_grad():
                host = torch.empty_like(x, device="cpu", pin_memory=pinned)
                host.copy_(x)
            return host

        staged = pytree.tree_map(stage, state_dict)
        unmetered(save)(staged, checkpoint_id=checkpoint_id, storage_writer=storage_writer, planner=planner,
                        process_group=process_group, no_dist=no_dist, use_collectives=use_collectives)
        if staged_async:
            return module.AsyncSaveResponse(staging_completion=_done(), upload_completion=_done())
        return _done()

    async_save.__phantora__ = True          # type: ignore[attr-defined]
    module.async_save = async_save
    package = sys.modules.get("torch.distributed.checkpoint")
    if package is not None and getattr(package, "async_save", None) is original:
        package.async_save = async_save
