"""WeiPipe's paper ring (the default) against pipert's direct variant: the bubble the paper
claims, the lock-step model, and every copy on the ring hop by hop."""
from __future__ import annotations

import json
from collections import Counter

import pytest

from pipert.cli import main
from pipert.cost.uniform import UniformCost
from pipert.ir import Op, Payload
from pipert.schedules import build_schedule
from pipert.schedules.weipipe import WeiPipeConfig, lockstep_makespan, weipipe_plan
from pipert.sim import simulate, validate


def sched(v: str, p: int, n: int, ring: str = "paper"):
    return build_schedule(f"weipipe-{v}", stages=p, microbatches=n * p, ring=ring)


def test_cli_bubble_p4_m8(capsys):
    """`pipert simulate weipipe-interleave -P 4 -M 8` (free links, tf=1, tb=2): the paper's
    0.273 = 1F1B's (P-1)/(N+P-1); the direct variant has none."""
    out = {}
    for name in ("weipipe-interleave", "weipipe-interleave-direct"):
        assert main(["simulate", name, "-P", "4", "-M", "8", "--json"]) == 0
        out[name] = json.loads(capsys.readouterr().out)
    assert out["weipipe-interleave"]["bubble_ratio"] == pytest.approx(3 / 11)
    assert abs(out["weipipe-interleave"]["bubble_ratio"] - 0.273) < 0.01
    assert out["weipipe-interleave-direct"]["bubble_ratio"] == 0.0


@pytest.mark.parametrize("v,p,n,tf,tb", [("interleave", 2, 2, 1, 2), ("interleave", 3, 2, 2, 3),
                                         ("interleave", 4, 4, 1, 1), ("interleave", 5, 1, 1, 2),
                                         ("naive", 3, 2, 1, 2), ("naive", 4, 2, 2, 3)])
def test_free_links_equal_lockstep(v, p, n, tf, tb):
    """With free links the simulated paper ring is the paper's lock-step analysis, exactly:
    a gradient accumulator leaves after its holder's turn and the next holder adds to it only
    once it arrived, so a worker's turn t+1 follows its predecessor's turn t."""
    cost = UniformCost(tf, tb)
    t = lockstep_makespan(weipipe_plan(WeiPipeConfig(p, n * p, v)), cost)
    assert simulate(sched(v, p, n), cost).makespan == pytest.approx(t)
    direct = simulate(sched(v, p, n, "direct"), cost).makespan
    assert direct == pytest.approx(n * p * (tf + tb)) and direct < t


@pytest.mark.parametrize("v,p,n", [("zb1", 4, 2), ("zb2", 3, 2), ("zb2", 4, 1)])
def test_zero_bubble_variants_within_lockstep(v, p, n):
    """WZB1/WZB2 add to a gradient in some turns only, so turns couple less: at most lock-step."""
    cost = UniformCost(tf=1.0, td=1.0, tw=1.0)
    t = lockstep_makespan(weipipe_plan(WeiPipeConfig(p, n * p, v)), cost)
    assert n * p * 3.0 < simulate(sched(v, p, n), cost).makespan <= t + 1e-9


@pytest.mark.parametrize("v,p,n", [("interleave", 4, 2), ("interleave", 5, 2), ("naive", 3, 2), ("zb1", 4, 2)])
def test_every_message_is_a_ring_hop(v, p, n):
    """Paper ring: every weight and gradient message goes k -> k+1, but the re-seeds before
    turn 0 (tag 0): the owner of W^F_j puts it at the paper's position P-j (1 <= j < P/2;
    the paper's pairwise swap i <-> P-i; a ring hop when P-j = j+1). The direct ring sends
    off the ring."""
    s = sched(v, p, n)
    off = sorted((r, a.peer, a.unit) for r, _, a in s if a.op is Op.SEND and a.peer != (r + 1) % p)
    want = [(j, p - j, j) for j in range(1, (p + 1) // 2) if p - j != j + 1] if v != "zb1" else off
    assert off == want
    assert all(a.payload is Payload.WEIGHT and a.tag == 0 for r, _, a in s
               if a.op is Op.SEND and a.peer != (r + 1) % p)
    d = sched(v, p, n, "direct")
    assert any(a.op is Op.SEND and a.peer != (r + 1) % p and a.tag > 0 for r, _, a in d)


@pytest.mark.parametrize("p,n", [(3, 2), (4, 2), (4, 3)])
def test_gradient_hops_per_copy(p, n):
    """Interleave: D_j is added to on consecutive turns from worker 0's first B of j to worker
    P-1's last ((n-1)P + P-1 hops), then rides (j+1) mod P more hops to its owner j; the direct
    ring sends it straight to the owner (one message)."""
    hops = Counter(a.unit for _, _, a in sched("interleave", p, n) if a.op is Op.SEND and a.payload is Payload.WGRAD)
    assert hops == {j: n * p - 1 + (j + 1) % p for j in range(p) if n * p - 1 + (j + 1) % p}
    direct = Counter(a.unit for _, _, a in sched("interleave", p, n, "direct")
                     if a.op is Op.SEND and a.payload is Payload.WGRAD)
    assert direct == {j: n * p - 1 + (j != p - 1) for j in range(p)}


def test_contributions_wait_for_the_travelling_gradient():
    """Each B that adds to a gradient received from the predecessor waits for it (WAIT RECV
    wgrad right before the B): the paper's in-place accumulation, which enforces the turns."""
    s = sched("interleave", 4, 2)
    for r in range(4):
        acts = s.actions[r]
        for i, a in enumerate(acts):
            if a.op is Op.WAIT and a.waits is Op.RECV:
                assert a.waits is Op.RECV and a.payload is Payload.WGRAD and a.peer == (r - 1) % 4
                assert acts[i + 1].op is Op.B and acts[i + 1].unit == a.unit
    waits = sum(1 for _, _, a in s if a.op is Op.WAIT and a.waits is Op.RECV)
    assert waits == 8 * 4 - 4       # every B but each unit's first (worker 0, micro-batch 0)


@pytest.mark.parametrize("v", ["interleave", "naive", "zb1", "zb2"])
def test_paper_ring_validates_under_nccl(v):
    s = sched(v, 4, 2)
    assert validate(s, transport="nccl").num_transfers == s.count(Op.SEND)
