"""What makes plan --auto cheaper without changing its answers: the engine's plans shared across
ranks by ``Semantics.plan_key`` (a key equal only where the plans are equal), the finish per rank
read off the graph (the latest compute end of the events), and the schedule bound chained across
ranks (below every simulated finish, also with blocking collectives; 0 where the walk would
deadlock)."""
from __future__ import annotations

import dataclasses
from collections import defaultdict

import pytest

from pipert.cost import UniformCost
from pipert.cost.topology import Links, Topology
from pipert.ir import Schedule
from pipert.ir.action import Action, Op, Payload
from pipert.ir.semantics import Semantics
from pipert.ir.semantics.table import Queue
from pipert.planner.pipe import finish_times
from pipert.planner.prune import finish_bounds
from pipert.schedules import build_schedule
from pipert.schedules.data_parallel import replicate
from pipert.sim import simulate
from pipert.sim.values import Builder

COST = UniformCost(tf=1.0, tb=2.0)


def _zero_classes() -> Schedule:
    """ZB-H1 over 2 replicas with ZeRO 0-3 per unit and per parameter (holders and non-holders of
    classes of every stage)."""
    base = build_schedule("zb-h1", stages=3, microbatches=6)
    per_unit = [3, (1, 3), (0, 2, 3)]
    return replicate(base, 2, per_unit, [None, (5, 6), (5, 6, 7)], 2)


def _schedules() -> list[Schedule]:
    return [_zero_classes(), build_schedule("weipipe-interleave", stages=4, microbatches=8),
            build_schedule("tawpipe", stages=4, microbatches=8, ranks_per_node=2),
            build_schedule("helixpipe-2fold", stages=2, microbatches=8)]


def _links(s: Schedule) -> Links:
    return Links.preset(Topology(s.num_ranks, ranks_per_node=2))


@pytest.mark.parametrize("s", _schedules(), ids=lambda s: s.name)
def test_equal_plan_keys_have_equal_plans_and_the_key_tells_holders_apart(s):
    """Every action on every rank: actions whose keys are equal get the same plan and the same
    counted memory per value; pairs that differ only in the rank get different keys wherever
    their plans or counted memory differ (on the ZeRO schedule such pairs exist)."""
    sem = Semantics.of(s)
    by_key: dict[tuple, tuple] = {}
    by_fields: dict[tuple, dict] = defaultdict(dict)
    for a in {a for acts in s.actions for a in acts}:
        if a.unit is not None and sem.field_error(a):
            continue
        for r in range(s.num_ranks):
            for keeps in ((False, True) if a.op is Op.F else (False,)):
                plan = sem.plan(a, r, keeps)
                counted = tuple(sem.counted(e.kind, e.unit, r, e.shard, sl, e.host)
                                for effects in plan for e in effects for sl in (e.slots or (0,)))
                got = (plan, counted)
                key = sem.plan_key(a, r, keeps)
                assert by_key.setdefault(key, got) == got, (a, r, keeps)
                by_fields[(a, r == a.root, keeps)].setdefault(got, set()).add(key)
    differ = [keys for plans in by_fields.values() if len(plans) > 1 for keys in plans.values()]
    for plans in by_fields.values():   # a key never serves two of them
        seen = [k for keys in plans.values() for k in keys]
        assert len(seen) == len(set(seen))
    if s.placement.replicas is not None:
        assert differ, "no action whose plan depends on the rank: the test shows nothing"


def _pass_one(s: Schedule, links: Links | None) -> tuple:
    b = Builder(s, COST, links, None)
    b.run()
    return (list(b.kind), list(b.dur), list(b.lat), [list(x) for x in b.succ], list(b.indeg), b.node_of,
            b.comm_in, b.busy, b.peaks, b.memory_trace, b.wg_parts, [(e.rank, e.index, str(e)) for e in b.errors])


@pytest.mark.parametrize("s", _schedules()[:3], ids=lambda s: s.name)
def test_plans_shared_across_ranks_build_the_graph_of_plans_per_rank(s, monkeypatch):
    """The engine with its plans shared by plan_key builds the same graph, memory and times as with
    a key that also names the rank (nothing shared between ranks)."""
    links = _links(s)
    shared, res = _pass_one(s, links), simulate(s, COST, links=links)
    own = Semantics.plan_key
    monkeypatch.setattr(Semantics, "plan_key", lambda self, a, r, keeps=False: (own(self, a, r, keeps), r))
    assert _pass_one(s, links) == shared
    alone = simulate(s, COST, links=links)
    assert (alone.makespan, alone.peak_memory, alone.events) == (res.makespan, res.peak_memory, res.events)


@pytest.mark.parametrize("s", _schedules(), ids=lambda s: s.name)
def test_finish_times_are_when_each_ranks_optimizer_step_may_begin_in_the_events(s):
    """The later of the last non-OPT compute's end and the start of the first OPT after it (which
    waits for sums still arriving, or for the replicas' reduction placed before it)."""
    res = simulate(s, COST, links=_links(s))
    last = [0.0] * s.num_ranks
    for rank, queue, a, _, end in res.events:
        if queue == "compute" and a.op is not Op.OPT:
            last[rank] = max(last[rank], end)
    opts: list[list[float]] = [[] for _ in last]
    for rank, queue, a, start, _ in res.events:
        if queue == "compute" and a.op is Op.OPT and start >= last[rank]:
            opts[rank].append(start)
    want = [max(x, min(o)) if o else x for x, o in zip(last, opts)]
    assert finish_times(res.graph, res.times) == want and max(want) > 0


def test_the_chained_bound_holds_with_blocking_collectives():
    """Collectives on the compute queue (the rank waits for their end): the bound stays below the
    simulated finish of every rank, and above the compute each rank runs."""
    s = build_schedule("tawpipe", stages=4, microbatches=8, ranks_per_node=2)
    s = dataclasses.replace(s, placement=dataclasses.replace(s.placement, collective_queue=Queue.COMPUTE))
    assert Semantics.of(s).queue(Op.BROADCAST) is Queue.COMPUTE
    links = _links(s)
    res = simulate(s, COST, links=links)
    finish, bound = finish_times(res.graph, res.times), finish_bounds(s, COST, links)
    assert all(b <= f * (1 + 1e-12) for b, f in zip(bound, finish)), (bound, finish)
    computed = [sum(end - start for r, q, a, start, end in res.events if r == d and q == "compute" and a.op in
                    (Op.F, Op.B)) for d in range(s.num_ranks)]
    assert all(b >= c for b, c in zip(bound, computed)) and bound != computed


def test_a_walk_that_would_deadlock_bounds_nothing():
    """Rank 1 waits for an activation rank 0 never sends: no bound (0 on every rank)."""
    ok = build_schedule("1f1b", stages=2, microbatches=2)
    acts = [[Action(Op.F, 0, (0,))], [Action(Op.RECV, 0, (0,), Payload.ACT, 0), Action(Op.F, 1, (0,))]]
    s = ok.with_actions(acts)
    assert finish_bounds(s, COST, None) == [0.0, 0.0]
    assert finish_bounds(ok, COST, None)[1] > 0


@pytest.mark.parametrize("name", ["zb-h1", "1f1b"])
def test_split_folds_makes_the_actions_replace_makes(name):
    """The unchecked copies of a fold's pieces equal ``dataclasses.replace(a, mb=(m,))``, field for
    field, for computes, messages and the others (a replicated fold's collectives)."""
    from pipert.ir.passes import fold_microbatches, split_folds
    s = build_schedule(name, stages=2, microbatches=8)
    s = fold_microbatches(s, 2) if name == "1f1b" else replicate(fold_microbatches(s, 2), 2, 1)
    want = [[p for a in acts for p in ([dataclasses.replace(a, mb=(m,)) for m in a.mb] if len(a.mb) > 1 and (
        a.op in (Op.F, Op.B, Op.D, Op.W, Op.RECOMPUTE) or a.payload in (Payload.ACT, Payload.GRAD)) else [a])]
        for acts in s.actions]
    got = split_folds(s).actions
    assert any(len(a.mb) > 1 for acts in s.actions for a in acts)
    assert [[(type(a), repr(a)) for a in acts] for acts in got] == [[(type(a), repr(a)) for a in acts] for acts in want]


@pytest.mark.parametrize("name", ["weipipe-interleave", "tawpipe", "helixpipe-2fold"])
def test_a_graph_retimed_under_another_recomputation_has_the_times_of_its_simulation(name):
    """The graph simulated without recomputation, re-timed with recomputation's compute prices, has
    the node times of the simulation with recomputation (its messages move the same bytes); a cost
    model whose messages differ is refused (None)."""
    from pipert.cost.transformer import ModelSpec
    from pipert.planner import auto
    from pipert.planner.cluster import Cluster
    from pipert.planner.layouts import layouts
    from pipert.sim.timing import retimed
    spec, cl = ModelSpec.preset("tiny"), Cluster(2, 2, 2)
    lay = next(lay for lay in layouts(cl, spec, 16, (name,)) if lay.stages == 4)
    cost_of = {rc: auto.analytic_cost(cl)(spec, lay, rc, lay.units) for rc in auto.RECOMPUTE}
    links = lay.links(cl)
    s = auto._build(lay, cost_of["none"], links, cl.device.memory, "none")
    base = simulate(s, cost_of["none"], links=links)
    want = simulate(s, cost_of["no_attention"], links=links).times
    got = retimed(base.graph, cost_of["no_attention"], cost_of["none"])
    assert (got.start, got.end0, got.end1) == (want.start, want.end0, want.end1)
    assert want.end0 != base.times.end0
    wider = auto.analytic_cost(cl)(dataclasses.replace(spec, hidden=2 * spec.hidden), lay, "none", lay.units)
    assert retimed(base.graph, wider, cost_of["none"]) is None


@pytest.mark.parametrize("name", ["weipipe-interleave", "tawpipe"])
def test_a_bound_is_borrowed_only_by_a_cost_model_with_no_earlier_times(name):
    """Recomputation prices every compute no shorter and every message alike: no_earlier holds, and
    every simulated node ends no earlier (so the bound without recomputation bounds it); the other
    way round, or with messages of other bytes, it does not hold."""
    from pipert.cost.transformer import ModelSpec
    from pipert.planner import auto
    from pipert.planner.cluster import Cluster
    from pipert.planner.layouts import layouts
    from pipert.sim.timing import no_earlier
    spec, cl = ModelSpec.preset("tiny"), Cluster(2, 2, 2)
    lay = next(lay for lay in layouts(cl, spec, 16, (name,)) if lay.stages == 4)
    none, rec = (auto.analytic_cost(cl)(spec, lay, rc, lay.units) for rc in auto.RECOMPUTE)
    links = lay.links(cl)
    s = auto._build(lay, none, links, cl.device.memory, "none")
    assert no_earlier(s, rec, none) and not no_earlier(s, none, rec)
    fast, slow = simulate(s, none, links=links).times, simulate(s, rec, links=links).times
    assert all(b >= a for a, b in zip(fast.end1, slow.end1)) and slow.end1 != fast.end1
    bound = finish_bounds(s, none, links)
    assert all(b <= f * (1 + 1e-12) for b, f in zip(bound, finish_times(simulate(s, rec, links=links).graph, slow)))
    wider = auto.analytic_cost(cl)(dataclasses.replace(spec, hidden=2 * spec.hidden), lay, "none", lay.units)
    assert not no_earlier(s, wider, none)


def test_plan_auto_reuses_the_zb_v_simulation_of_its_build(monkeypatch):
    """zb-v's build simulates the order it picks (``remember_simulation``); the planner takes that
    result instead of simulating the same schedule again: no ZB-V simulation of its own, and the
    same rows as when it simulates every one itself."""
    import sys

    import pipert.sim
    from pipert.cost.transformer import ModelSpec
    from pipert.planner.auto import search
    from pipert.planner.cluster import Cluster
    engine = sys.modules["pipert.sim.simulate"]
    calls: list = []
    real = engine.simulate
    monkeypatch.setattr(engine, "simulate", lambda s, *a, **k: calls.append(s.name) or real(s, *a, **k))

    def rows() -> list:
        res = search(ModelSpec.preset("tiny"), Cluster(4, 1), 16, families=("zb-v", "1f1b"), top=6)
        assert any(c.layout.family == "zb-v" for c in res.ranked)
        return [c.as_dict() for c in res.ranked]
    reused = rows()
    assert calls and not any("zb-v" in name for name in calls)   # the planner simulated only 1F1B itself
    monkeypatch.setattr(pipert.sim, "remember_simulation", lambda *a: None)
    calls.clear()
    assert rows() == reused and any("zb-v" in name for name in calls)
