"""message_action (lowering's unchecked SEND/RECV constructor) builds the checked Action."""
from hypothesis import given
from hypothesis import strategies as st

from pipert.ir.action import Action, Op, Payload, message_action


@given(op=st.sampled_from([Op.SEND, Op.RECV]), unit=st.integers(0, 100),
       mb=st.lists(st.integers(0, 1000), min_size=1, max_size=4).map(tuple),
       payload=st.sampled_from([Payload.ACT, Payload.GRAD]), peer=st.integers(0, 63))
def test_message_action_is_the_checked_action(op: Op, unit: int, mb: tuple, payload: Payload, peer: int) -> None:
    fast, checked = message_action(op, unit, mb, payload, peer), Action(op, unit, mb, payload, peer)
    assert fast == checked
    assert hash(fast) == hash(checked)
    assert str(fast) == str(checked)
    assert {fast: 1}[checked] == 1
