"""1F1B as Megatron-LM runs it (benchmarks/_megatron_p2p.py): the simulated blocking schedule
against a direct timing of Megatron's loop of blocking calls."""
import dataclasses
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from _megatron_p2p import blocking_p2p  # noqa: E402

from pipert.cost.topology import Links, LinkSpec, Topology
from pipert.cost.uniform import UniformCost
from pipert.ir import Op
from pipert.schedules import build_schedule
from pipert.sim import simulate

TF, TB = 1.0, 2.0


def megatron_two_stages(n: int, transfer: float) -> float:
    """Makespan of forward_backward_pipelining_without_interleaving on 2 stages: each blocking
    call returns when both stages reached it and its messages (one each way at most, concurrent)
    took ``transfer``; computes take TF and TB."""
    calls = list(range(n + 1))
    # stage 0: F, send_forward(0) = call 0; per steady step F(i+1), call i+1, B(i); recv_backward = call n, B
    first = [("c", TF), ("x", 0)] + [s for i in range(n - 1) for s in (("c", TF), ("x", i + 1), ("c", TB))]
    first += [("x", n), ("c", TB)]
    # stage 1: recv_forward(0) = call 0; per step F(i), B(i), send_backward(_recv_forward) = call i+1
    last = [("x", 0)] + [s for i in range(n) for s in (("c", TF), ("c", TB), ("x", i + 1))]
    clock, pos = [0.0, 0.0], [0, 0]
    progs = [first, last]
    for call in calls:
        for r, prog in enumerate(progs):
            while prog[pos[r]][0] == "c":
                clock[r] += prog[pos[r]][1]
                pos[r] += 1
            assert prog[pos[r]] == ("x", call)
            pos[r] += 1
        clock = [max(clock) + transfer] * 2
    for r, prog in enumerate(progs):
        clock[r] += sum(d for _, d in prog[pos[r]:])
    return max(clock)


def _links(transfer: float) -> Links:
    topo = Topology(2, ranks_per_node=1)
    act = UniformCost(TF, TB).message_bytes("act", 0)
    return Links(topo, {"inter_node": LinkSpec(0.0, act / transfer)})


@pytest.mark.parametrize("n", [1, 2, 5])
@pytest.mark.parametrize("transfer", [0.5, 3.0])
def test_blocking_1f1b_times_as_megatrons_loop_of_blocking_calls(n, transfer):
    s = blocking_p2p(build_schedule("1f1b", stages=2, microbatches=n))
    got = simulate(s, UniformCost(TF, TB), links=_links(transfer)).makespan
    assert got == pytest.approx(megatron_two_stages(n, transfer), abs=1e-9)


def test_blocking_costs_more_than_overlapped_transfers_on_a_slow_middle_boundary():
    """4 stages on 2 nodes: the slow boundary's stages wait for its transfers only when blocking
    (on 2 stages 1F1B's dependencies already put every transfer on the critical path)."""
    plain = build_schedule("1f1b", stages=4, microbatches=8)
    topo = Topology(4, ranks_per_node=2)
    act = UniformCost(TF, TB).message_bytes("act", 0)
    links = Links(topo, {"intra_node": LinkSpec(0.0, 1e12), "inter_node": LinkSpec(0.0, act / 2.0)})
    cost = UniformCost(TF, TB)
    assert simulate(blocking_p2p(plain), cost, links=links).makespan > simulate(plain, cost, links=links).makespan


@pytest.mark.parametrize("p,n", [(3, 4), (4, 8)])
def test_blocking_changes_nothing_when_transfers_are_free(p, n):
    plain = build_schedule("1f1b", stages=p, microbatches=n)
    blocked = blocking_p2p(plain)
    assert simulate(blocked, UniformCost(TF, TB)).makespan == pytest.approx(
        simulate(plain, UniformCost(TF, TB)).makespan, abs=1e-12)
    for acts in blocked.actions:   # no compute between a SEND/RECV and its WAIT
        open_ = []
        for a in acts:
            if a.op in (Op.SEND, Op.RECV):
                open_.append(a)
            elif a.op is Op.WAIT:
                open_.remove(dataclasses.replace(a, op=a.waits, waits=None))
            else:
                assert not open_, f"{a} runs before {open_} completed"
