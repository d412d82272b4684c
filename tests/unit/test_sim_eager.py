"""The DAG as the executor's emulated links run it: a late RECV does not hold its transfer
(pipert.sim.eager)."""
import dataclasses

import pytest

from pipert.compiler import compile
from pipert.cost import UniformCost
from pipert.cost.topology import Links, LinkSpec, Topology
from pipert.ir.ops import Op
from pipert.schedules import build_schedule
from pipert.sim import simulate
from pipert.sim.eager import eager_analysis
from pipert.sim.timing import run_timing

LINKS = Links(Topology(2, num_dcs=2), {"inter_dc": LinkSpec(3.0)})
COST = UniformCost(tf=1.0, tb=2.0, t_opt=0.0)


def _late_recv_program():
    """GPipe on 2 ranks, 2 micro-batches, with rank 1's RECV of micro-batch 1 moved after its F of
    micro-batch 0."""
    s = build_schedule("gpipe", stages=2, microbatches=2)
    acts = list(s.actions[1])
    recv = next(a for a in acts if a.op is Op.RECV and a.mb == (1,))
    acts.remove(recv)
    acts.insert(next(i for i, a in enumerate(acts) if a.op is Op.F) + 1, recv)
    return compile(dataclasses.replace(s, actions=[s.actions[0], acts]))


def _f_start(program, times, g, mb: int) -> float:
    i = next(i for i, a in enumerate(program.actions[1]) if a.op is Op.F and a.mb == (mb,))
    return times.start[g.node_of[1][i]]


def test_a_late_recv_does_not_delay_its_transfer():
    program = _late_recv_program()
    engine = simulate(program, COST, links=LINKS)
    g = eager_analysis(program, COST, LINKS)
    eager, _, errors = run_timing(g)
    assert not errors
    # m1 leaves rank 0 at 2 and lands 3 later; rank 1 posts its RECV at 5 (after F u1 m0, 4-5)
    assert _f_start(program, engine.times, engine.graph, 1) == pytest.approx(8.0)  # rendezvous: 5 + 3
    assert _f_start(program, eager, g, 1) == pytest.approx(5.0)
    assert eager.makespan == pytest.approx(engine.makespan - 3.0)


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "zb-h1"])
def test_recvs_posted_before_their_messages_leave_time_as_the_engine(name):
    """The compiled lists post each RECV a compute ahead of its reader: with a latency under a
    compute's time every RECV is posted before its message leaves."""
    program = compile(name, stages=2, microbatches=4)
    links = Links(Topology(2, num_dcs=2), {"inter_dc": LinkSpec(0.5)})
    engine = simulate(program, COST, links=links)
    eager, _, _ = run_timing(eager_analysis(program, COST, links))
    assert eager.makespan == pytest.approx(engine.makespan, rel=1e-12)
    computes = [n for nodes in engine.graph.compute_nodes for n in nodes]  # a transfer may leave earlier
    assert [eager.start[n] for n in computes] == pytest.approx([engine.times.start[n] for n in computes], rel=1e-12)


def test_with_a_latency_over_a_compute_the_compiled_gpipe_gains_from_eager_links():
    """GPipe's rank 1 posts RECV m2 after F u1 m0: under a 3-unit latency the engine holds the
    message until then, the emulated link does not."""
    program = compile("gpipe", stages=2, microbatches=4)
    engine = simulate(program, COST, links=LINKS)
    eager, _, _ = run_timing(eager_analysis(program, COST, LINKS))
    assert eager.makespan < engine.makespan - 1.0
