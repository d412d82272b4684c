"""message_action and compute_action (the unchecked constructors of lowering and generators) build
the checked Action."""
import dataclasses
import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipert.ir.action import Action, Op, Payload, compute_action, message_action


@given(op=st.sampled_from([Op.SEND, Op.RECV]), unit=st.integers(0, 100),
       mb=st.lists(st.integers(0, 1000), min_size=1, max_size=4).map(tuple),
       payload=st.sampled_from([Payload.ACT, Payload.GRAD]), peer=st.integers(0, 63))
def test_message_action_is_the_checked_action(op: Op, unit: int, mb: tuple, payload: Payload, peer: int) -> None:
    _assert_same(message_action(op, unit, mb, payload, peer), Action(op, unit, mb, payload, peer))


@given(op=st.sampled_from([Op.F, Op.B, Op.D, Op.W, Op.RECOMPUTE]), unit=st.integers(0, 100),
       mb=st.lists(st.integers(0, 1000), min_size=1, max_size=4).map(tuple))
def test_compute_action_is_the_checked_action(op: Op, unit: int, mb: tuple) -> None:
    _assert_same(compute_action(op, unit, mb), Action(op, unit, mb))


def _assert_same(fast: Action, checked: Action) -> None:
    assert type(fast) is Action
    assert dataclasses.astuple(fast) == dataclasses.astuple(checked)
    assert fast == checked
    assert hash(fast) == hash(checked)
    assert str(fast) == str(checked)
    assert {fast: 1}[checked] == 1
    assert pickle.loads(pickle.dumps(fast)) == checked
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.unit = 0   # built through a draft, the action is as frozen as a checked one


def test_the_unchecked_shapes_are_valid_actions():
    """Every field set Action accepts without its full check (``_plain``) passes that check: all
    combinations of valid and invalid values of each field, for every op."""
    import itertools
    from types import SimpleNamespace

    from pipert.ir.action import _plain
    from pipert.ir.semantics import fields_error
    accepted = 0
    for fields in itertools.product(list(Op), [None, -1, 0], [(), (0,), (1, -1)], [None, Payload.ACT, Payload.WEIGHT,
                                    Payload.STASH], [None, 1], [(), (0, 1)], [None, 0, 5], [None, (0, 2)],
                                    [None, Op.SEND, Op.F]):
        if _plain(*fields):
            accepted += 1
            names = ("op", "unit", "mb", "payload", "peer", "group", "root", "sub", "waits")
            assert fields_error(SimpleNamespace(**dict(zip(names, fields)), zclass=None, side=None)) is None, fields
    assert accepted >= 20   # computes, messages, waits, collectives and frees among them


def test_the_unchecked_shapes_cover_weight_passing():
    """The messages, waits, collectives and frees of weight passing take the unchecked path."""
    from pipert.ir.action import _plain
    shapes = [(Op.SEND, 3, (), Payload.WEIGHT, 1, (), None, None, None),
              (Op.RECV, 3, (), Payload.WGRAD, 1, (), None, None, None),
              (Op.WAIT, 3, (), Payload.WGRAD, 1, (), None, None, Op.SEND),
              (Op.BROADCAST, 3, (), Payload.WEIGHT, None, (0, 1), 1, None, None),
              (Op.REDUCE, 3, (), Payload.WGRAD, None, (0, 1), 0, None, None),
              (Op.FREE, 3, (), Payload.WEIGHT, None, (), None, None, None)]
    assert all(_plain(*s) for s in shapes)
    assert not _plain(Op.BROADCAST, 3, (), Payload.WEIGHT, None, (0, 1), 2, None, None)   # root outside the group
