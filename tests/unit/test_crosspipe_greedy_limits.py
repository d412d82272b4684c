"""The CrossUD greedy under per-rank memory limits: a larger limit never makes it stuck."""
from __future__ import annotations

import pytest
from hypothesis import example, given, settings, strategies as st

from pipert.cost import Links, Topology, UniformCost
from pipert.schedules.crosspipe import GreedyConfig, default_memory_limit, greedy_schedule, problem_from_cost
from pipert.schedules.crosspipe.greedy import PORTFOLIO

QUARTERS = st.integers(0, 12).map(lambda k: k / 4)


def _runs(p: int, m: int, cost: UniformCost, links, limit, rule: str) -> bool:
    pr = problem_from_cost(p, m, "ud", cost, links, memory_limit=tuple(limit))
    try:
        greedy_schedule(pr, GreedyConfig(prefer=rule))
    except ValueError as e:
        assert "too small" in str(e)
        return False
    return True


@settings(max_examples=60, deadline=None)
@given(p=st.sampled_from([2, 4]), m=st.integers(1, 8), rule=st.sampled_from(PORTFOLIO),
       w_fraction=st.sampled_from([0.25, 0.5, 1.0]), act=st.sampled_from([0.5, 1.0, 2.0]),
       latency=st.sampled_from([0.0, 0.5, 2.0]), data=st.data())
# the reported case: 1F1B's per-rank peaks plus a whole stash at P=4, M=8, zero delay
@example(p=4, m=8, rule="alternate", w_fraction=0.5, act=1.0, latency=0.0, data=None)
def test_a_larger_limit_keeps_the_greedy_feasible(p, m, rule, w_fraction, act, latency, data):
    cost = UniformCost(w_fraction=w_fraction, act_bytes=act)
    links = Links.uniform_dc(Topology(p, num_dcs=2), latency, 0.0)
    base = default_memory_limit("ud", p, m, cost)
    if data is None:     # the reported case: the paper budget runs, a stash more on every rank must too
        low, high = base, [b + 0.5 for b in base]       # paper = 1F1B + half a stash
    else:
        low = [b + data.draw(QUARTERS) - 1.5 for b in base]
        high = [x + data.draw(QUARTERS) for x in low]
    if _runs(p, m, cost, links, low, rule):
        assert _runs(p, m, cost, links, high, rule), (low, high)


def test_the_reported_limit_runs_and_is_no_slower_than_the_paper_budget():
    cost = UniformCost()
    paper = default_memory_limit("ud", 4, 8, cost)
    span = {}
    for name, limit in (("paper", paper), ("plus a stash", [b + 0.5 for b in paper])):
        pr = problem_from_cost(4, 8, "ud", cost, None, memory_limit=tuple(limit))
        span[name] = min(greedy_schedule(pr, GreedyConfig(prefer=r)).makespan for r in PORTFOLIO)
    assert span["plus a stash"] <= span["paper"]
