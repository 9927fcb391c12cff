"""A model of the CUDA caching allocator's bookkeeping: what `torch.cuda.memory_*` report, and when OOM happens.

Sizes follow the caching allocator's rules (c10/cuda/CUDACachingAllocator.cpp):
- a request is rounded up to a multiple of 512 B (at least 512 B): that is what `memory_allocated` counts;
- blocks of at most 1 MiB come from a small pool carved out of 2 MiB segments, larger blocks from the large pool,
  whose segments are rounded up to 2 MiB: that is what `memory_reserved` counts.
The model does not track addresses: the small pool needs ceil(small bytes / 2 MiB) segments, each large block its own
rounded segment. Reserved memory is cached (it never shrinks) until `empty_cache()`, as in PyTorch. A request fails
when the memory the live blocks need (their segments) would exceed the device's capacity, since the real allocator
frees its cache and retries before it reports OOM.

One model serves the ranks (memory queries, OOM at the user's line) and the engine (replay under another VRAM).
"""

from __future__ import annotations

from dataclasses import dataclass

from phantora.errors import SimulationError

MIN_BLOCK = 512
SMALL_SIZE = 1 << 20          # blocks up to 1 MiB live in the small pool
SMALL_SEGMENT = 2 << 20       # ... carved from 2 MiB segments
LARGE_ROUND = 2 << 20         # large segments are rounded to 2 MiB


def round_block(nbytes: int) -> int:
    """Bytes the caching allocator hands out for a request (what memory_allocated counts)."""
    if nbytes <= MIN_BLOCK:
        return MIN_BLOCK
    return -(-nbytes // MIN_BLOCK) * MIN_BLOCK


def _large_segment(block: int) -> int:
    return -(-block // LARGE_ROUND) * LARGE_ROUND


class DeviceOutOfMemory(SimulationError):
    """A simulated allocation exceeded the device's memory (the stubs raise torch.OutOfMemoryError from it)."""

    def __init__(self, requested: int, rounded: int, allocated: int, reserved: int, capacity: int):
        self.requested = requested
        self.rounded = rounded
        self.allocated = allocated
        self.reserved = reserved
        self.capacity = capacity
        super().__init__(f"out of device memory: tried to allocate {rounded} B with {allocated} B allocated "
                         f"of {capacity} B")


@dataclass
class _Counter:
    current: int = 0
    peak: int = 0
    allocated: int = 0     # cumulative
    freed: int = 0         # cumulative

    def add(self, n: int) -> None:
        self.current += n
        self.allocated += n
        if self.current > self.peak:
            self.peak = self.current

    def sub(self, n: int) -> None:
        self.current -= n
        self.freed += n


class CachingAllocatorModel:
    """Live blocks by id, byte counters and peaks, and the OOM check, for one device."""

    def __init__(self, capacity_bytes: int):
        if capacity_bytes <= 0:
            raise ValueError("capacity must be positive")
        self.capacity = int(capacity_bytes)
        self._blocks: dict[int, int] = {}          # block id -> rounded size
        self._small_bytes = 0
        self._large_segments = 0
        self.allocated = _Counter()
        self.requested = _Counter()
        self.reserved = _Counter()
        self.count = _Counter()                     # number of live blocks
        self.num_ooms = 0
        self._requested_of: dict[int, int] = {}

    # -- segments ---------------------------------------------------------------------------------------------
    def _segments_needed(self, small_bytes: int, large_segments: int) -> int:
        return -(-small_bytes // SMALL_SEGMENT) * SMALL_SEGMENT + large_segments

    def _sync_reserved(self) -> None:
        need = self._segments_needed(self._small_bytes, self._large_segments)
        if need > self.reserved.current:
            self.reserved.add(need - self.reserved.current)

    # -- API ----------------------------------------------------------------------------------------------------
    def alloc(self, nbytes: int, block_id: int) -> int:
        """Allocate a block for a request of `nbytes`; returns the rounded size. Raises DeviceOutOfMemory."""
        if block_id in self._blocks:
            raise ValueError(f"block id {block_id} is already live")
        block = round_block(int(nbytes))
        small = self._small_bytes
        large = self._large_segments
        if block <= SMALL_SIZE:
            small += block
        else:
            large += _large_segment(block)
        if self._segments_needed(small, large) > self.capacity:
            self.num_ooms += 1
            raise DeviceOutOfMemory(int(nbytes), block, self.allocated.current, self.reserved.current, self.capacity)
        self._small_bytes, self._large_segments = small, large
        self._blocks[block_id] = block
        self._requested_of[block_id] = int(nbytes)
        self.allocated.add(block)
        self.requested.add(int(nbytes))
        self.count.add(1)
        self._sync_reserved()
        return block

    def free(self, block_id: int) -> int:
        """Free a live block; returns its rounded size (0 for an unknown id)."""
        block = self._blocks.pop(block_id, None)
        if block is None:
            return 0
        if block <= SMALL_SIZE:
            self._small_bytes -= block
        else:
            self._large_segments -= _large_segment(block)
        self.allocated.sub(block)
        self.requested.sub(self._requested_of.pop(block_id, 0))
        self.count.sub(1)
        return block

    def empty_cache(self) -> None:
        """Release cached segments: reserved drops to what the live blocks need."""
        need = self._segments_needed(self._small_bytes, self._large_segments)
        if need < self.reserved.current:
            self.reserved.sub(self.reserved.current - need)

    def reset_peak(self) -> None:
        for c in (self.allocated, self.requested, self.reserved, self.count):
            c.peak = c.current

    def reset_accumulated(self) -> None:
        for c in (self.allocated, self.requested, self.reserved, self.count):
            c.allocated = 0
            c.freed = 0
        self.num_ooms = 0

    def live_blocks(self) -> int:
        return len(self._blocks)

    @property
    def free_bytes(self) -> int:
        return max(self.capacity - self.reserved.current, 0)

    @property
    def stats(self) -> dict[str, int]:
        """Counters named like the keys of torch.cuda.memory_stats()."""
        out: dict[str, int] = {}
        for name, c in (("allocated_bytes", self.allocated), ("active_bytes", self.allocated),
                        ("requested_bytes", self.requested), ("reserved_bytes", self.reserved),
                        ("allocation", self.count), ("active", self.count)):
            out[f"{name}.all.current"] = c.current
            out[f"{name}.all.peak"] = c.peak
            out[f"{name}.all.allocated"] = c.allocated
            out[f"{name}.all.freed"] = c.freed
        out["segment.all.current"] = -(-self._small_bytes // SMALL_SEGMENT) + self._large_count()
        out["num_alloc_retries"] = 0
        out["num_ooms"] = self.num_ooms
        out["num_device_alloc"] = self.reserved.allocated // LARGE_ROUND
        out["num_device_free"] = self.reserved.freed // LARGE_ROUND
        out["inactive_split_bytes.all.current"] = 0
        out["max_split_size"] = -1
        return out

    def _large_count(self) -> int:
        return sum(1 for b in self._blocks.values() if b > SMALL_SIZE)
