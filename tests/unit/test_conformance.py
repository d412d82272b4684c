"""Conformance: the executor runs exactly what the simulator's graph says (docs/semantics.md).

For a schedule, one training step on the local transport with real units is checked against
the engine's graph of the same program:

- order: each rank ran its computes in list order, one per micro-batch of each fold;
- values: every forward read the bytes the forward before it in the chain wrote (on whichever
  rank), every backward the gradient its successor's backward wrote;
- memory: the bytes the program held after every action equal the engine's running memory with
  the units' measured sizes (``ProfiledCost``), action by action;
- training: loss, gradients and updated parameters equal the single-process reference.

Every registered schedule is checked, and Hypothesis-generated programs with folds,
sub-blocks, weight payloads, recomputation, offload of stashes and weights and data-parallel
ZeRO collectives.
"""
from __future__ import annotations

import copy
import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipert.cost.profiled import ProfiledCost
from pipert.ir import Action, Op, Payload, Placement, Schedule, add_optimizer_steps, lower
from pipert.ir import passes as P
from pipert.pipeline import Pipeline, split_microbatches
from pipert.tools.profile import profile_units
from pipert.tools.reference import reference_step
from pipert.schedules import available, build_schedule
from pipert.schedules.data_parallel import replicate
from pipert.sim import validate
from pipert.sim.graph import build_graph
from pipert.testing import make_batch, sgd, tiny_units
from pipert.exec.instrument import Instrumentation
from pipert.tools.reference import rel_err

CONFIGS = {
    "gpipe": dict(stages=3, microbatches=4),
    "1f1b": dict(stages=3, microbatches=5),
    "interleaved-1f1b": dict(stages=2, microbatches=4),
    "zb-h1": dict(stages=3, microbatches=4),
    "zb-v": dict(stages=2, microbatches=3),
    "weipipe-naive": dict(stages=2, microbatches=4),
    "weipipe-interleave": dict(stages=3, microbatches=6),
    "weipipe-interleave-direct": dict(stages=3, microbatches=6),
    "weipipe-zb1": dict(stages=2, microbatches=4),
    "weipipe-zb2": dict(stages=2, microbatches=4),
    "tawpipe": dict(stages=4, microbatches=4, ranks_per_node=2),
    "crosspipe-greedy": dict(stages=2, microbatches=4, num_dcs=2, dc_latency=2.0, dc_transfer=1.0),
    "crosspipe-wave": dict(stages=2, microbatches=4, num_dcs=2, dc_latency=2.0, dc_transfer=1.0),
    "crosspipe-optimal": dict(stages=2, microbatches=3),
    "helixpipe": dict(stages=2, microbatches=4),
    "helixpipe-2fold": dict(stages=2, microbatches=4),
    "pipemesh": dict(stages=2, microbatches=4, enqueue=(4,), dequeue=(2, 2), units_per_chunk=2),
}


def check_conforms(schedule: Schedule) -> None:
    """Run one step of ``schedule`` and assert order, values, memory and training (module doc)."""
    U, M = schedule.num_units, schedule.num_microbatches
    units = tiny_units(U, "float64", cut=schedule.meta.get("cut"))
    x, y = make_batch(M)
    xs, ys = split_microbatches(x, M), split_microbatches(y, M)
    cost = ProfiledCost(profile_units(units, xs[0], ys[0], meta=schedule.meta))
    ref_units = copy.deepcopy(units)
    pipe = Pipeline(units, schedule, optimizer=sgd, instrument=Instrumentation(measure_memory=True, record=True))
    loss = pipe.step(x, y)
    program = pipe.program
    g = build_graph(program, cost)
    assert not g.errors, g.errors[:3]
    written: dict[tuple, str] = {}
    for r, res in pipe.last_results.items():
        # order: computes in list order, one entry per micro-batch of each fold
        want = [(i, a.op.value, a.unit, m) for i, a in enumerate(program.actions[r])
                if a.op in (Op.F, Op.B, Op.D, Op.W, Op.RECOMPUTE) for m in a.mb]
        assert [e[:4] for e in res.order] == want, f"rank {r} ran its computes out of list order"
        # memory: measured bytes after every action = the engine's running memory, except while a
        # W runs in pieces: each piece frees its share, the model frees it all at the last piece
        inside = _inside_split_w(program.actions[r])
        for i, (got, model) in enumerate(zip(res.memory, g.memory_trace[r])):
            assert got <= model if i in inside else got == model, \
                f"rank {r} after action {i} ({program.actions[r][i]}): measured {got} bytes, model {model}"
        for _, op, u, m, _, out in res.order:
            if out is not None and op in ("F", "B", "D"):
                written[(op == "F", u, m)] = out
    # values: what each compute read is what its producer wrote
    for res in pipe.last_results.values():
        for _, op, u, m, read, _ in res.order:
            if op == "F" and u > 0:
                assert read == written[(True, u - 1, m)], f"F u{u} m{m} read another activation"
            if op in ("B", "D") and u < U - 1:
                assert read == written[(False, u + 1, m)], f"{op} u{u} m{m} read another gradient"
    # training: equal to the reference
    every = schedule.meta.get("update_every") or M
    opt = sgd([p for u in ref_units for p in u.parameters()])
    losses = []
    for k in range(M // every):
        ref = reference_step(ref_units, x.chunk(M // every)[k], y.chunk(M // every)[k], every, optimizer=opt,
                             copy_units=False)
        losses.append(float(ref.loss))
    assert abs(loss - sum(losses) / len(losses)) <= 1e-12 * max(1.0, abs(loss))
    assert rel_err(pipe.named_grads(), ref.grads) <= 1e-10
    assert rel_err(pipe.named_parameters(), ref.params_after) <= 1e-10


def _inside_split_w(acts: list[Action]) -> set[int]:
    """Indices from the first piece of a split W up to (not including) its last piece."""
    out, open_ = set(), set()
    for i, a in enumerate(acts):
        if a.op is Op.W and a.sub is not None:
            key = (a.unit, a.mb)
            if a.sub[0] == a.sub[1] - 1:
                open_.discard(key)
            else:
                open_.add(key)
        if open_:
            out.add(i)
    return out


def test_every_registered_schedule_has_a_config():
    assert set(CONFIGS) == set(available())


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_registered_schedule_conforms(name):
    kw = dict(CONFIGS[name])
    s = build_schedule(name, stages=kw.pop("stages"), microbatches=kw.pop("microbatches"), **kw)
    check_conforms(s)


# --- generated programs -----------------------------------------------------------------------

@st.composite
def programs(draw, data_parallel: bool = False) -> Schedule:
    """A valid program: a random placement, per-rank orders cut from one random topological order
    of F, B (or D then W) per (unit, micro-batch), lowered; then random passes (``data_parallel``:
    always replicated over 2 replicas, with per-unit or per-parameter ZeRO stages)."""
    P_ = draw(st.integers(2, 3))
    U = draw(st.integers(P_, P_ + 2))
    M = draw(st.integers(1, 3))
    kind = "unit" if data_parallel else draw(st.sampled_from(["unit", "microbatch", "table"]))
    if kind == "unit":
        ranks = [draw(st.integers(0, P_ - 1)) for _ in range(U)]
        ranks[:P_] = list(range(P_))  # every rank holds a unit
        placement = Placement.by_unit(ranks)
    elif kind == "microbatch":
        owners = list(range(P_)) + [draw(st.integers(0, P_ - 1)) for _ in range(U - P_)]
        placement = Placement.by_microbatch([draw(st.integers(0, P_ - 1)) for _ in range(M)], owners)
    else:
        owners = list(range(P_)) + [draw(st.integers(0, P_ - 1)) for _ in range(U - P_)]
        table = tuple(tuple(draw(st.integers(0, P_ - 1)) for _ in range(M)) for _ in range(U))
        placement = Placement("table", table, tuple(owners))
    split = draw(st.booleans())
    done: set = set()
    orders: list[list[Action]] = [[] for _ in range(P_)]
    todo = [(Op.F, u, m) for u in range(U) for m in range(M)] + \
           [(op, u, m) for u in range(U) for m in range(M) for op in ((Op.D, Op.W) if split else (Op.B,))]
    while todo:
        ready = [t for t in todo if _ready(t, done, U)]
        op, u, m = ready[draw(st.integers(0, len(ready) - 1))]
        todo.remove((op, u, m))
        done.add((op, u, m))
        orders[placement.rank(u, m)].append(Action(op, unit=u, mb=(m,)))
    s = lower("generated", P_, U, M, placement, add_optimizer_steps(orders, placement),
              weights=kind != "unit", post_ahead=draw(st.integers(0, 2)))
    if split and draw(st.booleans()):
        pieces = draw(st.integers(2, 3))
        s = s.with_actions([[p for a in acts for p in ([dataclasses.replace(a, sub=(j, pieces)) for j in range(pieces)]
                                                       if a.op is Op.W else [a])] for acts in s.actions])
    chosen = draw(st.sets(st.integers(0, U - 1)))
    if draw(st.booleans()):
        s = P.recompute(s, chosen)
    if draw(st.booleans()):
        s = P.offload_stashes(s, set(range(U)) - chosen)
    if draw(st.booleans()):
        s = P.offload_weights(s, draw(st.sets(st.integers(0, U - 1))))
    if kind == "unit" and draw(st.booleans()):
        s = P.fold_microbatches(s, 2)
        if draw(st.booleans()):
            s = P.expand_folds(s)
    if kind == "unit" and (data_parallel or draw(st.booleans())):
        s = _replicated(draw, s)
    return s


def _replicated(draw, s: Schedule) -> Schedule:
    """``s`` over 2 replicas with ZeRO stages drawn per unit: one stage, or (per-parameter ZeRO)
    one per parameter of the unit; one or two gathered copies of ZeRO-3 weights."""
    numel = [tuple(p.numel() for p in u.parameters()) for u in tiny_units(s.num_units, "float64")]
    offloaded = {a.unit for _, _, a in s if a.op is Op.OFFLOAD and a.payload is Payload.WEIGHT}
    zeros = [draw(st.integers(0, 3)) if not n or u in offloaded or draw(st.booleans()) else
             tuple(draw(st.integers(0, 3)) for _ in n) for u, n in enumerate(numel)]
    split = not offloaded and draw(st.booleans())  # offloaded weights are one value: no separate copies
    return replicate(s, 2, zeros, numel, zero3_buffers=2 if split else 1)


def _ready(t: tuple, done: set, U: int) -> bool:
    op, u, m = t
    if op is Op.F:
        return u == 0 or (Op.F, u - 1, m) in done
    if op is Op.W:
        return (Op.D, u, m) in done
    after = (Op.F, u, m) in done
    return after and (u == U - 1 or (Op.B, u + 1, m) in done or (Op.D, u + 1, m) in done)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_generated_programs_conform(s):
    validate(s)  # every generated program is valid by construction
    check_conforms(s)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(data_parallel=True))
def test_generated_data_parallel_programs_conform(s):
    """ZeRO stages per unit or per parameter (classes), one or two gathered ZeRO-3 copies."""
    validate(s)
    check_conforms(s)


def test_lost_receive_regression():
    """A RECV standing between two pieces of a split W (the program that lost a receive when
    the executor ran split computes whole at their last piece and hoisted receives onto them)."""
    W = [Action(Op.W, unit=1, mb=(2,), sub=(j, 4)) for j in range(4)]
    orders = [
        [Action(Op.F, unit=0, mb=(m,)) for m in range(4)] + [Action(Op.D, unit=0, mb=(m,)) for m in range(4)] +
        [Action(Op.W, unit=0, mb=(m,)) for m in range(4)],
        [Action(Op.F, unit=1, mb=(0,)), Action(Op.D, unit=1, mb=(0,)), Action(Op.F, unit=1, mb=(1,)),
         Action(Op.D, unit=1, mb=(1,)), Action(Op.F, unit=1, mb=(2,)), Action(Op.D, unit=1, mb=(2,)),
         Action(Op.W, unit=1, mb=(0,)), Action(Op.W, unit=1, mb=(1,)), W[0], W[1], Action(Op.F, unit=1, mb=(3,)),
         W[2], W[3], Action(Op.D, unit=1, mb=(3,)), Action(Op.W, unit=1, mb=(3,))],
    ]
    pl = Placement.by_unit([0, 1])
    s = lower("lost-receive", 2, 2, 4, pl, add_optimizer_steps(orders, pl), post_ahead=0)
    texts = [str(a) for a in s.actions[1]]
    at = texts.index("RECV act u0 m3 <-0")
    assert texts[at - 2:at + 2] == ["W u1 m2 s0/4", "W u1 m2 s1/4", "RECV act u0 m3 <-0", "F u1 m3"]
    check_conforms(s)


@pytest.mark.parametrize("name,kw", [("zb-v", dict(stages=2, microbatches=4)),
                                     ("crosspipe-wave", dict(stages=2, microbatches=4)),
                                     ("interleaved-1f1b", dict(stages=2, microbatches=8))])
def test_weight_offload_conforms(name, kw):
    """Units' own weights leave the device between two of their computes and come back."""
    s = P.offload_weights(build_schedule(name, **kw))
    assert s.count(Op.OFFLOAD) == s.count(Op.PREFETCH) > 0
    check_conforms(s)
