"""The validator and the executor read one semantics (``pipert.ir.semantics``): a program the
validator accepts runs on the local transport and trains exactly as the single-process reference
(float64), and a program it rejects does not (the executor raises, or its result differs).

Programs are mutations of small registered schedules (P=2 replicated over dp=2 with ZeRO stages
0-3 and one or two gathered ZeRO-3 copies, or P=4): a FREE, OFFLOAD, PREFETCH or collective moved
to another place on its rank, or an OFFLOAD (and maybe a PREFETCH) of a stash or weights inserted.
"""
from __future__ import annotations

import copy
import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipert.ir import Action, Op, Payload, Schedule, parse_action
from pipert.ir import passes as P
from pipert.ir.semantics import COLLECTIVE_OPS, MEMORY_OPS
from pipert.exec.instrument import Instrumentation
from pipert.pipeline import Pipeline
from pipert.schedules import build_schedule
from pipert.schedules.data_parallel import replicate
from pipert.sim import ScheduleError, validate
from pipert.testing import make_batch, sgd, tiny_units
from pipert.tools.reference import reference_step, rel_err

BASES = [("1f1b", 2), ("zb-h1", 2), ("interleaved-1f1b", 2), ("1f1b", 4), ("zb-h1", 4)]
"""(family, stages): replicated over dp=2 when stages is 2."""
TIMEOUT = 3.0
"""Seconds the executor waits for a message (a rejected program may deadlock)."""
PASSES_4 = [lambda s: s, P.offload_weights, P.offload_stashes]
"""What a P=4 base gets before its mutations: nothing, or offloads of weights or of stashes."""


def _base(draw: st.DrawFn) -> Schedule:
    name, stages = draw(st.sampled_from(BASES))
    s = build_schedule(name, stages=stages, microbatches=4 if name == "interleaved-1f1b" else stages)
    if stages == 2:
        zeros = [draw(st.integers(0, 3)) for _ in range(s.num_units)]
        return replicate(s, 2, zeros, zero3_buffers=draw(st.sampled_from([1, 2])))
    return PASSES_4[draw(st.integers(0, len(PASSES_4) - 1))](s)


def _move(draw: st.DrawFn, acts: list[Action]) -> None:
    movable = [i for i, a in enumerate(acts) if a.op in MEMORY_OPS or a.op in COLLECTIVE_OPS]
    if movable:
        a = acts.pop(draw(st.sampled_from(movable)))
        acts.insert(draw(st.integers(0, len(acts))), a)


def _offload(draw: st.DrawFn, acts: list[Action]) -> None:
    """An OFFLOAD of a stash this rank's F leaves or of weights it reads, at a drawn place, and
    (mostly) a PREFETCH at a later one."""
    computes = [a for a in acts if a.op is Op.F]
    if not computes:
        return
    f = draw(st.sampled_from(computes))
    if draw(st.booleans()):
        value = Action(Op.OFFLOAD, unit=f.unit, mb=f.mb[:1], payload=Payload.STASH)
    else:
        value = Action(Op.OFFLOAD, unit=f.unit, payload=Payload.WEIGHT)
    i = draw(st.integers(0, len(acts)))
    acts.insert(i, value)
    if draw(st.integers(0, 3)):
        acts.insert(draw(st.integers(i + 1, len(acts))), dataclasses.replace(value, op=Op.PREFETCH))


@st.composite
def mutated(draw: st.DrawFn) -> Schedule:
    s = _base(draw)
    acts = [list(a) for a in s.actions]
    for _ in range(draw(st.integers(1, 2))):
        r = draw(st.integers(0, s.num_ranks - 1))
        if draw(st.integers(0, 2)):
            _move(draw, acts[r])
        else:
            _offload(draw, acts[r])
    return s.with_actions(acts)


def _runs_exactly(s: Schedule) -> tuple[bool, str]:
    """Whether one step of ``s`` on the local transport equals the reference on every rank (each
    replica's copy of the units it holds), and why not."""
    M = s.num_microbatches
    units = tiny_units(s.num_units, "float64")
    ref_units = copy.deepcopy(units)
    x, y = make_batch(M)
    try:
        try:
            pipe = Pipeline(units, s, optimizer=sgd, timeout=TIMEOUT, instrument=Instrumentation(check=False))
        except TypeError:
            raise AssertionError("Pipeline's signature changed") from None   # not a program that does not run
        loss = pipe.step(x, y)
    except AssertionError:
        raise
    except Exception as e:   # noqa: BLE001 - any other failure is "does not run"
        return False, f"raised {type(e).__name__}: {e}"
    ref = reference_step(ref_units, x, y, M, optimizer=sgd([p for u in ref_units for p in u.parameters()]),
                         copy_units=False)
    errs = [abs(loss - float(ref.loss)) / max(1.0, abs(loss))]
    ranks = pipe.ranks
    try:
        for r in ranks:   # named_parameters() and named_grads() of one rank's units
            pipe.ranks = [r]
            for got, want in ((pipe.named_grads(), ref.grads), (pipe.named_parameters(), ref.params_after)):
                errs.append(rel_err(got, {k: want[k] for k in got}) if got else 0.0)
    finally:
        pipe.ranks = ranks
    return max(errs) <= 1e-10, f"differs from the reference by {max(errs)}"


@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_validator_accepts_exactly_the_programs_the_executor_runs(s: Schedule) -> None:
    try:
        validate(s)
        accepted, why = True, ""
    except ScheduleError as e:
        accepted, why = False, str(e)
    ran, how = _runs_exactly(s)
    assert accepted == ran, (f"validator {'accepts' if accepted else 'rejects: ' + why}; executor {how}\n" +
                             "\n".join(f"rank {r}: " + "; ".join(map(str, acts)) for r, acts in enumerate(s.actions)))


def _zb_h1_zero3(buffers: int) -> tuple[Schedule, int]:
    """zb-h1, P=2, dp=2, ZeRO-3 with the FREE of unit 0's gathered (bwd) weights on rank 0 moved
    from after its last W to after its last D; and the index of that W."""
    s = replicate(build_schedule("zb-h1", stages=2, microbatches=2), 2, [3, 3], zero3_buffers=buffers)
    acts = list(s.actions[0])
    i = max(i for i, a in enumerate(acts) if a.op is Op.FREE and a.unit == 0 and a.side in (None, "bwd"))
    free = acts.pop(i)
    last_d = max(i for i, a in enumerate(acts) if a.op is Op.D and a.unit == 0)
    acts.insert(last_d + 1, free)
    w = next(i for i in range(last_d + 2, len(acts)) if acts[i].op is Op.W and acts[i].unit == 0)
    return s.with_actions([acts] + [list(a) for a in s.actions[1:]]), w


@pytest.mark.parametrize("buffers", [1, 2])
def test_weights_freed_before_a_w_are_rejected_naming_the_w(buffers):
    """W reads the gathered ZeRO-3 weights (its stash refers to them): freeing them between the
    last D and the last W is an error at that W, and the executor cannot run it either."""
    s, w = _zb_h1_zero3(buffers)
    with pytest.raises(ScheduleError) as e:
        validate(s)
    assert (e.value.rank, e.value.index, e.value.action.op) == (0, w, Op.W), str(e.value)
    assert e.value.reason == "missing_input" and "weight u0" in str(e.value) and "FREE weight u0" in str(e.value)
    assert not _runs_exactly(s)[0]


def _edit(s: Schedule, rank: int, after: str | None, insert: list[str], move: str | None = None) -> Schedule:
    """``s`` with ``insert`` (action texts) placed after the action ``after`` on ``rank`` (None: at
    the front); ``move``: an action of that rank taken from its place and inserted the same way."""
    acts = [list(a) for a in s.actions]
    mine = acts[rank]
    new = [parse_action(t) for t in insert]
    if move is not None:
        new = [mine.pop([str(a) for a in mine].index(move))]
    at = 0 if after is None else [str(a) for a in mine].index(after) + 1
    mine[at:at] = new
    return s.with_actions(acts)


def _one_f_one_b_dp2(zero: list[int], buffers: int) -> Schedule:
    return replicate(build_schedule("1f1b", stages=2, microbatches=2), 2, zero, zero3_buffers=buffers)


@pytest.mark.parametrize("case", ["stash of unit 0 read while offloaded", "stash offloaded after its backward",
                                  "gathered ZeRO-3 copies offloaded", "gradient reduced before its contributions",
                                  "ZeRO-3 weights offloaded before their gather", "stale ZeRO-2 weights offloaded"])
def test_found_disagreements_are_rejected_and_do_not_run(case):
    """Programs on which the validator and the executor once disagreed (found by the test above)."""
    if case == "stash of unit 0 read while offloaded":   # unit 0 saves no tensor autograd would lose
        s = _edit(build_schedule("zb-h1", stages=4, microbatches=4), 0, "F u0 m2", ["OFFLOAD stash u0 m2"])
        s = _edit(s, 0, "D u0 m2", ["PREFETCH stash u0 m2"])
        reason = "offloaded"
    elif case == "stash offloaded after its backward":
        s = _edit(build_schedule("1f1b", stages=4, microbatches=4), 1, "B u1 m1", ["OFFLOAD stash u1 m1"])
        reason = "missing_input"
    elif case == "gathered ZeRO-3 copies offloaded":
        s = _edit(_one_f_one_b_dp2([0, 3], 2), 1, "B u1 m0", ["OFFLOAD weight u1", "PREFETCH weight u1"])
        reason = "zero_class"
    elif case == "ZeRO-3 weights offloaded before their gather":
        s = _edit(_one_f_one_b_dp2([3, 0], 1), 0, None, ["OFFLOAD weight u0"])
        reason = "input_later"
    elif case == "stale ZeRO-2 weights offloaded":   # after OPT, before the ALLGATHER of the new weights
        s = _edit(_one_f_one_b_dp2([2, 0], 1), 0, "OPT u0", ["OFFLOAD weight u0", "PREFETCH weight u0"])
        reason = "input_later"   # the gathered weights come later
    else:   # rank 3's share of unit 1's gradient reduced before its backwards ran
        s = _edit(_one_f_one_b_dp2([3, 0], 2), 3, None, [], move="ALLREDUCE wgrad u1 @1,3")
        reason = "wgrad"
    with pytest.raises(ScheduleError) as e:
        validate(s)
    assert e.value.reason == reason, str(e.value)
    assert not _runs_exactly(s)[0]
