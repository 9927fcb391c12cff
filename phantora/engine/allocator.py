"""A model of PyTorch's CUDA caching allocator: what `torch.cuda.memory_*` report, and when OOM happens.

It follows c10/cuda/CUDACachingAllocator.cpp block by block, with addresses, so that the memory it reserves
(`memory_reserved`, the figure TorchTitan logs) includes the allocator's fragmentation, not only the live bytes:

- a request is rounded up to a multiple of 512 B (at least 512 B): what `memory_allocated` counts;
- blocks of at most 1 MiB come from the small pool, larger ones from the large pool; each pool keeps the free
  blocks of each CUDA stream apart (a block is only reused by the stream it was allocated on);
- a request takes the smallest free block of its pool and stream that fits (best fit, lowest address first) and
  splits off the rest when at least 512 B (small pool) or more than 1 MiB (large pool) remains;
- with no fitting block, a new segment is taken from the driver: 2 MiB for the small pool, 20 MiB for large
  requests under 10 MiB, otherwise the request rounded up to 2 MiB (what `memory_reserved` counts);
- a freed block merges with free neighbours of its segment and stays cached;
- when the driver has no room for a segment, every wholly free segment is given back and the request retried;
  only then is it out of memory (`empty_cache()` gives back the same segments).

With `expandable_segments:True` in `PYTORCH_CUDA_ALLOC_CONF` (or `PYTORCH_ALLOC_CONF`), as TorchTitan's launch
script sets, each pool and stream has one segment of virtual address space that grows by mapping pages (2 MiB in
the small pool, 20 MiB in the large) at its end, blocks split whenever 512 B or more remain, and giving memory
back unmaps the whole pages inside free blocks. The best-fit search then prefers a free block that cannot grow
over one next to unmapped space, as PyTorch's does.

Not modelled: `max_split_size_mb`, `roundup_power2_divisions`, `garbage_collection_threshold` (PyTorch's defaults
are assumed), blocks kept alive by `record_stream` until other streams finish with them, CUDA graph pools, and
memory outside PyTorch's allocator (CUDA context, NCCL buffers). groundtruth/allocator/ holds the event logs of
real runs that tests/test_allocator_measured.py replays through this model.

One model serves the ranks (memory queries, OOM at the user's line) and the engine (replay under another VRAM).
"""

from __future__ import annotations

import difflib

import bisect
from dataclasses import dataclass
from typing import Mapping

from phantora.errors import PhantoraError, SimulationError

MIN_BLOCK = 512
SMALL_SIZE = 1 << 20          # blocks up to 1 MiB live in the small pool
SMALL_BUFFER = 2 << 20        # small-pool segments (and expandable small-pool pages)
LARGE_BUFFER = 20 << 20       # large-pool segments for requests under MIN_LARGE_ALLOC (and expandable pages)
MIN_LARGE_ALLOC = 10 << 20
ROUND_LARGE = 2 << 20         # larger segments are rounded up to 2 MiB
ALLOC_CONF_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")


def round_block(nbytes: int) -> int:
    """Bytes the caching allocator hands out for a request (what memory_allocated counts)."""
    if nbytes <= MIN_BLOCK:
        return MIN_BLOCK
    return -(-nbytes // MIN_BLOCK) * MIN_BLOCK


def segment_size(block: int) -> int:
    """Bytes of the segment the allocator takes from the driver for a block of `block` bytes."""
    if block <= SMALL_SIZE:
        return SMALL_BUFFER
    if block < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-block // ROUND_LARGE) * ROUND_LARGE


@dataclass(frozen=True)
class AllocatorConfig:
    """The caching allocator's settings that change what it reserves."""

    expandable_segments: bool = False

    @classmethod
    def parse(cls, text: str, source: str = "PYTORCH_CUDA_ALLOC_CONF") -> "AllocatorConfig":
        """From the value of PYTORCH_CUDA_ALLOC_CONF ('key:value,key:value'). Settings of PyTorch's that the
        model does not follow are accepted and ignored (see the module docstring); a key PyTorch does not know is
        refused, as PyTorch refuses it. `source` names where the text came from in error messages."""
        expandable = False
        for item in (text or "").split(","):
            item = item.strip()
            if not item:
                continue
            key, sep, value = item.partition(":")
            if not sep:
                raise PhantoraError(f"allocator setting {item!r} is not 'key:value' ({source})")
            key, v = key.strip(), value.strip()
            if key == "expandable_segments":
                if v not in ("True", "False"):
                    raise PhantoraError(f"expandable_segments expects True or False, not {v!r} ({source})")
                expandable = v == "True"
            elif key == "garbage_collection_threshold":
                if not _number(v) or not 0.0 < float(v) < 1.0:
                    raise PhantoraError(f"garbage_collection_threshold must lie between 0 and 1, not {v!r} "
                                        f"({source})")
            elif key == "max_split_size_mb":
                if not _number(v) or float(v) <= 0:
                    raise PhantoraError(f"max_split_size_mb must be a positive number of MiB, not {v!r} ({source})")
            elif key not in ALLOC_CONF_KEYS:     # PyTorch itself refuses a key it does not know
                near = difflib.get_close_matches(key, ALLOC_CONF_KEYS, n=1, cutoff=0.8)
                hint = f"did you mean {near[0]!r}?" if near else f"known: {', '.join(ALLOC_CONF_KEYS)}"
                raise PhantoraError(f"allocator setting {key!r} is not one PyTorch knows; {hint} ({source})")
        return cls(expandable)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "AllocatorConfig":
        """PYTORCH_CUDA_ALLOC_CONF, else PYTORCH_ALLOC_CONF (PyTorch reads the newer name when both are set)."""
        for var in reversed(ALLOC_CONF_VARS):
            if env.get(var):
                return cls.parse(env[var], source=var)
        return cls()

    def to_text(self) -> str:
        return "expandable_segments:True" if self.expandable_segments else ""


ALLOC_CONF_KEYS = ("backend", "max_split_size_mb", "max_non_split_rounding_mb", "garbage_collection_threshold",
                   "roundup_power2_divisions", "expandable_segments", "release_lock_on_cudamalloc",
                   "pinned_use_cuda_host_register", "pinned_use_host_register", "pinned_num_register_threads",
                   "pinned_use_background_threads", "pinned_reserve_segment_size_mb",
                   "graph_capture_record_stream_reuse", "per_process_memory_fraction", "pinned_free_catch_all",
                   "throw_on_cudamalloc_oom", "release_lock_on_hipmalloc", "pinned_use_hip_host_register")
"""Settings of PyTorch's CUDA caching allocator (PYTORCH_CUDA_ALLOC_CONF; c10's AllocatorConfig and
CUDAAllocatorConfig keys); any other key is refused (one close to a known key as a misspelling)."""


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


class DeviceOutOfMemory(SimulationError):
    """A simulated allocation exceeded the device's memory (the stubs raise torch.OutOfMemoryError from it)."""

    def __init__(self, requested: int, rounded: int, allocated: int, reserved: int, capacity: int,
                 outside: int = 0):
        self.requested = requested
        self.rounded = rounded
        self.allocated = allocated
        self.reserved = reserved
        self.capacity = capacity
        self.outside = outside
        beside = f" beside {outside} B outside the allocator" if outside else ""
        super().__init__(f"out of device memory: tried to allocate {rounded} B with {allocated} B allocated "
                         f"and {reserved} B reserved{beside} of {capacity} B")


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


class _Pool:
    """The counters PyTorch keeps per pool (its "small_pool" and "large_pool" stat types)."""

    __slots__ = ("allocated", "requested", "reserved", "count", "segment")

    def __init__(self) -> None:
        self.allocated, self.requested, self.reserved = _Counter(), _Counter(), _Counter()
        self.count, self.segment = _Counter(), _Counter()

    def counters(self) -> tuple:
        return self.allocated, self.requested, self.reserved, self.count, self.segment


class _Block:
    """A range of one segment: allocated, free (cached) or, in an expandable segment, not mapped."""

    __slots__ = ("addr", "size", "stream", "small", "expandable", "prev", "next", "allocated", "mapped",
                 "requested")

    def __init__(self, addr: int, size: int, stream: int, small: bool, expandable: bool, mapped: bool = True):
        self.addr = addr
        self.size = size
        self.stream = stream
        self.small = small
        self.expandable = expandable
        self.prev: _Block | None = None
        self.next: _Block | None = None
        self.allocated = False
        self.mapped = mapped
        self.requested = 0

    def key(self) -> tuple:
        return (self.size, self.addr, self)

    def is_free(self) -> bool:
        return not self.allocated and self.mapped

    def insert_after(self, other: "_Block") -> None:
        """Link `other` right after this block."""
        other.prev, other.next = self, self.next
        if self.next is not None:
            self.next.prev = other
        self.next = other

    def unlink(self) -> None:
        if self.prev is not None:
            self.prev.next = self.next
        if self.next is not None:
            self.next.prev = self.prev


class _FreeList:
    """Free blocks of one pool and stream, ordered by (size, address): bisect gives the best fit."""

    __slots__ = ("items",)

    def __init__(self):
        self.items: list[tuple] = []

    def add(self, b: _Block) -> None:
        bisect.insort(self.items, b.key())

    def remove(self, b: _Block) -> None:
        i = bisect.bisect_left(self.items, (b.size, b.addr))
        if i < len(self.items) and self.items[i][2] is b:
            del self.items[i]
            return
        raise AssertionError("allocator model: a free block is missing from its pool")


class CachingAllocatorModel:
    """Blocks, segments, byte counters and peaks, and the OOM check, for one device."""

    def __init__(self, capacity_bytes: int, config: AllocatorConfig | None = None):
        if capacity_bytes <= 0:
            raise ValueError("capacity must be positive")
        self.capacity = int(capacity_bytes)
        self.outside = 0
        """Device bytes held outside the caching allocator (CUDA context, library workspaces, NCCL buffers:
        engine/devmem.py): new driver memory must fit beside them."""
        # set_per_process_memory_fraction: PyTorch then refuses a new segment or an expansion whenever reserved
        # memory plus the segment size of the request would pass the limit, before asking the driver
        self.fraction_limit = False
        self.config = config or AllocatorConfig()
        self._expandable = self.config.expandable_segments
        self._live: dict[int, _Block] = {}          # block id -> allocated block
        self._free: dict[tuple[bool, int], _FreeList] = {}        # (small pool?, stream) -> free mapped blocks
        self._unmapped: dict[tuple[bool, int], list[tuple]] = {}  # expandable: (addr, block), by address
        self._next_addr = LARGE_BUFFER << 16        # fake device addresses, page-aligned: one range per segment
        self._segments = 0                          # cudaMalloc'd segments now held
        self.allocated = _Counter()
        self.requested = _Counter()
        self.reserved = _Counter()
        self.count = _Counter()                     # number of live blocks
        self.segment = _Counter()                   # cudaMalloc'd segments
        self.pools = {True: _Pool(), False: _Pool()}     # small pool?, -> its counters
        self.num_sync_all_streams = 0               # cache releases (empty_cache, retries): each syncs the device
        self.num_ooms = 0
        self.num_alloc_retries = 0
        self.num_device_alloc = 0
        self.num_device_free = 0

    # -- API ----------------------------------------------------------------------------------------------------
    def alloc(self, nbytes: int, block_id: int, stream: int = 0) -> int:
        """Allocate a block for a request of `nbytes` on `stream`; returns the rounded size. Raises
        DeviceOutOfMemory (and leaves the live blocks as they were) when even a released cache has no room."""
        if block_id in self._live:
            raise ValueError(f"block id {block_id} is already live")
        size = round_block(int(nbytes))
        small = size <= SMALL_SIZE
        b = self._take_free(small, stream, size)
        if b is None:
            b = self._new_block(small, stream, size)
            if b is None:
                self.num_alloc_retries += 1
                self.release_cached()
                b = self._new_block(small, stream, size)
                if b is None:
                    self.num_ooms += 1
                    raise DeviceOutOfMemory(int(nbytes), size, self.allocated.current, self.reserved.current,
                                            self.capacity, self.outside)
        self._split(b, size)
        b.allocated = True
        b.requested = int(nbytes)
        self._live[block_id] = b
        self.allocated.add(b.size)
        self.requested.add(b.requested)
        self.count.add(1)
        p = self.pools[small]
        p.allocated.add(b.size)
        p.requested.add(b.requested)
        p.count.add(1)
        return b.size

    def free(self, block_id: int) -> int:
        """Free a live block; returns its size (0 for an unknown id). The block stays cached."""
        b = self._live.pop(block_id, None)
        if b is None:
            return 0
        size = b.size
        self.allocated.sub(size)
        self.requested.sub(b.requested)
        self.count.sub(1)
        p = self.pools[b.small]
        p.allocated.sub(size)
        p.requested.sub(b.requested)
        p.count.sub(1)
        b.allocated = False
        b.requested = 0
        fl = self._free_list(b.small, b.stream)
        for nb in (b.prev, b.next):
            if nb is not None and nb.is_free():
                fl.remove(nb)
                self._absorb(b, nb)
        fl.add(b)
        return size

    def empty_cache(self) -> None:
        """Give cached memory back to the driver, as torch.cuda.empty_cache() does."""
        self.release_cached()

    def release_cached(self) -> None:
        """Free every wholly free segment (expandable: unmap the whole pages inside free blocks)."""
        self.num_sync_all_streams += 1
        for (small, stream), fl in list(self._free.items()):
            for _, _, b in list(fl.items):
                if b.expandable:
                    self._unmap(fl, b)
                elif b.prev is None and b.next is None:
                    fl.remove(b)
                    self.reserved.sub(b.size)
                    self._segments -= 1
                    self.segment.sub(1)
                    self.pools[small].reserved.sub(b.size)
                    self.pools[small].segment.sub(1)
                    self.num_device_free += 1

    def _counters(self) -> tuple:
        return (self.allocated, self.requested, self.reserved, self.count, self.segment,
                *self.pools[True].counters(), *self.pools[False].counters())

    def reset_peak(self) -> None:
        for c in self._counters():
            c.peak = c.current

    def reset_accumulated(self) -> None:
        """As PyTorch's resetAccumulatedStats: cumulative counters and the event counts."""
        for c in self._counters():
            c.allocated = 0
            c.freed = 0
        self.num_ooms = 0
        self.num_alloc_retries = 0
        self.num_sync_all_streams = 0
        self.num_device_alloc = 0
        self.num_device_free = 0

    def live_blocks(self) -> int:
        return len(self._live)

    @property
    def free_bytes(self) -> int:
        return max(self.capacity - self.reserved.current - self.outside, 0)

    @property
    def stats(self) -> dict[str, int]:
        """The flat keys of torch.cuda.memory_stats(), all of them: `<stat>.<all|small_pool|large_pool>.<current|
        peak|allocated|freed>` for the nine stat arrays, `oversize_allocations.*` / `oversize_segments.*` and the
        six event counts. Active blocks are the allocated ones (blocks held by `record_stream` are not modelled);
        the inactive split blocks (free blocks of a split segment) are counted now, so their peak is the current
        count and their cumulative counts 0; oversize blocks exist only with `max_split_size_mb`, which the model
        does not take (0, as PyTorch with its default)."""
        out: dict[str, int] = {}
        small, large = self.pools[True], self.pools[False]
        for name, pool in (("all", None), ("small_pool", small), ("large_pool", large)):
            split = [b for (is_small, _), fl in self._free.items() for _, _, b in fl.items
                     if (pool is None or is_small == (pool is small)) and not b.expandable
                     and (b.prev is not None or b.next is not None)]
            inactive = _Counter(len(split), len(split))
            inactive_bytes = sum(b.size for b in split)
            rows = (("allocated_bytes", self.allocated if pool is None else pool.allocated),
                    ("active_bytes", self.allocated if pool is None else pool.allocated),
                    ("requested_bytes", self.requested if pool is None else pool.requested),
                    ("reserved_bytes", self.reserved if pool is None else pool.reserved),
                    ("allocation", self.count if pool is None else pool.count),
                    ("active", self.count if pool is None else pool.count),
                    ("segment", self.segment if pool is None else pool.segment),
                    ("inactive_split", inactive),
                    ("inactive_split_bytes", _Counter(inactive_bytes, inactive_bytes)))
            for stat, c in rows:
                out[f"{stat}.{name}.current"] = c.current
                out[f"{stat}.{name}.peak"] = c.peak
                out[f"{stat}.{name}.allocated"] = c.allocated
                out[f"{stat}.{name}.freed"] = c.freed
        for stat in ("oversize_allocations", "oversize_segments"):
            for metric in ("current", "peak", "allocated", "freed"):
                out[f"{stat}.{metric}"] = 0
        out["num_alloc_retries"] = self.num_alloc_retries
        out["num_ooms"] = self.num_ooms
        out["num_sync_all_streams"] = self.num_sync_all_streams
        out["num_device_alloc"] = self.num_device_alloc
        out["num_device_free"] = self.num_device_free
        out["max_split_size"] = -1     # PyTorch reports SIZE_MAX as -1: no max_split_size_mb
        return out

    # -- internals ----------------------------------------------------------------------------------------------
    def _free_list(self, small: bool, stream: int) -> _FreeList:
        fl = self._free.get((small, stream))
        if fl is None:
            fl = self._free[(small, stream)] = _FreeList()
        return fl

    def _take_free(self, small: bool, stream: int, size: int) -> _Block | None:
        """The best-fitting cached block of the pool and stream, taken out of the pool (None if none fits)."""
        fl = self._free.get((small, stream))
        if fl is None:
            return None
        items = fl.items
        i = bisect.bisect_left(items, (size,))
        if i == len(items):
            return None
        if self._expandable:
            # a block next to unmapped space counts as the size it can grow to: prefer one that cannot grow
            def grow(b: _Block) -> int:
                n = b.next
                return b.size + (n.size if n is not None and not n.mapped else 0)
            while i + 1 < len(items) and grow(items[i + 1][2]) < grow(items[i][2]):
                i += 1
        b = items[i][2]
        del items[i]
        return b

    def _new_block(self, small: bool, stream: int, size: int) -> _Block | None:
        """A block of at least `size` from new driver memory (None when the device has no room for it)."""
        if self.fraction_limit and self.reserved.current + segment_size(size) > self.capacity:
            return None
        if self._expandable:
            return self._grow(small, stream, size)
        seg = segment_size(size)
        if self.reserved.current + seg + self.outside > self.capacity:
            return None
        b = _Block(self._fresh_range(seg), seg, stream, small, False)
        self.reserved.add(seg)
        self._segments += 1
        self.segment.add(1)
        self.pools[small].reserved.add(seg)
        self.pools[small].segment.add(1)
        self.num_device_alloc += 1
        return b

    def _fresh_range(self, nbytes: int) -> int:
        addr = self._next_addr
        self._next_addr += -(-nbytes // LARGE_BUFFER) * LARGE_BUFFER + LARGE_BUFFER
        return addr

    def _split(self, b: _Block, size: int) -> None:
        rest = b.size - size
        if rest >= MIN_BLOCK if (b.small or b.expandable) else rest > SMALL_SIZE:
            r = _Block(b.addr + size, rest, b.stream, b.small, b.expandable)
            b.insert_after(r)
            b.size = size
            self._free_list(b.small, b.stream).add(r)

    @staticmethod
    def _absorb(b: _Block, nb: _Block) -> None:
        """Merge the neighbouring block `nb` into `b`."""
        if nb is b.prev:
            b.addr = nb.addr
        b.size += nb.size
        nb.unlink()

    # -- expandable segments -----------------------------------------------------------------------------------
    def _grow(self, small: bool, stream: int, size: int) -> _Block | None:
        """Map pages of the pool's expandable segment for a block of `size` (PyTorch's
        try_allocate_expandable_block): the first unmapped range, with the free block before it, that has room."""
        key = (small, stream)
        unmapped = self._unmapped.setdefault(key, [])
        fl = self._free_list(small, stream)
        cand = None
        for _, u in unmapped:
            c = u.prev if u.prev is not None and u.prev.is_free() else u
            room, x = 0, c
            while room < size and x is not None and not x.allocated:
                room += x.size
                x = x.next
            if room >= size:
                cand = c
                break
        if cand is None:                            # a new segment of address space: 9/8 of the device
            page = SMALL_BUFFER if small else LARGE_BUFFER
            span = -(-(self.capacity * 9 // 8) // page) * page
            cand = _Block(self._fresh_range(span), span, stream, small, True, mapped=False)
            bisect.insort(unmapped, (cand.addr, cand))
        if cand.mapped:
            fl.remove(cand)                         # it grows into the unmapped space after it
        else:
            cand = self._map(cand, min(cand.size, size))
            if cand is None:
                return None
        while cand.size < size:
            grown = self._map(cand.next, min(size - cand.size, cand.next.size), taken=cand)
            if grown is None:
                fl.add(cand)
                return None
            cand = grown
        return cand

    def _map(self, u: _Block, nbytes: int, taken: _Block | None = None) -> _Block | None:
        """Map whole pages at the start of the unmapped block `u` to cover `nbytes` (None when the device has no
        room). The mapped part absorbs its free neighbours (`taken`, a free block already out of the pool, among
        them) and is returned out of the pool; the rest of `u` stays unmapped."""
        page = SMALL_BUFFER if u.small else LARGE_BUFFER
        n = min(-(-nbytes // page) * page, u.size)
        if self.reserved.current + n + self.outside > self.capacity:
            return None
        unmapped = self._unmapped[(u.small, u.stream)]
        del unmapped[bisect.bisect_left(unmapped, (u.addr,))]
        if n < u.size:
            rest = _Block(u.addr + n, u.size - n, u.stream, u.small, True, mapped=False)
            u.insert_after(rest)
            u.size = n
            bisect.insort(unmapped, (rest.addr, rest))
        u.mapped = True
        self.reserved.add(n)
        self.pools[u.small].reserved.add(n)
        self.num_device_alloc += 1
        fl = self._free_list(u.small, u.stream)
        for nb in (u.prev, u.next):
            if nb is not None and nb.is_free():
                if nb is not taken:
                    fl.remove(nb)
                self._absorb(u, nb)
        return u

    def _unmap(self, fl: _FreeList, b: _Block) -> None:
        """Unmap the whole pages inside the free block `b` of an expandable segment."""
        page = SMALL_BUFFER if b.small else LARGE_BUFFER
        lo = -(-b.addr // page) * page
        hi = (b.addr + b.size) // page * page
        if hi <= lo:
            return
        fl.remove(b)
        unmapped = self._unmapped.setdefault((b.small, b.stream), [])
        end = b.addr + b.size
        if lo > b.addr:                               # a mapped head stays free
            head = _Block(b.addr, lo - b.addr, b.stream, b.small, True)
            if b.prev is not None:
                b.prev.insert_after(head)
            else:
                head.next, b.prev = b, head
            fl.add(head)
        if hi < end:                                  # a mapped tail stays free
            tail = _Block(hi, end - hi, b.stream, b.small, True)
            b.insert_after(tail)
            fl.add(tail)
        b.addr, b.size, b.mapped = lo, hi - lo, False
        self.reserved.sub(hi - lo)
        self.pools[b.small].reserved.sub(hi - lo)
        self.num_device_free += 1
        for nb in (b.prev, b.next):                   # unmapped neighbours become one range
            if nb is not None and not nb.mapped:
                del unmapped[bisect.bisect_left(unmapped, (nb.addr,))]
                self._absorb(b, nb)
        bisect.insort(unmapped, (b.addr, b))
