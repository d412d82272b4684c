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
