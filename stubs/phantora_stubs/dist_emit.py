"""How a simulated process group turns a call into communication ops, and the work handle it returns.

`EmissionMixin` launches one collective, one point-to-point transfer, or an NCCL group marker on the group's
communication stream (comm.py); `PhantoraWork.wait()` makes the current stream wait for it (a barrier's wait also
blocks the host). It also refuses, as a real process group does, tensors on a device the group has no backend for (a
CPU tensor on an NCCL-only group). Also the helpers on tensor lists the collectives share (bytes, flattening,
dropping known values of outputs).
"""

from __future__ import annotations

import inspect
import threading
from typing import Any

import torch
import torch.distributed as dist
from phantora.engine.ops import Op, OpKind

from . import comm, context
from .clock import METER, unmetered
from .values import VALUES


def uncounted_methods(cls: type) -> type:
    """Class decorator for a stub class that stands for C++ (a process group, its work handles and futures): every
    method and property it defines (not the dunders) runs `unmetered`, its Python the stubs' own work, not the
    framework's host work (clock.py)."""
    for name, member in list(vars(cls).items()):
        if name.startswith("__"):
            continue
        if isinstance(member, property):
            setattr(cls, name, property(unmetered(member.fget) if member.fget else None,
                                        unmetered(member.fset) if member.fset else None, member.fdel,
                                        member.__doc__))
        elif isinstance(member, staticmethod):
            setattr(cls, name, staticmethod(unmetered(member.__func__)))
        elif inspect.isfunction(member):
            setattr(cls, name, unmetered(member))
    return cls


def _nbytes(tensors: Any) -> int:
    total = 0
    for t in _flat(tensors):
        total += t.numel() * t.element_size()
    return total


def _flat(tensors: Any) -> list[torch.Tensor]:
    if isinstance(tensors, torch.Tensor):
        return [tensors]
    out: list[torch.Tensor] = []
    for x in tensors or ():
        out.extend(_flat(x))
    return out


def _dispatch_device_type(tensors: Any) -> str | None:
    """The device type a c10d op on these tensors dispatches on: the dispatcher takes the highest backend of all its
    tensor arguments, CUDA over CPU (c10/core/DispatchKey.h, BackendComponent); None without tensors."""
    types = {t.device.type for t in _flat(tensors)}
    if not types:
        return None
    for preferred in ("meta", "cuda", "cpu"):
        if preferred in types:
            return preferred
    return sorted(types)[0]


def _nccl_device(pg: Any, tensors: Any) -> int | None:
    """The CUDA device an NCCL communicator of `pg` serves for a collective of these tensors (NCCL is the group's
    CUDA backend), or None."""
    if not getattr(pg, "_phantora_nccl", False):
        return None
    for t in _flat(tensors):
        if t.device.type == "cuda":
            return t.device.index if t.device.index is not None else context.get().dev.device()
    return None


def _forget(tensors: Any) -> None:
    for t in _flat(tensors):
        VALUES.drop(t)


class _Backward:
    """Backward passes in progress (any thread) and the collectives whose futures they asked for."""

    def __init__(self) -> None:
        self.depth = 0
        self.pending: list = []
        self.after: dict = {}            # key -> what runs once the outermost backward pass has returned
        self.lock = threading.Lock()


BACKWARD = _Backward()


@uncounted_methods
class _WorkFuture(torch.futures.Future):
    """A completed future whose waits order the current stream after its collective."""

    def __init__(self, work: "PhantoraWork") -> None:
        super().__init__()
        self._work = work

    def wait(self) -> Any:
        self._work.wait()
        return super().wait()

    def value(self) -> Any:
        self._work.wait()
        return super().value()


def install_backward_join() -> None:
    """torch.autograd.backward (Tensor.backward calls it) waits, when it returns, for the collectives whose futures
    were asked for during it, then, if it returned, runs what was registered in `BACKWARD.after` for it."""
    original = torch.autograd.backward
    if getattr(original, "_phantora_join", False):
        return

    def backward(*args: Any, **kwargs: Any) -> Any:
        with BACKWARD.lock:
            BACKWARD.depth += 1
        returned = False
        try:
            result = original(*args, **kwargs)
            returned = True
            return result
        finally:
            with BACKWARD.lock:
                BACKWARD.depth -= 1
                works = BACKWARD.pending if not BACKWARD.depth else []
                after = list(BACKWARD.after.values()) if not BACKWARD.depth else []
                if not BACKWARD.depth:
                    BACKWARD.pending, BACKWARD.after = [], {}
            for work in works:
                work.wait()
            for fn in after if returned else ():    # a backward pass that raised finalizes nothing
                fn()

    backward._phantora_join = True                     # type: ignore[attr-defined]
    backward.__wrapped__ = original                    # type: ignore[attr-defined]
    torch.autograd.backward = backward


@uncounted_methods
class PhantoraWork(dist._Work):
    """The handle of a simulated collective: wait() orders the current stream after it."""

    def __init__(self, event: int | None, result: Any = None, blocking: bool = False, source_rank: int = -1):
        super().__init__()
        self._event = event
        self._result = result if result is not None else []
        self._blocking = blocking
        self._waited = False
        self._source_rank = source_rank

    def wait(self, timeout: Any = None) -> bool:
        if self._waited:
            return True
        self._waited = True
        ctx = context.get()
        METER.enter()
        try:
            if self._event is not None:
                comm.join(ctx, self._event)
            if self._blocking:
                ctx.runtime.wait(Op(OpKind.SYNC_STREAM, stream=ctx.dev.stream(), cpu_delta=METER.claim()))
        finally:
            METER.exit()
        return True

    def synchronize(self) -> None:
        self.wait()

    def is_completed(self) -> bool:
        """Whether the collective has completed by the rank's virtual time now (a polling loop's own host time
        moves the clock, as with `Event.query()`); a work with no completion event (values exchanged, an object
        collective) is complete."""
        if self._event is None:
            return True
        from .cuda_ops import _event_done
        return _event_done(self._event)

    def is_success(self) -> bool:
        return True

    def exception(self) -> Any:
        return None

    def source_rank(self) -> int:
        return self._source_rank

    def result(self) -> Any:
        return self._result

    def get_future(self) -> torch.futures.Future:
        """A future of the collective that does not hold up the stream that asked for it (as a CUDA future does
        not): its Python `wait()` and `value()` order the current stream after the collective; the futures a
        backward pass asks for (DistributedDataParallel's buckets, whose C++ waits are not seen here) are waited
        when the backward pass returns, where the Reducer's own end-of-backward waits put the stream."""
        fut = _WorkFuture(self)
        fut.set_result(self._result)
        if not self._waited and BACKWARD.depth:
            with BACKWARD.lock:
                BACKWARD.pending.append(self)
        return fut

    def _get_duration(self) -> float:
        return 0.0


class EmissionMixin:
    """The launch helpers of `PhantoraProcessGroup` (it sets `self._info`), shared by its collectives and its
    point-to-point calls."""

    # -- device check ---------------------------------------------------------------------------------------------
    def _check_backend_device(self, *tensor_args: Any) -> None:
        """A collective or transfer of tensors on a device the group has no backend for fails as c10d's
        `ProcessGroup::getBackend` makes it fail (torch/csrc/distributed/c10d/ProcessGroup.cpp): an all-reduce of a
        CPU tensor on an NCCL-only group raises "No backend type associated with device type cpu" on a GPU run. The
        devices are those of the backend string the group was made with (dist_group_creation._backend_map:
        "nccl" CUDA; "gloo" and "cpu:gloo,cuda:nccl" CPU and CUDA; the default backend what torch's BackendConfig
        gives it, from torch 2.6 only the detected accelerator's: CUDA)."""
        served = getattr(self, "_phantora_devices", None) or getattr(self, "default_devices", None)
        if not served:
            return
        device_type = _dispatch_device_type(tensor_args)
        if device_type is not None and device_type not in served:
            raise RuntimeError(f"No backend type associated with device type {device_type}")

    # -- emission helpers -----------------------------------------------------------------------------------------
    def _collective(self, name: str, nbytes: int, root: int = -1, result: Any = None,
                    blocking: bool = False) -> PhantoraWork:
        ctx = context.get()
        METER.enter()
        try:
            event = comm.launch(ctx, OpKind.COLLECTIVE, name, self._info, nbytes, root,
                                device=_nccl_device(self, result))
        finally:
            METER.exit()
        return PhantoraWork(event, result, blocking)

    def _p2p(self, kind: OpKind, tensors: Any, peer: int) -> PhantoraWork:
        self._check_backend_device(tensors)
        if not 0 <= int(peer) < self.size():
            raise ValueError(f"invalid peer rank {peer} for a {'send' if kind == OpKind.SEND else 'receive'} in a "
                             f"process group of {self.size()} rank(s)")
        ctx = context.get()
        METER.enter()
        try:
            event = comm.launch(ctx, kind, "send" if kind == OpKind.SEND else "recv", self._info,
                                _nbytes(tensors), int(peer))
        finally:
            METER.exit()
        return PhantoraWork(event, list(_flat(tensors)), source_rank=int(peer))

    def _group_marker(self, kind: OpKind) -> None:
        METER.enter()
        try:
            comm.group_marker(context.get(), kind)
        finally:
            METER.exit()
