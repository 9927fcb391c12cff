"""Flow-level network simulation: concurrent flows share links max-min fairly, advancing from event to event.

A flow has a path (link ids), a size (bytes), a start time and a latency added after its last byte drains. While
active, the rates of all active flows are the max-min fair allocation over the link capacities (computed by
progressive filling, vectorised with numpy so tens of thousands of flows are cheap). Rates are recomputed whenever
the set of active flows changes. Flows carry a `tag` (e.g. a collective id); `advance_to` reports tags whose flows
have all completed.
"""

from __future__ import annotations

import heapq
import math

import numpy as np

from ..errors import SimulationError

_EPS = 1e-9


def maxmin_rates(n_flows: int, entry_flow: np.ndarray, entry_link: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """Max-min fair rates by progressive filling.

    `entry_flow[i]` crosses link `entry_link[i]`; every flow must have at least one entry.
    """
    rate = np.zeros(n_flows)
    if n_flows == 0:
        return rate
    # compress to the links actually used
    links, local_link = np.unique(entry_link, return_inverse=True)
    rem = capacity[links].astype(np.float64).copy()
    cap0 = rem.copy()
    active_flow = np.ones(n_flows, dtype=bool)
    ef, el = entry_flow, local_link
    nl = len(links)
    while ef.size:
        counts = np.bincount(el, minlength=nl)
        used = counts > 0
        share = np.full(nl, np.inf)
        share[used] = rem[used] / counts[used]
        inc = share.min()
        if not np.isfinite(inc):
            break
        rate[active_flow] += inc
        rem -= inc * counts
        saturated = used & (rem <= _EPS * cap0)
        frozen_flows = np.unique(ef[saturated[el]])
        active_flow[frozen_flows] = False
        keep = active_flow[ef]
        ef, el = ef[keep], el[keep]
    return rate


class FlowSim:
    """Event-driven flow simulator over links with fixed capacities (bytes/s) and latencies (s)."""

    def __init__(self, capacity: np.ndarray, latency: np.ndarray | None = None):
        self.capacity = np.asarray(capacity, dtype=np.float64)
        self.latency = np.zeros_like(self.capacity) if latency is None else np.asarray(latency, dtype=np.float64)
        # a NaN, infinite or zero rate would never let a flow drain: refuse it here rather than loop
        bad = ~(np.isfinite(self.capacity) & (self.capacity > 0))
        if bad.any():
            i = int(np.argmax(bad))
            raise SimulationError(f"flow simulator: link {i} has capacity {self.capacity[i]!r} B/s; every link "
                                  f"needs a finite positive rate (check the cluster's bandwidth figures)")
        bad = ~(np.isfinite(self.latency) & (self.latency >= 0))
        if bad.any():
            i = int(np.argmax(bad))
            raise SimulationError(f"flow simulator: link {i} has latency {self.latency[i]!r} s; every link needs a "
                                  f"finite latency >= 0 (check the cluster's hop latencies)")
        self.now = 0.0
        # active (draining) flows, struct-of-arrays
        self._paths: list[np.ndarray] = []
        self._remaining = np.zeros(0)
        self._rate = np.zeros(0)
        self._lat = np.zeros(0)
        self._tag = np.zeros(0, dtype=np.int64)
        self._dirty = False
        self._entry_flow = np.zeros(0, dtype=np.int64)
        self._entry_link = np.zeros(0, dtype=np.int64)
        # flows that drained and wait out their latency: heap of (time, seq, tag)
        self._landing: list[tuple[float, int, int]] = []
        self._seq = 0
        self._open: dict[int, int] = {}       # tag -> flows not yet completed
        self._done_at: dict[int, float] = {}  # tag -> completion time of its last flow so far
        self.flows_started = 0

    # ------------------------------------------------------------------------------------------------ flows
    def add_flows(self, paths: list[np.ndarray], sizes, tag: int, *, extra_latency: float = 0.0,
                  path_latency: bool = True) -> None:
        """Start flows now. Zero-size flows and empty paths complete after their latency alone."""
        sizes = np.broadcast_to(np.asarray(sizes, dtype=np.float64), (len(paths),))
        if not (np.all(np.isfinite(sizes)) and math.isfinite(extra_latency)):
            raise SimulationError(f"flow simulator: flows of tag {tag} have a non-finite size or latency")
        self._open[tag] = self._open.get(tag, 0) + len(paths)
        self._done_at.setdefault(tag, self.now)
        self.flows_started += len(paths)
        new_paths, new_rem, new_lat = [], [], []
        for path, size in zip(paths, sizes):
            lat = extra_latency + (float(self.latency[path].sum()) if (path_latency and len(path)) else 0.0)
            if size <= 0 or len(path) == 0:
                self._land(self.now + lat, tag)
                continue
            new_paths.append(path)
            new_rem.append(size)
            new_lat.append(lat)
        if not new_paths:
            return
        self._paths.extend(new_paths)
        self._remaining = np.concatenate([self._remaining, new_rem])
        self._lat = np.concatenate([self._lat, new_lat])
        self._tag = np.concatenate([self._tag, np.full(len(new_paths), tag, dtype=np.int64)])
        self._rate = np.concatenate([self._rate, np.zeros(len(new_paths))])
        self._dirty = True

    def _land(self, t: float, tag: int) -> None:
        heapq.heappush(self._landing, (t, self._seq, tag))
        self._seq += 1

    def _recompute(self) -> None:
        n = len(self._paths)
        if n:
            lens = np.fromiter((len(p) for p in self._paths), dtype=np.int64, count=n)
            self._entry_flow = np.repeat(np.arange(n, dtype=np.int64), lens)
            self._entry_link = np.concatenate(self._paths)
            self._rate = maxmin_rates(n, self._entry_flow, self._entry_link, self.capacity)
        else:
            self._rate = np.zeros(0)
        self._dirty = False

    # ------------------------------------------------------------------------------------------------ time
    def _next_drain(self) -> float:
        if self._dirty:
            self._recompute()
        if not len(self._remaining):
            return math.inf
        with np.errstate(divide="ignore", invalid="ignore"):
            t = self.now + float(np.min(self._remaining / self._rate))
        if not t < math.inf:     # a flow with no rate (or NaN) would never drain: stop rather than loop
            raise SimulationError(f"flow simulator: {len(self._remaining)} active flow(s) can make no progress at "
                                  f"t = {self.now!r} s (a rate of zero or NaN)")
        return t

    def next_event_time(self) -> float:
        """Earliest time at which a flow drains or completes (inf when idle)."""
        t = self._next_drain()
        if self._landing:
            t = min(t, self._landing[0][0])
        return t

    @property
    def idle(self) -> bool:
        return not self._paths and not self._landing

    def advance_to(self, t: float) -> list[tuple[int, float]]:
        """Advance to time `t`; return (tag, completion time) for every tag whose flows have all completed."""
        finished: list[tuple[int, float]] = []
        while True:
            drain = self._next_drain()
            land = self._landing[0][0] if self._landing else math.inf
            step = min(drain, land, t)
            if step > self.now and len(self._remaining):
                self._remaining -= self._rate * (step - self.now)
            self.now = max(self.now, step)
            if drain <= step and len(self._remaining):
                self._drain_finished()
                continue
            if land <= step:
                while self._landing and self._landing[0][0] <= step:
                    tl, _, tag = heapq.heappop(self._landing)
                    self._open[tag] -= 1
                    self._done_at[tag] = max(self._done_at[tag], tl)
                    if self._open[tag] == 0:
                        del self._open[tag]
                        finished.append((tag, self._done_at.pop(tag)))
                continue
            if step >= t:
                break
        return finished

    def _drain_finished(self) -> None:
        rem = self._remaining
        done = rem <= np.maximum(_EPS * 1e-3, 1e-12 * self._rate)
        # guard against float residue: anything within 1 ns of draining counts as drained
        done |= rem <= self._rate * 1e-12
        if not done.any():
            i = int(np.argmin(rem / self._rate))
            done[i] = True
        idx = np.nonzero(done)[0]
        for i in idx:
            self._land(self.now + float(self._lat[i]), int(self._tag[i]))
        keep = ~done
        self._paths = [p for p, k in zip(self._paths, keep) if k]
        self._remaining = rem[keep]
        self._lat = self._lat[keep]
        self._tag = self._tag[keep]
        self._rate = self._rate[keep]
        self._dirty = True

    def run(self) -> list[tuple[int, float]]:
        """Run until every flow has completed."""
        out: list[tuple[int, float]] = []
        while not self.idle:
            out += self.advance_to(self.next_event_time())
        return out
