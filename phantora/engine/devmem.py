"""GPU memory a process holds outside PyTorch's caching allocator (docs/cost-model.md, "Memory outside the allocator").

A CUDA process holds, besides what the caching allocator reserves: the CUDA context (with the kernels of the
libraries loaded), cuBLAS/cuBLASLt and cuDNN workspaces, and NCCL's buffers: one set for each communicator, made
when a process group runs its first collective, and one set of point-to-point buffers for each communicator, made at
its first send or receive (measured the same for one peer of 2 ranks and two peers of 4). `DeviceMemorySpec` (the cluster's `[device_memory]` table) holds the sizes,
measured with groundtruth/devmem/probe.py; `OutsideMemory` charges them to a rank's allocator model
(`CachingAllocatorModel.outside`), so an allocation that would fit in reserved memory but not beside these buffers
raises the out-of-memory a real run raises. The same code runs in the rank (its OOM) and in the engine (summaries,
replay).
"""

from __future__ import annotations

from .allocator import CachingAllocatorModel
from .ops import Op, OpKind

MIB = 1 << 20
_COLLECTIVE, _SEND, _RECV = int(OpKind.COLLECTIVE), int(OpKind.SEND), int(OpKind.RECV)


class OutsideMemory:
    """Charges one rank's memory outside the caching allocator to `allocator` as its ops go by."""

    __slots__ = ("allocator", "spec", "comms", "p2p", "parts")

    def __init__(self, allocator: CachingAllocatorModel, spec) -> None:
        self.allocator = allocator
        self.spec = spec
        self.comms: set[int] = set()             # process groups whose communicator exists on this rank
        self.p2p: set[int] = set()                # process groups whose point-to-point buffers exist
        self.parts = {"context": 0, "libraries": 0, "nccl": 0}
        self._hold("context", spec.context_mib)
        self._hold("libraries", spec.libraries_mib)

    def _hold(self, part: str, mib: float) -> None:
        n = int(mib * MIB)
        self.parts[part] += n
        self.allocator.outside += n

    def op(self, op: Op) -> None:
        """Account `op` (cheap for every kind but a group's first collective and its first transfer)."""
        k = op.kind
        if k == _COLLECTIVE:
            self._communicator(op.group)
        elif (k == _SEND or k == _RECV) and op.group not in self.p2p:
            self._communicator(op.group)              # NCCL makes the group's communicator first
            self.p2p.add(op.group)
            self._hold("nccl", self.spec.nccl_p2p_mib)

    def _communicator(self, group: int) -> None:
        if group not in self.comms:
            first = not self.comms
            self.comms.add(group)
            self._hold("nccl", self.spec.nccl_first_comm_mib if first else self.spec.nccl_comm_mib)


def spec_env(spec) -> str:
    """The sizes for a rank's environment (PHANTORA_DEVICE_MEMORY)."""
    return ",".join(repr(float(getattr(spec, k))) for k in FIELDS)


FIELDS = ("context_mib", "libraries_mib", "nccl_first_comm_mib", "nccl_comm_mib", "nccl_p2p_mib")
