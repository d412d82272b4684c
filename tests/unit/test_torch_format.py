"""torch.distributed.pipelining's action format, and torch's own programs under pipert's model.

The orders come from torch's schedule classes themselves (``pipert.testing.torch_orders``).
The receive model of docs/semantics.md accepts every torch interleaved-zero-bubble program
(compute-only, lowered by pipert, and with torch's own send/receive positions), times torch's
send/receive positions exactly as pipert's lowering of the same compute order, trains them
exactly, and still rejects receives on one link that are out of send order.
"""
from __future__ import annotations

import dataclasses

import pytest

from pipert.cost import UniformCost
from pipert.ir import Op, ScheduleFormatError
from pipert.ir.torch_format import from_torch, parse_torch_action, read_torch_csv, to_torch, write_torch_csv
from pipert.sim import simulate, validate
from pipert.sim.errors import ScheduleError
from pipert.testing import Case, run_case, torch_orders

IZB = "ScheduleInterleavedZeroBubble"
IZB_CONFIGS = [(p, v, m) for p in (2, 3, 4) for v in (2, 3) for m in range(1, 4 * p + 1)
               if m % max(1, m // p) == 0]


@pytest.mark.parametrize("comms", [False, True], ids=["lowered", "torch-comms"])
def test_torch_interleaved_zero_bubble_programs_validate(comms):
    assert len(IZB_CONFIGS) >= 38
    for p, v, m in IZB_CONFIGS:
        s = from_torch(torch_orders(IZB, p, m, v, comms=comms), fsdp="drop")
        assert (s.num_ranks, s.num_units, s.num_microbatches) == (p, p * v, m)
        validate(s)


@pytest.mark.parametrize("cls,v", [(IZB, 2), (IZB, 3), ("ScheduleZBVZeroBubble", 2), ("ScheduleInterleaved1F1B", 2)])
@pytest.mark.parametrize("p,m", [(2, 4), (3, 6), (4, 4), (4, 8)])
def test_torch_send_receive_positions_time_like_pipert_lowering(cls, v, p, m):
    """No pessimism: torch's own send/receive positions simulate in the same time as pipert's
    lowering of the same compute order (both post a receive before the compute ahead of its
    consumer or earlier, and receives on different links never wait for each other)."""
    cost = UniformCost(1.0, 2.0)
    lowered = simulate(from_torch(torch_orders(cls, p, m, v), fsdp="drop"), cost).makespan
    theirs = simulate(from_torch(torch_orders(cls, p, m, v, comms=True), fsdp="drop"), cost).makespan
    assert theirs == lowered


def test_receives_out_of_send_order_on_one_link_are_rejected():
    s = from_torch(torch_orders(IZB, 3, 4, 2, comms=True), fsdp="drop")
    acts = list(s.actions[1])
    recvs = [i for i, a in enumerate(acts) if a.op is Op.RECV and a.peer == 0]
    i, j = recvs[0], recvs[1]
    acts[i], acts[j] = acts[j], acts[i]
    bad = s.with_actions([acts if r == 1 else list(a) for r, a in enumerate(s.actions)])
    with pytest.raises(ScheduleError, match="rank 1"):
        validate(bad)


@pytest.mark.parametrize("comms", [False, True])
def test_torch_interleaved_zero_bubble_trains_exactly_local(comms):
    r = run_case(Case(f"torch:{IZB}", 3, 4, chunks=2, options=(("comms", comms),), steps=2))
    assert r.loss_err <= 1e-12 and r.grad_err <= 1e-10 and r.param_err <= 1e-10, r


def test_round_trip_through_torch_format():
    orders = torch_orders(IZB, 3, 6, 2)
    s = from_torch(orders, fsdp="drop")
    texts = to_torch(s)
    assert texts == [[repr(a) for a in orders[r] if a is not None] for r in range(3)]
    assert from_torch(read_torch_csv(write_torch_csv(texts))).actions == s.actions
    with_comms = from_torch(torch_orders(IZB, 3, 6, 2, comms=True), fsdp="drop")
    assert from_torch(to_torch(with_comms, comms=True)).actions == with_comms.actions


def test_bad_torch_input_is_named():
    assert parse_torch_action("12SEND_B3") == (12, "SEND_B", 3)
    with pytest.raises(ScheduleFormatError, match="'0X1' not understood"):
        parse_torch_action("0X1")
    with pytest.raises(ScheduleFormatError, match="FSDP hook"):
        from_torch([["0UNSHARD", "0F0"], ["1F0"]])
    with pytest.raises(ScheduleFormatError, match="stage 0 computes on ranks 0 and 1"):
        from_torch([["0F0"], ["0F1"]])
    s = from_torch(torch_orders(IZB, 2, 2, 2))
    folded = s.with_actions([[dataclasses.replace(a, mb=(0, 1)) if a.op is Op.F and a.unit == 0 else a
                              for a in acts] for acts in s.actions])
    with pytest.raises(ScheduleFormatError, match="no torch equivalent"):
        to_torch(folded)
