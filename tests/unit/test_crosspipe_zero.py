"""CrossPipe's generators under ZeRO: each unit's weight all-gather priced as the simulator prices
the program ``replicate`` writes (after the optimizer step under ZeRO 1/2, before the first F
under ZeRO 3), so the generator's own makespan is the simulated one."""
from __future__ import annotations

import pytest

from pipert import compile
from pipert.cost import Links, Topology, UniformCost
from pipert.cost.topology import LinkSpec
from pipert.ir import Payload
from pipert.schedules.crosspipe.build import replica_gathers
from pipert.schedules.crosspipe.model import pattern_units, problem_from_cost
from pipert.sim import simulate

COST = UniformCost(tf=0.5, tb=1.0, t_opt=0.25)
INF = float("inf")
# (P, D, DCs, latency, bandwidth, per-message transfer): the replicas' groups cross the DC links
SETUPS = [(2, 2, 2, 0.5, INF, 1.0), (4, 2, 4, 0.25, INF, 2.0), (4, 2, 2, 0.5, 1.0, 0.0)]


def _links(P: int, D: int, dcs: int, lat: float, bw: float, tr: float) -> Links:
    return Links(Topology(P * D, num_dcs=dcs), {"inter_dc": LinkSpec(lat, bw, tr)})


@pytest.mark.parametrize("setup", SETUPS)
@pytest.mark.parametrize("name", ["crosspipe-greedy", "crosspipe-wave", "crosspipe-optimal"])
@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_the_generators_makespan_is_the_simulated_programs(setup, name, zero):
    P, D = setup[:2]
    links = _links(*setup)
    opts = {"cost": COST, "links": links, **({"time_limit": 2.0} if name == "crosspipe-optimal" else {})}
    prog = compile(name, stages=P, microbatches=2 * P * D, dp=D, zero=zero, schedule_options=opts)
    assert prog.meta["predicted_makespan"] == pytest.approx(simulate(prog, COST, links).makespan, rel=1e-9)


def test_a_gather_blind_plan_underestimates_the_wave_under_zero():
    """Without the gathers (dp_op only, as before ``zero`` reached the generator) the estimate
    misses the step's ZeRO tail: what the test above pins down."""
    links = _links(2, 2, 2, 0.5, INF, 1.0)
    blind = compile("crosspipe-wave", stages=2, microbatches=8, dp=2, zero=1,
                    schedule_options={"cost": COST, "links": links, "zero": 0})
    assert blind.meta["predicted_makespan"] < simulate(blind, COST, links).makespan - 1.0


def test_gathers_follow_each_optimizer_step_in_unit_order():
    pr = problem_from_cost(2, 4, "wave", COST, gather_time=(1.0, 0.0, 0.0, 2.0),
                           gather_first=(False, False, False, False))
    # rank 0 holds units 0 and 3: OPT 0 [0, .25], gather 0 [.25, 1.25], OPT 3 [.25, .5], gather 3 [1.25, 3.25]
    assert pr.after_compute(0) == pytest.approx(3.25)
    assert pr.after_compute(1) == pytest.approx(0.5)
    first = problem_from_cost(2, 4, "wave", COST, gather_time=(1.0, 0.0, 0.0, 2.0), gather_first=(True,) * 4)
    assert first.after_compute(0) == pytest.approx(0.5)     # ZeRO 3's gathers precede the computes


def test_replica_gathers_price_the_weight_allgather_of_each_zero_unit():
    links = _links(2, 2, 2, 0.5, INF, 1.0)
    ranks = pattern_units("ud", 2)
    times, first = replica_gathers(ranks, 2, 2, COST, links, [0, 3])
    assert first == (False, True)
    assert times == (0.0, links.collective("allgather", (1, 3), COST.message_bytes(Payload.WEIGHT, 1)))
    assert replica_gathers(ranks, 2, 1, COST, links, 3) == ((0.0, 0.0), (True, True))    # one replica
    with pytest.raises(ValueError, match=r"zero=5: give the ZeRO stage \(0-3\) of every unit, or one per unit"):
        replica_gathers(ranks, 2, 2, COST, links, 5)


def test_the_planner_builds_one_crosspipe_order_per_gather_placement():
    from pipert.planner.auto import _zero_builds
    from pipert.planner.layouts import Layout

    def lay(family: str) -> Layout:
        return Layout(family, stages=2, dp=2, tp=1, sp=False, chunks=1, microbatches=8, micro_batch=1,
                      ranks_per_node=1, dcs=2)
    assert _zero_builds(lay("crosspipe-greedy")) == [(0,), (1, 2), (3,)]
    assert _zero_builds(lay("1f1b")) == [(0, 1, 2, 3)]


def test_zero3_gathers_open_each_ranks_list_and_overlap_the_first_chunk():
    from pipert.ir import Op
    links = _links(4, 2, 4, 0.25, INF, 2.0)
    opts = {"cost": COST, "links": links}
    prog = compile("crosspipe-wave", stages=4, microbatches=16, dp=2, zero=3, schedule_options=opts)
    for r in range(prog.num_ranks):
        acts = prog.actions[r]
        gathers = [i for i, a in enumerate(acts) if a.op is Op.ALLGATHER]
        computes = [i for i, a in enumerate(acts) if a.op in (Op.F, Op.D, Op.W)]
        assert gathers == list(range(len(gathers))) and len(gathers) == 2 and gathers[-1] < computes[0]
        assert [acts[i].unit for i in gathers] == sorted(acts[i].unit for i in gathers)
    at_opt = compile("crosspipe-wave", stages=4, microbatches=16, dp=2, zero=3, replication="at-opt",
                     schedule_options=opts)
    assert simulate(prog, COST, links).makespan < simulate(at_opt, COST, links).makespan
