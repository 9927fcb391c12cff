"""How the torch.cuda stand-ins enter the stubs and hand ops to the runtime: each entry point is bracketed for the
CPU-time meter, and its op is submitted to (or waited for on) the rank's runtime with the host time it claimed."""

from __future__ import annotations

from typing import Any

from phantora.engine.ops import Op, OpKind

from .clock import METER
from .cuda_device import _ctx


class _Entry:
    """Brackets a stub entry point for the CPU-time meter."""

    __slots__ = ()

    def __enter__(self):
        METER.enter()
        return self

    def __exit__(self, *exc):
        METER.exit()
        return False


_ENTRY = _Entry()


def _submit(kind: OpKind, **fields: Any) -> None:
    with _ENTRY:
        _ctx().runtime.submit(Op(kind, cpu_delta=METER.claim(), **fields))


def _wait(kind: OpKind, **fields: Any) -> float:
    with _ENTRY:
        return _ctx().runtime.wait(Op(kind, cpu_delta=METER.claim(), **fields))


def _event_done(event_id: int) -> bool:
    """Whether an event has completed by the rank's virtual time now. The framework's host time so far is charged
    first, so a loop that polls an event (`while not e.query(): ...`) moves the clock and sees the event complete
    when the GPU gets there, as on a GPU; the query's own work is the stubs' and is not counted."""
    with _ENTRY:
        rt = _ctx().runtime
        spent = METER.claim()
        if spent:
            rt.advance_cpu(spent)
        return rt.event_done(event_id)
