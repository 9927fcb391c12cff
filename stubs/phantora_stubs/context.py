"""The rank's stub state, one per process: configuration, runtime, GPU preset and the installed pieces."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .config import StubConfig
from .runtime import Runtime


@dataclass
class Context:
    config: StubConfig
    runtime: Runtime
    gpu: Any                              # phantora.gpus.GPUSpec
    lib: Any = None                       # the fake CUDA library (ctypes.CDLL) on CPU-only torch, else None
    dev: Any = None                       # devstate.DeviceState, once torch is imported
    coster: Any = None                    # costing.Coster
    mem: Any = None                       # memtrack.MemoryTracker
    groups: Any = None                    # comm.GroupRegistry
    fake_mode: Any = None
    interceptor: Any = None
    extras: dict[str, Any] = field(default_factory=dict)


CTX: Context | None = None


def get() -> Context:
    if CTX is None:
        raise RuntimeError("the phantora stubs are not installed in this process (PHANTORA_RANK is not set)")
    return CTX
