"""The flow simulator against cases computable by hand, and max-min fairness invariants on random instances."""

import numpy as np
import pytest

from phantora.net.flowsim import FlowSim, maxmin_rates


def p(*links):
    return np.array(links, dtype=np.int64)


def test_one_bottleneck_shared_equally():
    # n flows through one 10 B/s link share it: each gets 10/n, all finish at n*size/10
    for n in (1, 2, 5):
        sim = FlowSim(np.array([10.0]))
        for i in range(n):
            sim.add_flows([p(0)], [20.0], tag=i)
        done = dict(sim.run())
        assert all(t == pytest.approx(n * 20.0 / 10.0) for t in done.values())


def test_parking_lot():
    # links 0 and 1 (10 B/s each); A crosses both, B only 0, C only 1: max-min gives 5 each.
    sim = FlowSim(np.array([10.0, 10.0]))
    sim.add_flows([p(0, 1)], [10.0], tag=0)
    sim.add_flows([p(0)], [10.0], tag=1)
    sim.add_flows([p(1)], [20.0], tag=2)
    done = dict(sim.run())
    assert done[0] == pytest.approx(2.0) and done[1] == pytest.approx(2.0)
    # C got 5 B/s for 2 s (10 B), then the whole link: 10 B more at 10 B/s
    assert done[2] == pytest.approx(3.0)


def test_unequal_bottlenecks_redistribute():
    # link 0: 10 B/s shared by A and B; link 1 (2 B/s) also carries B. B is capped at 2, A gets the other 8.
    rates = maxmin_rates(2, np.array([0, 1, 1]), np.array([0, 0, 1]), np.array([10.0, 2.0]))
    assert rates[0] == pytest.approx(8.0) and rates[1] == pytest.approx(2.0)


def test_paths_of_different_length_add_latency():
    cap = np.array([100.0, 100.0, 100.0])
    lat = np.array([0.5, 0.25, 0.125])
    sim = FlowSim(cap, lat)
    sim.add_flows([p(0)], [100.0], tag=0)          # 1 s of transfer + 0.5 s
    sim.add_flows([p(1, 2)], [100.0], tag=1)       # 1 s + 0.375 s
    done = dict(sim.run())
    assert done[0] == pytest.approx(1.5)
    assert done[1] == pytest.approx(1.375)


def test_flow_arriving_later_slows_the_first():
    sim = FlowSim(np.array([10.0]))
    sim.add_flows([p(0)], [30.0], tag=0)
    assert sim.advance_to(1.0) == []               # 10 B sent alone
    sim.add_flows([p(0)], [10.0], tag=1)           # now both at 5 B/s
    done = dict(sim.run())
    assert done[1] == pytest.approx(3.0)           # 10 B at 5 B/s
    assert done[0] == pytest.approx(4.0)           # 10 B shared (2 s) then 10 B alone (1 s)


def test_zero_size_and_empty_path_complete_after_latency():
    sim = FlowSim(np.array([1.0]))
    sim.add_flows([p()], [0.0], tag=7, extra_latency=2e-6)
    assert dict(sim.run())[7] == pytest.approx(2e-6)


@pytest.mark.parametrize("seed", range(5))
def test_maxmin_invariants_on_random_instances(seed):
    rng = np.random.default_rng(seed)
    n_links, n_flows = 12, 40
    cap = rng.uniform(1, 10, n_links)
    paths = [rng.choice(n_links, size=rng.integers(1, 5), replace=False) for _ in range(n_flows)]
    ef = np.concatenate([np.full(len(q), i) for i, q in enumerate(paths)])
    el = np.concatenate(paths)
    rate = maxmin_rates(n_flows, ef, el, cap)
    load = np.bincount(el, weights=rate[ef], minlength=n_links)
    assert np.all(load <= cap * (1 + 1e-9))                 # feasibility
    for i, q in enumerate(paths):                            # every flow has a bottleneck link:
        ok = False                                           # saturated, and no flow on it gets more
        for link in q:
            on_link = ef[el == link]
            if load[link] >= cap[link] * (1 - 1e-9) and rate[i] >= rate[on_link].max() * (1 - 1e-9):
                ok = True
        assert ok, f"flow {i} has no bottleneck"
