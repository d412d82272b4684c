"""TawPipe under data parallelism: each replica runs its node groups' BROADCAST/REDUCE among its
own ranks, the owners' gradients are reduced over the replicas right before their OPT, which
follows the owner's last compute; the program validates under gloo's and NCCL's rules, trains as
the reference with every rank in this process, and the emulator runs it in its order."""
from __future__ import annotations

import pytest

from pipert.compiler import compile
from pipert.ir import Op, Payload
from pipert.ir.semantics import TABLE, Queue
from pipert.schedules import build_schedule
from pipert.schedules.data_parallel import replicate

ROOTED = (Op.BROADCAST, Op.REDUCE)
REPLICA_OPS = {0: Op.ALLREDUCE, 1: Op.REDUCESCATTER, 2: Op.REDUCESCATTER, 3: Op.REDUCESCATTER}


def _program(P: int, G: int, zero: int, rules: str):
    return compile("tawpipe", stages=P, microbatches=4 * P, dp=2, zero=zero, rules=rules,
                   schedule_options={"ranks_per_node": G}).to_schedule()


@pytest.mark.parametrize("P,G", [(2, 2), (4, 2), (4, 1)])
@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_replicas_keep_their_groups_and_reduce_at_the_owners(P, G, zero):
    s = _program(P, G, zero, "nccl" if zero in (0, 3) else "gloo")   # compile validates under them
    owners = s.placement.weight_owner
    for rank, acts in enumerate(s.actions):
        d, r = divmod(rank, P)
        for a in acts:
            if a.op in ROOTED:                    # the base's node group, moved into replica d
                assert all(g // P == d for g in a.group) and a.root in a.group and rank in a.group, (rank, a)
            elif a.op is REPLICA_OPS[zero]:       # the owner's gradient over its copies in both replicas
                assert a.payload is Payload.WGRAD and owners[a.unit] == r and a.group == (r, r + P), (rank, a)
        computes = [i for i, a in enumerate(acts) if TABLE[a.op].queue is Queue.COMPUTE
                    and a.op not in (Op.FREE, Op.WAIT)]
        opts = [i for i in computes if acts[i].op is Op.OPT]
        assert len(opts) == 1 and opts[0] == computes[-1], rank     # the owner steps after its last compute
        reduce_at = max(i for i, a in enumerate(acts) if a.op is REPLICA_OPS[zero])
        assert reduce_at < opts[0]


def test_zero3_owner_gathers_its_weights_before_it_broadcasts_them():
    s = _program(2, 2, 3, "nccl")
    for rank, acts in enumerate(s.actions):
        mine = [a for a in acts if a.unit == s.placement.weight_owner.index(rank % 2)]
        first = next(i for i, a in enumerate(mine) if a.payload is Payload.WEIGHT and a.op is not Op.FREE)
        assert mine[first].op is Op.ALLGATHER, (rank, mine[first])
        assert any(a.op is Op.BROADCAST and a.root == rank for a in mine[first + 1:]), rank


def test_without_replicas_the_owner_steps_as_soon_as_its_sums_are_in():
    """``dp`` is what moves the OPT: at D = 1 TawPipe keeps the paper's early step."""
    base = build_schedule("tawpipe", stages=4, microbatches=4, ranks_per_node=2)
    last = build_schedule("tawpipe", stages=4, microbatches=4, ranks_per_node=2, dp=2)
    assert not base.meta["opt_last"] and last.meta["opt_last"]
    early = [r for r, acts in enumerate(base.actions)
             if any(a.op in (Op.F, Op.B) for a in acts[[a.op for a in acts].index(Op.OPT):])]
    assert early                                  # some owner computes after its step
    with pytest.raises(ValueError, match="tawpipe option dp must be an integer >= 1, got 0"):
        build_schedule("tawpipe", stages=4, microbatches=4, ranks_per_node=2, dp=0)


@pytest.mark.parametrize("kw", [{"zero": 3, "zero3_buffers": 2}, {"zero": [(3, 1)] * 2, "zero_numel": [[4, 4]] * 2}])
def test_zero_splits_of_travelling_weights_are_refused(kw):
    base = build_schedule("tawpipe", stages=2, microbatches=2, ranks_per_node=2)
    with pytest.raises(ValueError, match="moves the weights or gradients of unit"):
        replicate(base, 2, **kw)


def test_all_ranks_in_one_process_train_as_the_reference():
    """The local transport (every rank a thread of this process) under ZeRO-3, owners stepping last."""
    from pipert.testing import Case, run_case
    r = run_case(Case("tawpipe", 2, 8, dp=2, zero=3, options=(("ranks_per_node", 2), ("dp", 2)), steps=2))
    assert r.loss_err <= 1e-12 and r.grad_err <= 1e-10 and r.param_err <= 1e-10, r


def test_the_emulator_runs_the_program_in_its_order_and_no_faster_than_the_ideal():
    from pipert.cost.uniform import UniformCost
    from pipert.emulate.emulator import emulate
    p = compile("tawpipe", stages=2, microbatches=8, dp=2, zero=1, schedule_options={"ranks_per_node": 2})
    r = emulate(p, UniformCost(tf=1, tb=2), None, time_unit=2e-3)
    assert r.ideal_makespan == pytest.approx(r.predicted, abs=1e-6) and r.makespan >= r.ideal_makespan - 1e-6
    s = p.to_schedule()
    for rank in range(s.num_ranks):      # each rank's computes ran in its program's order
        mine = [e[2] for e in r.events if e[0] == rank and e[1] == "compute" and e[2].is_compute]
        assert mine == [a for a in s.actions[rank] if a.is_compute]
