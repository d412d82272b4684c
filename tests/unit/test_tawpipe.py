"""TawPipe schedules: validity, ownership, rail-aligned inter-node traffic, Fig. 3 facts,
weight versions, byte counts against the documented formulas, and bubbles."""
from __future__ import annotations

import math
from collections import Counter, defaultdict, deque

import pytest

from pipert.cost.topology import Links, LinkSpec, Topology
from pipert.cost.uniform import UniformCost
from pipert.ir import Op, Payload, Schedule
from pipert.schedules import available, build_schedule
from pipert.schedules.tawpipe import (TawPipeConfig, tawpipe_bytes, tawpipe_lockstep_makespan, tawpipe_owner,
                                      tawpipe_plan)
from pipert.schedules.weipipe import ring_message_count
from pipert.sim import simulate, validate

SHAPES = [(2, 2), (2, 3), (3, 2), (1, 4), (4, 1), (3, 8)]   # (nodes D, ranks per node G)


def build(d: int, g: int, n_loc: int = 1, **kw) -> Schedule:
    return build_schedule("tawpipe", stages=d * g, microbatches=n_loc * d * g, ranks_per_node=g, **kw)


def slot_of(s: Schedule, r: int, i: int) -> int:
    starts = s.meta["turn_start"][r]
    return max(t - 1 for t, st in enumerate(starts) if 0 <= st <= i)


def test_registered():
    assert "tawpipe" in available()


# every shape with every option, except the large (3, 8) shape: once
VALIDATE = [(d, g, n, st) for d, g in SHAPES for n in (1, 2) for st in (True, False)
            if (d, g) != (3, 8) or (n, st) == (1, True)]


@pytest.mark.parametrize("d,g,n_loc,stagger", VALIDATE)
def test_validates(d, g, n_loc, stagger):
    s = build(d, g, n_loc, stagger=stagger)
    validate(s)
    assert s.meta["ranks_per_node"] == g and s.meta["nodes"] == d
    assert s.count(Op.OPT) == d * g
    assert {a.payload for _, _, a in s if a.op in (Op.SEND, Op.RECV)} <= {Payload.WEIGHT, Payload.WGRAD}


@pytest.mark.parametrize("kw,match", [
    (dict(stages=6, microbatches=6, ranks_per_node=4), "ranks_per_node to divide stages"),
    (dict(stages=6, microbatches=9, ranks_per_node=3), "multiple of stages"),
])
def test_constraints(kw, match):
    with pytest.raises(ValueError, match=match):
        build_schedule("tawpipe", **kw)


def test_owner_formula():
    """Device i of group k owns shard (D*i + k) mod P; the notes' examples."""
    for d, g in SHAPES:
        p = d * g
        owner = {tawpipe_owner(j, p, g): j for j in range(p)}
        assert sorted(owner) == list(range(p))
        for k in range(d):
            for i in range(g):
                assert owner[k * g + i] == (d * i + k) % p
    assert [tawpipe_owner(j, 6, 3) for j in range(6)] == [0, 3, 1, 4, 2, 5]   # g0: W0,W2,W4; g1: W1,W3,W5
    assert sorted(j for j in range(24) if tawpipe_owner(j, 24, 8) < 8) == list(range(0, 24, 3))


@pytest.mark.parametrize("d,g", [(2, 2), (2, 3), (3, 2), (3, 8)])
def test_inter_node_p2p_between_equal_local_ranks(d, g):
    s, topo = build(d, g, 2), Topology(d * g, ranks_per_node=g)
    p2p = [(r, a) for r, _, a in s if a.op is Op.SEND]
    assert p2p
    for r, a in p2p:
        assert topo.link_class(r, a.peer) == "inter_node"       # nothing point-to-point inside a node
        assert r % g == a.peer % g, f"{r} -> {a.peer}: local ranks differ"
    for r, _, a in s:
        if a.is_comm and a.op not in (Op.SEND, Op.RECV):
            assert a.group == tuple(range(r // g * g, (r // g + 1) * g))   # collectives span one node
            assert (a.op, a.payload) in ((Op.BROADCAST, Payload.WEIGHT), (Op.REDUCE, Payload.WGRAD))


def test_fig3_facts():
    """P=6, D=2 (tawpipe.md §5(a)2): at t=4 P2 holds W4 and receives W5 from P5; at t=7 P5
    updates W5 (one micro-batch per device)."""
    s, plan = build(2, 3, 1), tawpipe_plan(TawPipeConfig(6, 6, 3))
    assert plan.steps[(0, 4)].unit == 4 and plan.steps[(0, 4)].master == 2 == tawpipe_owner(4, 6, 3)
    assert plan.steps[(0, 5)].unit == 5 and plan.steps[(0, 5)].master == 2 and plan.steps[(0, 5)].fetched
    recv = [i for i, a in enumerate(s.actions[2]) if a.op is Op.RECV and a.payload is Payload.WEIGHT and a.unit == 5]
    assert [slot_of(s, 2, i) for i in recv] == [4]
    assert s.actions[2][recv[0]].peer == 5
    opt = [i for i, a in enumerate(s.actions[5]) if a.op is Op.OPT and a.unit == 5]
    assert [slot_of(s, 5, i) for i in opt] == [7]
    # P0 sends W0 to P_{P/D} and receives W1 in return at t = 0
    sends0 = [(slot_of(s, 0, i), a.unit, a.peer) for i, a in enumerate(s.actions[0]) if a.op is Op.SEND]
    recvs0 = [(slot_of(s, 0, i), a.unit, a.peer) for i, a in enumerate(s.actions[0]) if a.op is Op.RECV]
    assert (0, 0, 3) in sends0 and (0, 1, 3) in recvs0


def test_holds_at_most_own_plus_two():
    """Each device holds its own shard, the one it computes and at most one prefetched."""
    for d, g in ((2, 3), (3, 2)):
        s = build(d, g, 2)
        for r in range(d * g):
            held, peak = set(), 0
            for a in s.actions[r]:
                if a.op in (Op.RECV, Op.BROADCAST) and a.payload is Payload.WEIGHT and a.root != r:
                    held.add(a.unit)
                elif a.op is Op.FREE:
                    held.discard(a.unit)
                peak = max(peak, len(held - set(s.units_owned(r))))
            assert peak <= 2
            assert not held - set(s.units_owned(r))


def run_versions(s: Schedule) -> None:
    """Symbolic run: weight versions move by SEND/RECV (FIFO per link) and BROADCAST; OPT
    bumps the owner's. Every compute must use version 0 (one update per iteration), and the
    optimizer state (OPT) never leaves the owner."""
    P = s.num_ranks
    ver = [{u: 0 for u in s.units_owned(r)} for r in range(P)]
    links: dict[tuple[int, int], deque] = defaultdict(deque)
    coll: dict[tuple, list] = defaultdict(list)
    ptr = [0] * P
    while any(ptr[r] < len(s.actions[r]) for r in range(P)):
        moved = False
        for r in range(P):
            while ptr[r] < len(s.actions[r]):
                a = s.actions[r][ptr[r]]
                if a.op is Op.RECV:
                    if not links[(a.peer, r)]:
                        break
                    v = links[(a.peer, r)].popleft()
                    if a.payload is Payload.WEIGHT:
                        ver[r][a.unit] = v
                elif a.op is Op.SEND:
                    links[(r, a.peer)].append(ver[r].get(a.unit) if a.payload is Payload.WEIGHT else None)
                elif a.op in (Op.BROADCAST, Op.REDUCE):
                    key = (a.group, a.tag, a.op)
                    if r not in coll[key]:
                        coll[key].append(r)
                    if len(coll[key]) < len(a.group):
                        break
                    if a.op is Op.BROADCAST:
                        ver[r][a.unit] = ver[a.root][a.unit]
                elif a.op is Op.FREE:
                    del ver[r][a.unit]
                elif a.op is Op.OPT:
                    assert s.placement.weight_owner[a.unit] == r
                    ver[r][a.unit] += 1
                elif a.op in (Op.F, Op.B):
                    assert ver[r][a.unit] == 0, f"rank {r}: {a} sees an updated weight"
                ptr[r] += 1
                moved = True
        assert moved, "symbolic run stuck"
    for u, o in enumerate(s.placement.weight_owner):
        assert ver[o][u] == 1


@pytest.mark.parametrize("d,g,n_loc", [(2, 2, 2), (2, 3, 1), (3, 2, 2)])
def test_weight_versions(d, g, n_loc):
    run_versions(build(d, g, n_loc))


@pytest.mark.parametrize("d,g", SHAPES)
@pytest.mark.parametrize("n_loc", [1, 3])
def test_bytes_equal_formula(d, g, n_loc):
    """Inter-node: (D-1)(2n(P-1)+1) remote weight fetches + nP(D-1) gradient sums (one per
    remote backward step, as the authors send them); intra-node:
    D(G-1)(2n(P-1)+1 + nP) shards on the broadcast/reduce chains (docs/weight_passing.md)."""
    p, w = d * g, 2.5
    s = build(d, g, n_loc)
    res = simulate(s, UniformCost(1.0, 2.0, weight_bytes=w), topology=Topology(p, ranks_per_node=g))
    assert res.comm_bytes == pytest.approx(tawpipe_bytes(p, n_loc * p, g, w))
    fetch = 2 * n_loc * (p - 1) + 1
    assert res.comm_bytes["inter_node"] == pytest.approx(w * ((d - 1) * fetch + n_loc * p * (d - 1)))
    assert res.comm_bytes["intra_node"] == pytest.approx(w * d * (g - 1) * (fetch + n_loc * p))
    sent = Counter(a.payload.value for _, _, a in s if a.op is Op.SEND)
    assert sent["weight"] == (d - 1) * fetch and sent["wgrad"] == n_loc * p * (d - 1)


@pytest.mark.parametrize("d,g,n_loc", [(2, 2, 2), (3, 2, 3)])
def test_gradient_sums_per_microbatch_step(d, g, n_loc):
    """Each backward step of a node on a remote shard sends its reduced sum to the owner right
    after the REDUCE (the authors' per-micro-batch sends), from the staging rank, rail-aligned."""
    s = build(d, g, n_loc)
    p = d * g
    for r, acts in enumerate(s.actions):
        for i, a in enumerate(acts):
            if a.op is Op.SEND and a.payload is Payload.WGRAD:
                assert acts[i - 1].op is Op.REDUCE and acts[i - 1].unit == a.unit and acts[i - 1].root == r
                assert r % g == a.peer % g and r // g != a.peer // g
    per_shard = Counter(a.unit for _, _, a in s if a.op is Op.SEND and a.payload is Payload.WGRAD)
    assert per_shard == {j: n_loc * (d - 1) for j in range(p)}


def test_inter_node_bytes_below_weipipe_ring():
    """Same 16 ranks in 2 nodes, 16 micro-batches: the ring crosses the node boundary on two
    links every turn; TawPipe moves rail-aligned shards only."""
    p, g, n = 16, 8, 16
    topo = Topology(p, ranks_per_node=g)
    taw = simulate(build_schedule("tawpipe", stages=p, microbatches=n, ranks_per_node=g),
                   UniformCost(1.0, 2.0), topology=topo).comm_bytes
    for ring in ("paper", "direct"):
        wei = simulate(build_schedule("weipipe-interleave", stages=p, microbatches=n, ring=ring),
                       UniformCost(1.0, 2.0), topology=topo).comm_bytes
        assert taw["inter_node"] < wei["inter_node"]
    assert sum(wei.values()) == sum(ring_message_count("interleave", p, n).values())


@pytest.mark.parametrize("d,g,n_loc", [(2, 3, 1), (2, 3, 2), (2, 8, 3), (3, 2, 1), (3, 2, 2), (3, 8, 2), (4, 2, 1)])
def test_lockstep_bubble_vs_paper(d, g, n_loc):
    """In lock-step steps, our schedule idles (n+1)(D-1) steps; the paper's formula, with N =
    all micro-batches, counts (D-1)+n: equal for D = 2 (its Fig. 3 setting), lower for D > 2."""
    p, n = d * g, n_loc * d * g
    t = tawpipe_lockstep_makespan(tawpipe_plan(TawPipeConfig(p, n, g)), UniformCost(1.0, 2.0))
    ours = 1 - 3 * p * n_loc / t
    assert ours == pytest.approx((n_loc + 1) * (d - 1) / (3 * p * n_loc + (n_loc + 1) * (d - 1)))
    paper = ((d - 1) * p + n) / ((3 * n + d - 1) * p + n)
    if d == 2:
        assert ours == pytest.approx(paper)
    else:
        assert ours > paper


def test_simulated_bubble():
    """Data-driven: with free links, D = 2 has no bubble (the stagger is not needed when
    weights arrive at once); slow inter-node links make it appear."""
    p, g = 6, 3
    s = build(2, g, 2)
    free = simulate(s, UniformCost(1.0, 2.0))
    assert free.bubble_ratio == pytest.approx(0.0)
    slow = [simulate(s, UniformCost(1.0, 2.0), links=Links(Topology(p, g), {"inter_node": LinkSpec(0.0, bw)}))
            .bubble_ratio for bw in (4.0, 1.0, 0.5)]
    assert 0 < slow[0] < slow[1] < slow[2]
