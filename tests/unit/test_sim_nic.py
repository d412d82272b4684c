"""Shared NICs in the simulation (pipert.sim.nic): inter-node transfers of a node's ranks share
one NIC each way (processor sharing over the engine's DAG, pipert.sim.shared.shared_times)."""
from collections import Counter
from types import SimpleNamespace

import pytest

from pipert.cost import UniformCost
from pipert.cost.topology import Links, LinkSpec, Topology
from pipert.ir import Op
from pipert.schedules import build_schedule
from pipert.sim import simulate
from pipert.sim.shared import shared_times


def test_shared_resources_by_hand():
    # nodes 0, 1 on resource 0 (capacity 1), node 2 on resources 0 and 1, node 3 on resource 1 only
    g = SimpleNamespace(kind=[1] * 4, dur=[1.0, 1.0, 1.0, 1.0], lat=[0.5] * 4, succ=[[], [], [], []],
                        indeg=[0] * 4)
    t = shared_times(g, [(0,), (0,), (0, 1), (1,)], [1.0, 2.0])
    # resource 0 carries three at 1/3 each until all three finish at 3; node 3 runs at full speed
    assert t.end0 == pytest.approx([3.0, 3.0, 3.0, 1.0])
    assert t.end1 == pytest.approx([3.5, 3.5, 3.5, 1.5])


CASES = [("tawpipe", 6, 3, 12), ("tawpipe", 8, 4, 16), ("weipipe-interleave", 8, 4, 16), ("1f1b", 8, 4, 16)]


@pytest.mark.parametrize("name,P,G,M", CASES)
@pytest.mark.parametrize("bw", [4.0, 0.5])
def test_nic_bounds(name, P, G, M, bw):
    """A NIC as fast as G links changes nothing; one as fast as a link never speeds a program
    up and carries at most its bandwidth: the makespan covers the busiest NIC's bytes."""
    s = build_schedule(name, stages=P, microbatches=M, **({"ranks_per_node": G} if name == "tawpipe" else {}))
    cost = UniformCost(1.0, 2.0, weight_bytes=1.0, act_bytes=1.0)
    topo = Topology(P, ranks_per_node=G)
    links = Links(topo, {"inter_node": LinkSpec(0.0, bw)})
    own = simulate(s, cost, links=links).makespan
    assert simulate(s, cost, links=links, nic_bandwidth=G * bw).makespan == pytest.approx(own)
    shared = simulate(s, cost, links=links, nic_bandwidth=bw)
    nic = Counter()
    for r, _, a in s:
        if a.op is Op.SEND and topo.node_of(r) != topo.node_of(a.peer):
            nic[("out", topo.node_of(r))] += 1.0
            nic[("in", topo.node_of(a.peer))] += 1.0
    assert shared.makespan >= max(own, max(nic.values()) / bw) - 1e-9
    assert shared.bubble_ratio == pytest.approx(1 - sum(shared.busy) / (P * shared.makespan))


def test_tawpipe_slowed_by_its_shared_nic():
    """TawPipe's gradient sums and weight fetches of one node leave through one NIC at once."""
    s = build_schedule("tawpipe", stages=6, microbatches=12, ranks_per_node=3)
    cost = UniformCost(1.0, 2.0, weight_bytes=1.0)
    links = Links(Topology(6, ranks_per_node=3), {"inter_node": LinkSpec(0.0, 0.5)})
    assert simulate(s, cost, links=links, nic_bandwidth=0.5).makespan > simulate(s, cost, links=links).makespan
