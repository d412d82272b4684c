"""``lower`` places receives in one pass where it can; the result is always what lowering with
receives before their consumers, then ``order_recvs_by_send`` and ``post_receives_early`` gives."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pipert.ir import Action, Op, Placement, add_optimizer_steps, lower
from pipert.ir.lowering import _in_send_order, _programs, _same_order, _sent_index, order_recvs_by_send
from pipert.ir.passes import post_receives_early
from pipert.schedules import build_schedule


def _two_passes(P: int, U: int, M: int, placement: Placement, compute: list[list[Action]]) -> list[list[Action]]:
    raw = lower("x", P, U, M, placement, compute, order_recvs=False)
    return post_receives_early(order_recvs_by_send(raw), 1).actions


@st.composite
def programs(draw: st.DrawFn) -> tuple:
    """Units placed on random ranks; each rank runs F and B (or D then W) of its units for every
    micro-batch in a random order, OPTs at the end."""
    P = draw(st.integers(2, 4))
    U = draw(st.integers(2, 6))
    M = draw(st.integers(1, 4))
    placement = Placement.by_unit([draw(st.integers(0, P - 1)) for _ in range(U)])
    split = draw(st.booleans())
    compute: list[list[Action]] = [[] for _ in range(P)]
    for u in range(U):
        for m in range(M):
            ops = [Op.F, Op.D, Op.W] if split else [Op.F, Op.B]
            compute[placement.rank(u, m)] += [Action(op, u, (m,)) for op in ops]
    compute = [draw(st.permutations(acts)) for acts in compute]
    return P, U, M, placement, add_optimizer_steps([list(c) for c in compute], placement)


@settings(max_examples=150, deadline=None)
@given(programs())
def test_one_pass_lowering_equals_the_two_passes(program: tuple) -> None:
    P, U, M, placement, compute = program
    assert lower("x", P, U, M, placement, compute).actions == _two_passes(P, U, M, placement, compute)


def test_registered_schedules_lower_as_with_the_two_passes() -> None:
    for name, P, M in (("1f1b", 4, 8), ("zb-v", 4, 8), ("interleaved-1f1b", 3, 6), ("zb-h1", 2, 5)):
        s = build_schedule(name, stages=P, microbatches=M)
        compute = [[a for a in acts if a.op not in (Op.SEND, Op.RECV)] for acts in s.actions]
        assert s.actions == _two_passes(P, s.num_units, M, s.placement, compute), name


@settings(max_examples=150, deadline=None)
@given(programs())
def test_made_messages_are_listed_in_program_order(program: tuple) -> None:
    """The quick check of ``lower`` (:func:`_same_order`) reads the messages ``_programs`` made, as it
    made them: each link's list is that link's SENDs in the sender's program, RECVs in the receiver's."""
    P, U, M, placement, compute = program
    links: dict = {}
    out = _programs(P, U, placement, compute, False, True, links)
    if out is None:
        return
    listed: dict = {}
    for r, acts in enumerate(out):
        for a in acts:
            if a.op in (Op.SEND, Op.RECV):
                link = (r, a.peer) if a.op is Op.SEND else (a.peer, r)
                listed.setdefault(link, ([], []))[a.op is Op.RECV].append((a.payload, a.unit, a.mb))
    assert listed == links
    if _same_order(links):
        assert all(_in_send_order(acts, sent) for acts, sent in zip(out, _sent_index(out)))
