"""A model of PyTorch's CUDA caching allocator: what `memory_allocated`, `memory_reserved` and OOM would say.

Requests are rounded like the caching allocator (multiples of 512 B; requests of 1 MiB or more to 2 MiB multiples
of reserved segment space). Freed blocks stay reserved (cached) and are reused by later requests of the same rounded
size class; `empty_cache` releases them. A request that would push reserved memory beyond the device's capacity and
cannot be served from the cache raises OutOfMemory.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

SMALL = 1 << 20        # requests below this come from 2 MiB small-pool segments
SMALL_SEGMENT = 2 << 20
ROUND = 512
LARGE_ROUND = 2 << 20


class OutOfMemory(Exception):
    def __init__(self, requested: int, allocated: int, reserved: int, capacity: int):
        self.requested, self.allocated, self.reserved, self.capacity = requested, allocated, reserved, capacity
        gib = 2**30
        super().__init__(
            f"CUDA out of memory. Tried to allocate {requested / gib:.2f} GiB. GPU has a total capacity of "
            f"{capacity / gib:.2f} GiB of which {(capacity - reserved) / gib:.2f} GiB is free. "
            f"{allocated / gib:.2f} GiB is allocated by PyTorch, and {(reserved - allocated) / gib:.2f} GiB is "
            f"reserved by PyTorch but unallocated. (simulated by Phantora)")


def round_size(n: int) -> int:
    return max(ROUND, (n + ROUND - 1) // ROUND * ROUND)


@dataclass
class CachingAllocator:
    capacity: int
    allocated: int = 0
    reserved: int = 0
    peak_allocated: int = 0
    peak_reserved: int = 0
    num_allocs: int = 0
    num_ooms: int = 0
    _blocks: dict[int, int] = field(default_factory=dict)            # block id -> rounded size
    _cache: dict[int, int] = field(default_factory=lambda: defaultdict(int))  # segment size class -> cached bytes
    _small_free: int = 0                                               # free bytes inside small-pool segments

    def _segment(self, size: int) -> int:
        return (size + LARGE_ROUND - 1) // LARGE_ROUND * LARGE_ROUND

    def alloc(self, block: int, nbytes: int) -> int:
        """Allocate; returns the rounded size. Raises OutOfMemory."""
        size = round_size(int(nbytes))
        if size < SMALL:
            if self._small_free < size:
                grow = SMALL_SEGMENT
                if self.reserved + grow > self.capacity:
                    self.num_ooms += 1
                    raise OutOfMemory(size, self.allocated, self.reserved, self.capacity)
                self.reserved += grow
                self._small_free += grow
            self._small_free -= size
        else:
            seg = self._segment(size)
            if self._cache[seg] >= seg:
                self._cache[seg] -= seg
            else:
                if self.reserved + seg > self.capacity:
                    # the caching allocator frees its cache and retries before giving up
                    cached = sum(self._cache.values())
                    if self.reserved - cached + seg > self.capacity:
                        self.num_ooms += 1
                        raise OutOfMemory(size, self.allocated, self.reserved, self.capacity)
                    self.reserved -= cached
                    self._cache.clear()
                self.reserved += seg
        self._blocks[block] = size
        self.allocated += size
        self.num_allocs += 1
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        return size

    def free(self, block: int) -> int:
        size = self._blocks.pop(block, 0)
        if not size:
            return 0
        self.allocated -= size
        if size < SMALL:
            self._small_free += size
        else:
            self._cache[self._segment(size)] += self._segment(size)
        return size

    def empty_cache(self) -> None:
        cached = sum(self._cache.values())
        self.reserved -= cached
        self._cache.clear()

    def reset_peak(self) -> None:
        self.peak_allocated = self.allocated
        self.peak_reserved = self.reserved

    def stats(self) -> dict[str, int]:
        return {"allocated_bytes": self.allocated, "reserved_bytes": self.reserved,
                "peak_allocated_bytes": self.peak_allocated, "peak_reserved_bytes": self.peak_reserved,
                "num_allocs": self.num_allocs, "num_ooms": self.num_ooms}
