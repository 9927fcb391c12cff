"""The network as the engine sees it: a topology, a collective planner and one flow simulator shared by all traffic.

Steady-state training repeats the same collectives over and over, so two things are memoised:

- plans: `plan()` returns one shared `Plan` per (op, ranks, input bytes, root, algorithm, protocol), with the flow
  paths of each plan routed once;
- idle-network batches (`idle_shortcut=True`, what the engine uses): collectives that start together on an idle
  network (nothing in flight) are not put on the flow simulator at once. Their completion offsets are those of a
  private flow simulation of just that batch, started at time 0, and cached by the batch's plan keys; the batch's
  tags complete at start + offset. If anything else starts while the batch is still running, the batch is put on the
  shared flow simulator at its original start time and contends from then on exactly as if it had been there all
  along. The offsets of a batch are a pure function of its plans, so the result never depends on whether the cache
  was warm; it can differ from putting the batch on the shared simulator in the last bits of a float (a sum taken
  from 0 rather than from the start time).
"""

from __future__ import annotations

import numpy as np
import numpy.ma  # noqa: F401  the flow simulator's first np.unique imports it (~50 ms): import it with the module

from ..cluster import ClusterSpec
from .collectives import CollectivePlanner, Plan
from .flowsim import FlowSim
from .topology import Topology

_EMPTY_PATH = np.zeros(0, dtype=np.int64)


class _Batch:
    """Collectives started together on an idle network, not (yet) on the shared flow simulator."""
    __slots__ = ("t0", "members", "ends", "order", "reported")

    def __init__(self, t0: float):
        self.t0 = t0
        self.members: list[tuple[int, Plan]] = []   # (tag, plan) in start order
        self.ends: list[float] | None = None        # completion time of each member, once fixed
        self.order: list[int] = []                  # members by (completion time, start order)
        self.reported = 0                           # members whose completion advance_to returned


class Network:
    def __init__(self, spec: ClusterSpec, *, idle_shortcut: bool = False):
        self.spec = spec
        self.topo = Topology(spec)
        self.planner = CollectivePlanner(self.topo)
        self.sim = FlowSim(self.topo.capacity, self.topo.latency)
        self.idle_shortcut = idle_shortcut
        self._plans: dict[tuple, Plan] = {}
        self._plan_key: dict[int, tuple] = {}          # id(plan) -> key, for plans made (and kept) by plan()
        self._paths: dict[int, list[np.ndarray]] = {}  # id(plan) -> routed flow paths
        self._batch_ends: dict[tuple, tuple[float, ...]] = {}
        self._batch: _Batch | None = None
        self._now = 0.0
        self._ignore: set[int] = set()                 # tags already reported from a batch later put on the sim
        self._late: list[tuple[int, float]] = []       # tags that completed while a batch was put on the sim
        self.batches_started = 0
        self.batches_materialized = 0

    @property
    def now(self) -> float:
        return max(self._now, self.sim.now)

    @property
    def idle(self) -> bool:
        """True when nothing is in flight."""
        return self._batch is None and not self._late and self.sim.idle

    def plan(self, op: str, ranks: tuple[int, ...], input_bytes: int, root: int = 0,
             algo: str | None = None, proto: str | None = None) -> Plan:
        """The plan of one collective (shared: callers must not modify it)."""
        key = (op, ranks, input_bytes, root, algo, proto)
        p = self._plans.get(key)
        if p is None:
            p = self._plans[key] = self.planner.plan(op, ranks, input_bytes, root, algo, proto)
            self._plan_key[id(p)] = key
        return p

    def paths(self, plan: Plan) -> list[np.ndarray]:
        """Link ids of every flow of `plan`."""
        paths = self._paths.get(id(plan))
        if paths is None:
            paths = self.planner.paths(plan.src, plan.dst, plan.channel)
            if id(plan) in self._plan_key:
                self._paths[id(plan)] = paths
        return paths

    def start(self, tag: int, plan: Plan) -> None:
        """Put a planned collective's flows on the network at the current time (call advance_to first)."""
        if self.idle_shortcut and id(plan) in self._plan_key:
            b = self._batch
            if b is None and self.sim.idle and not self._late:
                b = self._batch = _Batch(self._now)
                b.members.append((tag, plan))
                self.batches_started += 1
                return
            if b is not None and b.t0 == self._now and b.reported == 0:
                b.members.append((tag, plan))
                b.ends = None
                return
        if self._batch is not None:
            self._materialize()
        self._start_on(self.sim, tag, plan)

    def _start_on(self, sim: FlowSim, tag: int, plan: Plan) -> None:
        if len(plan.src) == 0:
            sim.add_flows([_EMPTY_PATH], [0.0], tag, extra_latency=plan.latency_s, path_latency=False)
            return
        sim.add_flows(self.paths(plan), plan.flow_bytes, tag, extra_latency=plan.latency_s, path_latency=False)

    def _fix(self, b: _Batch) -> list[float]:
        """Completion times of a batch's members (computed once per distinct batch)."""
        if b.ends is None:
            key = tuple(self._plan_key[id(p)] for _, p in b.members)
            offsets = self._batch_ends.get(key)
            if offsets is None:
                sim = FlowSim(self.topo.capacity, self.topo.latency)
                for i, (_, p) in enumerate(b.members):
                    self._start_on(sim, i, p)
                done = dict(sim.run())
                offsets = self._batch_ends[key] = tuple(done[i] for i in range(len(b.members)))
            t0 = b.t0
            ends = b.ends = [t0 + off for off in offsets]
            b.order = sorted(range(len(ends)), key=lambda i: (ends[i], i))
        return b.ends

    def _materialize(self) -> None:
        """Put the current batch on the shared flow simulator as of its start time, then catch up to now."""
        b, self._batch = self._batch, None
        self.batches_materialized += 1
        ends = b.ends
        self.sim.advance_to(b.t0)
        for tag, plan in b.members:
            self._start_on(self.sim, tag, plan)
        if ends is not None and b.reported:
            self._ignore.update(b.members[i][0] for i in b.order[:b.reported])
        self._late.extend(self._filter(self.sim.advance_to(self._now)))

    def _filter(self, finished: list[tuple[int, float]]) -> list[tuple[int, float]]:
        if not self._ignore:
            return finished
        out = []
        for tag, t in finished:
            if tag in self._ignore:
                self._ignore.discard(tag)
            else:
                out.append((tag, t))
        return out

    def next_event_time(self) -> float:
        t = self.sim.next_event_time()
        if self._late:
            t = min(t, min(e for _, e in self._late))
        b = self._batch
        if b is not None:
            ends = self._fix(b)
            if b.reported < len(ends):
                t = min(t, ends[b.order[b.reported]])
        return t

    def advance_to(self, t: float) -> list[tuple[int, float]]:
        """Advance to time `t`; return (tag, completion time) of every collective that completed by then."""
        if t > self._now:
            self._now = t
        out: list[tuple[int, float]] = []
        if self._late:
            out, self._late = self._late, []
        b = self._batch
        if b is not None:
            if t > b.t0 or b.ends is not None:
                ends = self._fix(b)
                order = b.order
                while b.reported < len(order) and ends[order[b.reported]] <= t:
                    i = order[b.reported]
                    out.append((b.members[i][0], ends[i]))
                    b.reported += 1
                if b.reported == len(order):
                    self._batch = None
            return out
        return out + self._filter(self.sim.advance_to(t))

    def group_time(self, transfers: list[tuple[int, int, int]]) -> float:
        """Seconds an NCCL group of point-to-point transfers `(src, dst, bytes)` takes on an otherwise idle network:
        every transfer starts at once and they share the links (an all-to-all with split sizes, as the engine runs
        the group the stubs emit for it)."""
        sim = FlowSim(self.topo.capacity, self.topo.latency)
        tags = 0
        for src, dst, nbytes in transfers:
            if src == dst or nbytes <= 0:
                continue
            self._start_on(sim, tags, self.plan("send_recv", (src, dst), nbytes))
            tags += 1
        return max((t for _, t in sim.run()), default=0.0)

    def time_alone(self, op: str, ranks: tuple[int, ...], input_bytes: int, root: int = 0,
                   algo: str | None = None, proto: str | None = None) -> tuple[float, Plan]:
        """Seconds one collective takes on an otherwise idle network (a fresh flow simulation)."""
        plan = self.plan(op, ranks, input_bytes, root, algo, proto)
        if len(plan.src) == 0:
            return plan.latency_s, plan
        sim = FlowSim(self.topo.capacity, self.topo.latency)
        sim.add_flows(self.paths(plan), plan.flow_bytes, 0, extra_latency=plan.latency_s, path_latency=False)
        done = sim.run()
        return done[0][1], plan

