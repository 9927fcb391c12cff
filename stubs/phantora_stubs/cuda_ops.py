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
