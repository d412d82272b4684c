"""Simulator closed forms, the link model's formulas, topology and the uniform cost model."""
from __future__ import annotations

import math

import pytest

from pipert.cost import LinkSpec, Links, Topology, UniformCost
from pipert.ir import Action, Op, Payload, Placement, Schedule
from pipert.ir.semantics import action_time
from pipert.sim import ScheduleError, simulate
from unit_testutil import gpipe, one_f_one_b


def recv_arrivals(res, rank: int) -> list[float]:
    return [e for r, q, a, s, e in res.events if r == rank and q == "recv"]


# --- closed forms at zero communication ---------------------------------------------------
@pytest.mark.parametrize("P,M", [(1, 1), (2, 3), (4, 4), (4, 9), (6, 3)])
@pytest.mark.parametrize("tf,tb", [(1.0, 2.0), (0.5, 1.25)])
def test_classic_makespan_and_bubble(P: int, M: int, tf: float, tb: float) -> None:
    cost = UniformCost(tf=tf, tb=tb)
    for build in (gpipe, one_f_one_b):
        res = simulate(build(P, M), cost)
        assert res.makespan == pytest.approx((M + P - 1) * (tf + tb))
        assert res.bubble_ratio == pytest.approx((P - 1) / (M + P - 1))
        assert res.busy == pytest.approx([M * (tf + tb)] * P)
        assert [b + i for b, i in zip(res.busy, res.idle)] == pytest.approx([res.makespan] * P)
        assert res.exposed_comm == [0.0] * P


@pytest.mark.parametrize("P,M", [(3, 2), (4, 8), (5, 5)])
def test_peak_stash_counts(P: int, M: int) -> None:
    cost = UniformCost(tf=1, tb=2, act_bytes=0)  # count stashes only
    assert simulate(one_f_one_b(P, M), cost).peak_memory == [min(P - i, M) for i in range(P)]
    assert simulate(gpipe(P, M), cost).peak_memory == [M] * P


# --- transfers: occupancy T, latency L ----------------------------------------------------
def two_ranks(T: float, L: float) -> Links:
    """Ranks 0 and 1 on different nodes; one unit-size message occupies the link for T."""
    return Links(Topology(2, ranks_per_node=1), {"inter_node": LinkSpec(latency=L, bandwidth=1.0 / T)})


def test_ping_arrives_after_occupancy_plus_latency() -> None:
    T, L, tf, tb = 3.0, 2.0, 1.0, 2.0
    res = simulate(one_f_one_b(2, 1), UniformCost(tf=tf, tb=tb), two_ranks(T, L))
    assert recv_arrivals(res, 1) == [tf + T + L]
    assert recv_arrivals(res, 0) == [tf + T + L + tf + tb + T + L]
    assert res.makespan == 2 * (tf + tb) + 2 * (T + L)
    # both ranks wait on the wire exactly once, for T + L
    assert res.exposed_comm == pytest.approx([T + L, T + L])
    sends = [(s, e) for r, q, a, s, e in res.events if q == "send" and r == 0]
    assert sends == [(tf, tf + T)]


def test_back_to_back_messages_pipeline_through_latency() -> None:
    T, L = 5.0, 3.0
    res = simulate(gpipe(2, 2), UniformCost(tf=1, tb=2), two_ranks(T, L))
    # m0 leaves at 1 (end of F u0 m0); m1 is ready at 2 but the link is busy until 1 + T
    assert recv_arrivals(res, 1)[:2] == [1 + T + L, 1 + 2 * T + L]
    starts = [s for r, q, a, s, e in res.events if r == 1 and q == "recv"][:2]
    assert starts == [1.0, 1 + T]  # the second starts during the first's latency


def test_links_per_class_and_overrides() -> None:
    topo = Topology(8, ranks_per_node=2, num_dcs=2)
    assert [topo.node_of(r) for r in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert [topo.dc_of(r) for r in range(8)] == [0] * 4 + [1] * 4
    assert [topo.link_class(0, d) for d in (0, 1, 2, 4)] == ["local", "intra_node", "inter_node", "inter_dc"]
    assert Topology(4).link_class(0, 3) == "intra_node"
    assert Topology(4, num_dcs=2).link_class(1, 2) == "inter_dc"
    links = Links(topo, {"intra_node": LinkSpec(1e-6, 100.0), "inter_dc": LinkSpec(0.5, math.inf)},
                  {(0, 2): LinkSpec(7.0, 10.0)})
    assert links.transfer(0, 1, 50.0) == (0.5, 1e-6)
    assert links.transfer(3, 4, 1e9) == (0.0, 0.5)
    assert links.transfer(0, 2, 20.0) == (2.0, 7.0)
    assert links.transfer(2, 0, 20.0) == (0.0, 0.0)  # inter_node has no spec here: free
    dc = Links.uniform_dc(topo, dc_latency=4.0, dc_transfer=1.5)
    assert dc.transfer(3, 4, 1.0) == dc.transfer(3, 4, 1e6) == (1.5, 4.0)
    assert dc.transfer(0, 3, 1e6) == (0.0, 0.0)


def test_collective_formulas() -> None:
    links = Links(Topology(4), {"intra_node": LinkSpec(latency=1.0, bandwidth=2.0)})
    b, n, lat, bw = 8.0, 4, 1.0, 2.0
    g = (0, 1, 2, 3)
    assert links.collective("allreduce", g, b) == pytest.approx(2 * (n - 1) / n * b / bw + 2 * (n - 1) * lat)
    for op in ("allgather", "reducescatter"):
        assert links.collective(op, g, b) == pytest.approx((n - 1) / n * b / bw + (n - 1) * lat)
    for op in ("broadcast", "reduce"):
        assert links.collective(op, g, b) == pytest.approx(b / bw + (n - 1) * lat)
    assert links.collective("allreduce", (2,), b) == 0.0
    with pytest.raises(ValueError, match="unknown collective"):
        links.collective("alltoall", g, b)


def test_uniform_dc_mode_in_simulation() -> None:
    # 2 ranks in 2 datacenters: each direction pays dc_transfer + dc_latency once per message
    topo = Topology(2, num_dcs=2)
    res = simulate(one_f_one_b(2, 1), UniformCost(tf=1, tb=2), Links.uniform_dc(topo, 10.0, 0.5))
    assert res.makespan == 2 * 3 + 2 * (10.0 + 0.5)
    assert res.comm_bytes["inter_dc"] == 2.0


def test_comm_bytes_per_class() -> None:
    res = simulate(one_f_one_b(4, 8), UniformCost(tf=1, tb=2, act_bytes=3), topology=Topology(4, ranks_per_node=2))
    assert res.comm_bytes == {"local": 0.0, "intra_node": 4 * 8 * 3, "inter_node": 2 * 8 * 3, "inter_dc": 0.0}


def test_collective_is_one_joint_event() -> None:
    # data parallel over 2 ranks: rank m computes micro-batch m; the weights live on rank 0
    bc = Action(Op.BROADCAST, unit=0, payload=Payload.WEIGHT, group=(0, 1), root=0)
    ar = Action(Op.ALLREDUCE, unit=0, payload=Payload.WGRAD, group=(0, 1))
    work = [[Action(Op.F, unit=0, mb=(m,)), Action(Op.B, unit=0, mb=(m,))] for m in range(2)]
    acts = [[bc] + work[0] + [ar, Action(Op.OPT, unit=0)], [bc] + work[1] + [ar]]
    s = Schedule("dp", 2, 1, 2, Placement.by_microbatch([0, 1], [0]), acts)
    links = Links(Topology(2), {"intra_node": LinkSpec(latency=1.0, bandwidth=math.inf)})
    res = simulate(s, UniformCost(tf=1, tb=2, t_opt=0.5), links)
    ev = {(r, str(a)): (s0, e) for r, q, a, s0, e in res.events}
    assert ev[(0, str(bc))] == ev[(1, str(bc))] == (0.0, 1.0)   # broadcast: (n-1) * latency
    assert ev[(0, "F u0 m0")] == (0.0, 1.0)                      # the root already holds the weights
    assert ev[(1, "F u0 m1")] == (1.0, 2.0)
    assert ev[(0, str(ar))] == ev[(1, str(ar))] == (4.0, 6.0)    # waits for the slower member
    assert ev[(0, "OPT u0")] == (6.0, 6.5)
    assert res.makespan == 6.5
    # one member missing the allreduce is rejected
    with pytest.raises(ScheduleError) as e:
        simulate(s.with_actions([acts[0], acts[1][:-1]]), UniformCost())
    assert e.value.reason == "collective"


def test_simulate_rejects_invalid_schedules() -> None:
    s = one_f_one_b(2, 2)
    acts = [list(a) for a in s.actions]
    del acts[1][0]
    with pytest.raises(ScheduleError):
        simulate(s.with_actions(acts), UniformCost())


# --- uniform cost model ------------------------------------------------------------------
def test_uniform_cost_defaults_and_scaling() -> None:
    c = UniformCost(tf=1, tb=3)
    assert (c.td, c.tw) == (1.5, 1.5)
    c = UniformCost(tf=1, td=1, tw=0.5)
    assert c.tb == 1.5
    assert UniformCost(tf=2).tb == 4
    assert c.compute_time(Action(Op.F, unit=0, mb=(0,)), 0) == 1
    assert action_time(c.compute_time, Action(Op.F, unit=0, mb=(0, 1, 2)), 0) == 3   # a fold: the sum
    assert action_time(c.compute_time, Action(Op.D, unit=0, mb=(0,), sub=(0, 4)), 0) == 0.25   # a quarter piece
    assert c.compute_time(Action(Op.RECOMPUTE, unit=0, mb=(0,)), 0) == 1
    assert c.compute_time(Action(Op.OPT, unit=0), 0) == 0
    assert c.message_bytes(Payload.ACT, 0, 3) == 3 and c.message_bytes(Payload.WEIGHT, 0, 3) == 1
    assert c.memory("stash_w", 0) == 0.5


@pytest.mark.parametrize("kw,flag", [({"tf": -1}, "--tf must be > 0, got -1"), ({"tf": 0}, "--tf"),
                                     ({"tf": 1, "tb": -2}, "--tb"), ({"tf": 1, "td": 1}, "--td and --tw"),
                                     ({"tf": 1, "t_opt": -1}, "--t-opt"), ({"tf": 1, "act_bytes": -1}, "--act-bytes")])
def test_uniform_cost_rejects_bad_flags(kw: dict, flag: str) -> None:
    with pytest.raises(ValueError, match=flag):
        UniformCost(**kw)


def test_topology_rejects_uneven_splits() -> None:
    with pytest.raises(ValueError, match="cannot be split evenly into 2 datacenters"):
        Topology(5, num_dcs=2)
    with pytest.raises(ValueError, match="ranks_per_node"):
        Topology(8, ranks_per_node=3)
    with pytest.raises(ValueError, match="bandwidth"):
        LinkSpec(0.0, 0.0)
