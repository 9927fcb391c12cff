"""The network's memoised plans and its idle-network shortcut against the plain flow simulation."""

import pytest

from phantora.cluster import load_cluster
from phantora.net.network import Network

MiB = 2**20


def drive(net: Network, script: list[tuple[float, int, tuple]]) -> dict[int, float]:
    """Start collectives (time, tag, plan args) in time order the way the engine does (advance_to, then start),
    and run to the end; returns completion time by tag."""
    done: dict[int, float] = {}
    for t, tag, args in script:
        while net.next_event_time() <= t:
            done.update(net.advance_to(net.next_event_time()))
        done.update(net.advance_to(t))
        net.start(tag, net.plan(*args))
    while net.next_event_time() < float("inf"):
        done.update(net.advance_to(net.next_event_time()))
    return done


SPEC = load_cluster("h100-hgx", nodes=2)
NODE0, NODE1, WORLD = tuple(range(8)), tuple(range(8, 16)), tuple(range(16))


@pytest.mark.parametrize("script", [
    # alone, one after the other: every one is a cached batch
    [(0.0, 1, ("all_reduce", WORLD, 64 * MiB)), (0.01, 2, ("all_reduce", WORLD, 64 * MiB)),
     (0.02, 3, ("all_gather", NODE0, 4 * MiB))],
    # two together, then a third while the longer of the two still runs (the batch goes on the flow simulator
    # after one of its members has already completed)
    [(0.0, 1, ("all_gather", NODE0, MiB)), (0.0, 2, ("all_reduce", WORLD, 256 * MiB)),
     (1e-3, 3, ("reduce_scatter", NODE1, 64 * MiB)), (5e-3, 4, ("all_reduce", NODE0, 8 * MiB))],
    # a send while an all-reduce over the same NICs runs, and an empty (single-rank) collective
    [(0.0, 1, ("all_reduce", WORLD, 128 * MiB)), (2e-4, 2, ("send_recv", (0, 8), 32 * MiB)),
     (3e-4, 3, ("all_reduce", (5,), MiB))],
], ids=["sequential", "overlapping", "p2p-and-empty"])
def test_shortcut_gives_the_flow_simulation_result(script):
    fast = drive(Network(SPEC, idle_shortcut=True), script)
    full = drive(Network(SPEC), script)
    assert set(fast) == set(full) == {tag for _, tag, _ in script}
    for tag in full:
        assert fast[tag] == pytest.approx(full[tag], rel=1e-9, abs=1e-12), tag


def test_a_lone_collective_takes_its_time_alone():
    net = Network(SPEC, idle_shortcut=True)
    alone, _ = Network(SPEC).time_alone("all_reduce", WORLD, 64 * MiB)
    done = drive(net, [(0.5, 7, ("all_reduce", WORLD, 64 * MiB))])
    assert done[7] - 0.5 == pytest.approx(alone, rel=1e-12)
    assert net.batches_started == 1 and net.batches_materialized == 0 and net.idle


def test_plans_are_shared_per_key():
    net = Network(SPEC)
    a = net.plan("all_reduce", WORLD, MiB)
    assert net.plan("all_reduce", WORLD, MiB) is a
    assert net.plan("all_reduce", WORLD, 2 * MiB) is not a
    assert net.plan("all_reduce", WORLD, MiB, algo="ring") is not a or a.algo == "ring"
