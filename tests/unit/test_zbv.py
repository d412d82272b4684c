"""zb-v against the zero-bubble authors' auto-scheduler (pipert.schedules.zbv_greedy)."""
import pytest

from pipert.cost.uniform import UniformCost
from pipert.schedules import PipelineConfig, assemble, build_schedule
from pipert.schedules.zbv_greedy import zbv_greedy
from pipert.schedules.zero_bubble import zb_v_units
from pipert.sim import simulate, validate

RATIOS = [(1, 1, 1), (1, 2, 1), (2, 1, 1), (1, 1, 2), (3, 4, 2)]
SHAPES = [(p, m) for p in (2, 4) for m in (p, 2 * p, 4 * p)]


def _authors(p: int, m: int, cost: UniformCost):
    """The authors' schedule with their default cap (2P stashes), memory in stashes."""
    g = zbv_greedy(p, m, f=cost.tf, b=cost.td, w=cost.tw, mem_f=cost.stash,
                   mem_b=-(1 - cost.w_fraction) * cost.stash, mem_w=-cost.w_fraction * cost.stash)
    return g, assemble("zbv-authors", PipelineConfig(p, m, 2), zb_v_units(p), g.orders, split_backward=True)


@pytest.mark.parametrize("ratio", RATIOS)
@pytest.mark.parametrize("p,m", SHAPES)
def test_zb_v_no_slower_than_the_authors_at_their_peak(p, m, ratio):
    f, d, w = ratio
    cost = UniformCost(tf=f, td=d, tw=w)
    g, theirs = _authors(p, m, cost)
    ref = simulate(theirs, cost)
    assert ref.makespan == pytest.approx(g.makespan)        # the port's own timing is the simulator's
    assert max(g.peak_memory) <= 2 * p * cost.stash + 1e-9  # and it keeps its memory cap
    ours = build_schedule("zb-v", stages=p, microbatches=m, cost=cost, memory_limit=max(ref.peak_memory))
    got = simulate(ours, cost)
    assert got.makespan <= ref.makespan + 1e-9
    assert max(got.peak_memory) <= max(ref.peak_memory) + 1e-9


@pytest.mark.parametrize("p,m", [(4, 4), (8, 8), (6, 7)])
def test_zb_v_below_2p_minus_1_beats_the_handcrafted_order(p, m):
    """F = D = W = 1: the default zb-v is strictly faster than the handcrafted order at the
    same peak, and reaches the authors' makespan."""
    cost = UniformCost(tf=1, td=1, tw=1)
    hand = simulate(build_schedule("zb-v", stages=p, microbatches=m, order="handcrafted"), cost)
    best = simulate(build_schedule("zb-v", stages=p, microbatches=m), cost)
    assert best.makespan < hand.makespan
    assert max(best.peak_memory) <= max(hand.peak_memory)
    assert best.makespan == zbv_greedy(p, m, mem_f=1, mem_b=-0.5, mem_w=-0.5).makespan


@pytest.mark.parametrize("p,m", [(4, 8), (8, 8)])
def test_zb_v_meets_a_limit_below_the_authors_peak(p, m):
    """One stash under the authors' peak: pipert's memory-aware greedy fits it, and at
    F = D = W = 1 loses no time against the authors' schedule."""
    cost = UniformCost(tf=1, td=1, tw=1)
    _, theirs = _authors(p, m, cost)
    ref = simulate(theirs, cost)
    limit = max(ref.peak_memory) - cost.stash
    s = build_schedule("zb-v", stages=p, microbatches=m, cost=cost, memory_limit=limit)
    got = simulate(s, cost)
    assert s.meta["order"] == "wave-greedy"
    assert max(got.peak_memory) <= limit
    assert got.makespan <= ref.makespan


@pytest.mark.parametrize("kw,words", [
    (dict(order="fastest"), ["order", "best, handcrafted, greedy, wave-greedy", "'fastest'"]),
    (dict(memory_limit=-1), ["memory_limit", "positive", "-1"]),
    (dict(solver_time_limit=0), ["solver_time_limit", "positive", "0"]),
    (dict(memory_limit=1.0), ["memory_limit=1.0", "P=4, M=8", "handcrafted order needs"]),
])
def test_zb_v_rejects_bad_options(kw, words):
    with pytest.raises(ValueError) as e:
        build_schedule("zb-v", stages=4, microbatches=8, **kw)
    assert all(w in str(e.value) for w in words), str(e.value)


def test_zb_v_solver_finds_a_faster_order_where_the_greedies_are_not_optimal():
    """D twice as long as F and W, P = 2, M = 3: CP-SAT (deterministic, one worker) beats
    every candidate within the same memory limit and proves its order optimal."""
    cost = UniformCost(tf=1, td=2, tw=1)
    plain = build_schedule("zb-v", stages=2, microbatches=3, cost=cost)
    solved = build_schedule("zb-v", stages=2, microbatches=3, cost=cost, solver_time_limit=5)
    b = simulate(solved, cost)
    assert b.makespan < simulate(plain, cost).makespan
    assert max(b.peak_memory) <= plain.meta["memory_limit"]
    assert solved.meta["order"] == "cp-sat" and solved.meta["solver_status"] == "OPTIMAL"
    assert b.makespan == pytest.approx(solved.meta["solver_bound"])


@pytest.mark.parametrize("kw,source", [
    (dict(stages=2, microbatches=2, order="greedy"), "greedy"),
    (dict(stages=2, microbatches=3, order="wave-greedy"), "wave-greedy"),
    (dict(stages=2, microbatches=3, cost=UniformCost(tf=1, td=2, tw=1), solver_time_limit=5), "cp-sat"),
])
def test_zb_v_orders_train_exactly(kw, source):
    """The greedies' and the solver's orders run on the executor and equal the reference step."""
    from test_conformance import check_conforms
    s = build_schedule("zb-v", **kw)
    assert s.meta["order"] == source
    check_conforms(s)


@pytest.mark.parametrize("ratio", RATIOS)
@pytest.mark.parametrize("p,m", [(2, 3), (3, 5), (4, 9), (4, 3)])
def test_zb_v_predicted_makespan_is_the_simulators(p, m, ratio):
    """Whichever path built it (the unsimulated handcrafted order at the lower bound, or
    the search), the recorded makespan is what the simulator reports."""
    f, d, w = ratio
    cost = UniformCost(tf=f, td=d, tw=w)
    s = build_schedule("zb-v", stages=p, microbatches=m, cost=cost)
    assert s.meta["predicted_makespan"] == pytest.approx(simulate(s, cost).makespan)


def test_zb_v_with_link_delays_takes_the_delay_aware_greedy():
    """Two datacenters, latency 1 per crossing message: the best order is no slower than any
    single candidate, and here the memory-aware greedy (which prices the delay) wins."""
    from pipert.cost.topology import Links, Topology
    links = Links.uniform_dc(Topology(4, num_dcs=2), 1.0, 0.0)
    cost = UniformCost(tf=1, td=1, tw=1)
    spans = {o: simulate(build_schedule("zb-v", stages=4, microbatches=4, cost=cost, links=links, order=o),
                         cost, links).makespan for o in ("handcrafted", "greedy", "wave-greedy")}
    best = build_schedule("zb-v", stages=4, microbatches=4, cost=cost, links=links)
    assert simulate(best, cost, links).makespan == min(spans.values())
    assert best.meta["order"] == min(spans, key=spans.get) == "wave-greedy"
