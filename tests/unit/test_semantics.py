"""The semantics object (``pipert.ir.semantics``): the op sets derived from its table, the plans
of W and OPT on ZeRO units, and the typed queue of collectives (``Placement.collective_queue``)."""
from __future__ import annotations

import dataclasses

import pytest

from pipert.ir import Action, Op, Schedule
from pipert.ir.action import ScheduleFormatError
from pipert.ir.semantics import (BOUNDARY_OPS, COMPUTE_OPS, DROPPING_OPS, HOST_OPS, LOCAL_WGRAD_OPS, MEMORY_OPS,
                                 PIECEWISE_OPS, STASH_READERS, UNIT_COMPUTE_OPS, WEIGHT_READERS, Queue, Semantics,
                                 Value, slot)
from pipert.schedules import build_schedule
from pipert.schedules.data_parallel import replicate
from pipert.cost import UniformCost
from pipert.sim import simulate


def test_op_sets_derived_from_the_table():
    F, B, D, W, R, OPT = Op.F, Op.B, Op.D, Op.W, Op.RECOMPUTE, Op.OPT
    assert UNIT_COMPUTE_OPS == {F, B, D, W, R} and COMPUTE_OPS == {F, B, D, W, R, OPT}
    assert STASH_READERS == {B, D} and LOCAL_WGRAD_OPS == {B, W} and BOUNDARY_OPS == {F, B, D}
    assert WEIGHT_READERS == {F, B, D, W, R} and PIECEWISE_OPS == {W}
    assert MEMORY_OPS == {Op.FREE, Op.OFFLOAD, Op.PREFETCH} and DROPPING_OPS == {Op.FREE, Op.OFFLOAD}
    assert HOST_OPS == {Op.OFFLOAD, Op.PREFETCH}


def _zero(stages: list[int], buffers: int = 1) -> Schedule:
    return replicate(build_schedule("zb-h1", stages=2, microbatches=2), 2, stages, zero3_buffers=buffers)


@pytest.mark.parametrize("buffers", [1, 2])
def test_w_reads_the_gathered_weights_of_zero3_units_only(buffers):
    s = _zero([3, 1], buffers)
    sem = Semantics.of(s)
    w0, w1 = Action(Op.W, unit=0, mb=(0,)), Action(Op.W, unit=1, mb=(1,))
    bwd = 8 if buffers == 2 else 0   # the slot of the bwd copy (pipert.ir.semantics.BWD)
    assert (Value.WEIGHT, 0, slot(None, "bwd" if buffers == 2 else None)) in sem.reads(w0, 0)
    assert slot(None, "bwd" if buffers == 2 else None) == bwd
    assert not any(k[0] is Value.WEIGHT for k in sem.reads(w1, 1))   # ZeRO-1: W keeps what it saved
    assert sem.reads(w0, 0)[0] == (Value.STASH_W, 0, 0)


def test_opt_steps_the_shard_and_leaves_zero12_weights_stale():
    s = _zero([3, 1])
    sem = Semantics.of(s)
    for u, rank, stale in ((0, 0, False), (1, 1, True)):
        plan = sem.plan(Action(Op.OPT, unit=u), rank)
        assert [(e.kind, e.shard) for e in plan.writes] == [(Value.WEIGHT, True)]
        assert {(e.kind, e.shard) for e in plan.reads} == {(Value.WGRAD, True), (Value.WEIGHT, True)}
        assert [(e.kind, e.shard) for e in plan.frees] == ([(Value.WEIGHT, False)] if stale else [])
    assert sem.initial(0) == [(0, 0, True)] and sem.initial(1) == [(1, 0, False), (1, 0, True)]


def test_collective_queue_is_a_typed_placement_field():
    s = build_schedule("1f1b", stages=2, microbatches=2)
    assert Semantics.of(s).queue(Op.ALLREDUCE) is Queue.GROUP
    d = s.to_dict()
    d["meta"] = dict(d.get("meta") or {}, collective_queue="compute")   # how older files give it
    old = Schedule.from_dict(d)
    assert old.placement.collective_queue is Queue.COMPUTE and "collective_queue" not in old.meta
    assert Schedule.from_dict(old.to_dict()).placement.collective_queue is Queue.COMPUTE
    sem = Semantics.of(old)
    assert sem.queue(Op.ALLREDUCE) is Queue.COMPUTE and sem.queue(Op.SEND) is Queue.SEND
    with pytest.raises(ScheduleFormatError, match="collective_queue must be 'group' or 'compute'"):
        dataclasses.replace(s.placement, collective_queue="send")


def test_the_engine_puts_collectives_on_the_placements_queue():
    s = _zero([0, 0])
    blocking = s.with_actions([list(a) for a in s.actions])
    blocking.placement = dataclasses.replace(s.placement, collective_queue=Queue.COMPUTE)
    cost = UniformCost(tf=1.0, weight_bytes=50.0)
    on_group = {(r, str(a)): q for r, q, a, _, _ in simulate(s, cost).events}
    on_compute = {(r, str(a)): q for r, q, a, _, _ in simulate(blocking, cost).events}
    key = next(k for k in on_group if k[1].startswith("ALLREDUCE"))
    assert (on_group[key], on_compute[key]) == ("group", "compute")
