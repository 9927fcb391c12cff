"""The network as the engine sees it: a topology, a collective planner and one flow simulator shared by all traffic."""

from __future__ import annotations

from ..cluster import ClusterSpec
from .collectives import CollectivePlanner, Plan
from .flowsim import FlowSim
from .topology import Topology


class Network:
    def __init__(self, spec: ClusterSpec):
        self.spec = spec
        self.topo = Topology(spec)
        self.planner = CollectivePlanner(self.topo)
        self.sim = FlowSim(self.topo.capacity, self.topo.latency)

    @property
    def now(self) -> float:
        return self.sim.now

    def plan(self, op: str, ranks: tuple[int, ...], input_bytes: int, root: int = 0,
             algo: str | None = None, proto: str | None = None) -> Plan:
        return self.planner.plan(op, ranks, input_bytes, root, algo, proto)

    def start(self, tag: int, plan: Plan) -> None:
        """Put a planned collective's flows on the network at the current time (call advance_to first)."""
        if len(plan.src) == 0:
            self.sim.add_flows([self._empty()], [0.0], tag, extra_latency=plan.latency_s, path_latency=False)
            return
        paths = self.planner.paths(plan.src, plan.dst, plan.channel)
        self.sim.add_flows(paths, plan.flow_bytes, tag, extra_latency=plan.latency_s, path_latency=False)

    @staticmethod
    def _empty():
        import numpy as np
        return np.zeros(0, dtype=np.int64)

    def next_event_time(self) -> float:
        return self.sim.next_event_time()

    def advance_to(self, t: float) -> list[tuple[int, float]]:
        return self.sim.advance_to(t)

    def time_alone(self, op: str, ranks: tuple[int, ...], input_bytes: int, root: int = 0,
                   algo: str | None = None, proto: str | None = None) -> tuple[float, Plan]:
        """Seconds one collective takes on an otherwise idle network (a fresh flow simulation)."""
        plan = self.plan(op, ranks, input_bytes, root, algo, proto)
        sim = FlowSim(self.topo.capacity, self.topo.latency)
        if len(plan.src) == 0:
            return plan.latency_s, plan
        paths = self.planner.paths(plan.src, plan.dst, plan.channel)
        sim.add_flows(paths, plan.flow_bytes, 0, extra_latency=plan.latency_s, path_latency=False)
        done = sim.run()
        return done[0][1], plan
