"""The engine's fast paths build the same graph, memory trace and errors as the general path
(``Builder.effects`` for every compute, ``Builder.message_effects`` for every SEND/RECV), on registered
schedules after passes, replicated with ZeRO (one or two gathered copies, classes per parameter),
with and without link costs, and on broken programs: computes of one micro-batch from their compiled
plans (``Builder.plain_compute``), activation and gradient messages from their recorded one-value
plans (inline in ``Builder.run``). Every plan the engine applies is the semantics object's
(``pipert.ir.semantics.Semantics.plan``), value for value."""
from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipert.cost import UniformCost
from pipert.cost.topology import Links, Topology
from pipert.ir import Schedule
from pipert.ir.action import Action, Op, Payload
from pipert.ir.passes import PASSES, fold_microbatches
from pipert.ir.semantics import COLLECTIVE_OPS, MEMORY_OPS, Semantics
from pipert.schedules import build_schedule
from pipert.schedules.data_parallel import replicate
from pipert.sim.keys import HOST, SHARD, SHIFT
from pipert.sim.values import Builder

COST = UniformCost(tf=1.0, tb=2.0)
_SWAP = {Payload.ACT: Payload.GRAD, Payload.GRAD: Payload.ACT}   # the payloads of one-value message plans
FAMILIES = ["1f1b", "gpipe", "interleaved-1f1b", "zb-h1", "zb-v", "weipipe-interleave", "helixpipe-2fold",
            "crosspipe-greedy"]
REPLICABLE = ["1f1b", "gpipe", "interleaved-1f1b", "zb-h1", "zb-v"]   # activation passing: replicate() takes them


def _walk(s: Schedule, fast: bool, links: Links | None = None) -> tuple:
    """Everything pass 1 records, from a Builder with the fast path on or off."""
    b = Builder(s, COST, links, None)
    b.fast = fast
    b.run()
    return (b.kind, b.dur, b.lat, b.succ, b.indeg, b.node_of, b.compute_nodes, b.comm_in, b.tx_prod, b.busy,
            b.peaks, b.memory_trace, b.wg_parts, [c[:3] + c[4:] for c in b.opt_checks], b.fwd, b.bwd, b.wdone,
            [(e.rank, e.index, e.reason, str(e)) for e in b.errors])


def _mutate(s: Schedule, data: st.DataObject) -> Schedule:
    """Up to three edits of one rank's list: drop an action, swap two neighbours, repeat one, move a
    memory op or collective a few places, or send or receive a message from another peer (any rank,
    itself, or none) or as the other payload."""
    acts = [list(a) for a in s.actions]
    for _ in range(data.draw(st.integers(0, 3))):
        r = data.draw(st.integers(0, s.num_ranks - 1))
        if len(acts[r]) < 2:
            continue
        i = data.draw(st.integers(0, len(acts[r]) - 2))
        edit = data.draw(st.sampled_from(["drop", "swap", "repeat", "move", "peer", "payload"]))
        a = acts[r][i]
        if edit == "move":
            movable = [j for j, b in enumerate(acts[r]) if b.op in MEMORY_OPS or b.op in COLLECTIVE_OPS]
            if movable:
                j = data.draw(st.sampled_from(movable))
                b = acts[r].pop(j)
                acts[r].insert(max(0, j + data.draw(st.integers(-4, 4))), b)
        elif edit == "drop":
            del acts[r][i]
        elif edit == "swap":
            acts[r][i], acts[r][i + 1] = acts[r][i + 1], acts[r][i]
        elif edit == "repeat":
            acts[r].insert(i, a)
        elif a.payload in _SWAP:
            change = {"peer": data.draw(st.integers(-1, s.num_ranks))} if edit == "peer" else \
                {"payload": _SWAP[a.payload]}
            acts[r][i] = dataclasses.replace(a, **change)
    return s.with_actions(acts)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_fast_path_builds_the_general_paths_graph(data: st.DataObject) -> None:
    name = data.draw(st.sampled_from(FAMILIES))
    P = data.draw(st.integers(2, 4))
    M = data.draw(st.integers(1, 2)) * 2 * P   # what every family of FAMILIES accepts
    s = build_schedule(name, stages=P, microbatches=M)
    passes = data.draw(st.lists(st.sampled_from(["recompute", "offload_stashes", "send_early", "expand_folds"]),
                                max_size=2))
    if data.draw(st.booleans()) and s.placement.kind != "microbatch":
        s = fold_microbatches(s, 2)
    for p in passes:
        s = PASSES[p](s)
    s = _mutate(s, data)
    links = Links.preset(Topology(P, ranks_per_node=1)) if data.draw(st.booleans()) else None
    assert _walk(s, True, links) == _walk(s, False, links)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_fast_path_builds_the_general_paths_graph_under_zero(data: st.DataObject) -> None:
    """Replicated programs: ZeRO 0..3 per unit or per parameter class, one or two gathered copies
    of ZeRO-3 weights, with gathers, frees, offloads and reductions moved."""
    name = data.draw(st.sampled_from(REPLICABLE))
    P = data.draw(st.integers(2, 3))
    base = build_schedule(name, stages=P, microbatches=2 * P)
    if data.draw(st.booleans()):
        base = PASSES[data.draw(st.sampled_from(["recompute", "offload_stashes"]))](base)
    U = base.num_units
    per_unit = data.draw(st.lists(st.sampled_from([0, 1, 2, 3, (0, 3), (1, 3), (2, 3, 3)]), min_size=U, max_size=U))
    numel = [None if isinstance(z, int) else tuple(range(5, 5 + len(z))) for z in per_unit]
    s = replicate(base, 2, per_unit, numel, data.draw(st.sampled_from([1, 2])))
    if data.draw(st.booleans()):
        s = PASSES["offload_weights"](s)
    s = _mutate(s, data)
    assert _walk(s, True) == _walk(s, False)
    _engine_plans_are_the_semantics(s)


def _engine_plans_are_the_semantics(s: Schedule) -> None:
    """Every value the engine's plan of an action names (packed keys, per micro-batch or class slot)
    is one the semantics object's plan names, with the same release, shard and host flags."""
    b = Builder(s, COST, None, None)
    sem = Semantics.of(s)
    for r, acts in enumerate(s.actions):
        b.r = r
        for a in acts:
            if a.unit is not None and (a.unit >= s.num_units or sem.field_error(a)):
                continue   # the engine reports it and applies no plan
            for keeps in ((False, True) if a.op is Op.F else (False,)):
                b._plan_cache = {}
                packed = b._plan(a, r, keeps)
                plan = sem.plan(a, r, keeps)
                for mine, theirs in zip(packed, plan):
                    got = {(ku | m << SHIFT, release) for _, _, release, _, ku, slots, _ in mine
                           for m in (a.mb if slots is None else slots)}
                    want = {((e.unit << 32 | m) << SHIFT | int(e.kind) | (SHARD if e.shard else 0) |
                             (HOST if e.host else 0), e.release)
                            for e in theirs for m in (a.mb if e.slots is None else e.slots)}
                    assert got == want, (r, a, keeps)


def test_fast_path_reports_a_repeated_fold_as_the_general_path_does() -> None:
    s = build_schedule("1f1b", stages=2, microbatches=4)
    s = fold_microbatches(s, 2)
    acts = [list(a) for a in s.actions]
    first_f = next(i for i, a in enumerate(acts[0]) if a.op is Op.F)
    acts[0].insert(first_f, Action(Op.F, 0, acts[0][first_f].mb[1:] + (7,)))   # overlaps the fold's second mb
    s = s.with_actions(acts)
    fast, general = _walk(s, True), _walk(s, False)
    assert fast == general
    assert any(e[2] == "duplicate" for e in fast[-1])


def test_an_out_of_range_unit_or_microbatch_is_named_at_its_action() -> None:
    s = build_schedule("1f1b", stages=2, microbatches=2)
    for bad in (Action(Op.F, 0, (2,)), Action(Op.F, 0, (0, 5)), Action(Op.F, 2, (0,))):
        acts = [list(a) for a in s.actions]
        acts[1].insert(1, bad)
        errors = _walk(s.with_actions(acts), True)[-1]
        assert (1, 1, "bad_index") in [e[:3] for e in errors]
