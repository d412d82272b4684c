"""WeiPipe schedules: validity, the notes' worked timelines, holdings, weight versions,
byte counts (closed forms, the paper's circle, the simulator) and bubbles."""
from __future__ import annotations

import math
from collections import Counter, defaultdict, deque

import pytest

from pipert.cost.topology import Links, LinkSpec, Topology
from pipert.cost.uniform import UniformCost
from pipert.ir import Op, Payload, Schedule
from pipert.schedules import available, build_schedule
from pipert.schedules.weipipe import (VARIANTS, WeiPipeConfig, lockstep_makespan, ring_message_count,
                                      weipipe_plan, weipipe_schedule)
from pipert.sim import simulate, validate

NAMES = [f"weipipe-{v}" for v in VARIANTS]


def configs():
    """(variant, P, n) covered by the validity tests."""
    for v in VARIANTS:
        for p in (2, 3, 4):
            for n in (1, 2, 3, 4):
                if v == "zb1" and (p % 2 or n % 2):
                    continue
                yield v, p, n


def sched(v: str, p: int, n: int, ring: str = "paper") -> Schedule:
    return build_schedule(f"weipipe-{v}", stages=p, microbatches=n * p, ring=ring)


def turn_of(s: Schedule) -> list[list[int]]:
    """turn_of[r][i]: the turn (slot) action i of rank r belongs to, from meta['turn_start']."""
    out = []
    for r, starts in enumerate(s.meta["turn_start"]):
        marks = sorted((i, t - 1) for t, i in enumerate(starts) if i >= 0)
        row, j = [], 0
        for i in range(len(s.actions[r])):
            while j + 1 < len(marks) and marks[j + 1][0] <= i:
                j += 1
            row.append(marks[j][1])
        out.append(row)
    return out


# --- validity and registry ----------------------------------------------------------------

def test_registered():
    for name in NAMES:
        assert name in available()


@pytest.mark.parametrize("v,p,n", list(configs()))
def test_validates(v, p, n):
    s = sched(v, p, n)
    rep = validate(s)
    assert rep.num_transfers == s.count(Op.SEND)
    assert s.meta["family"] == f"weipipe-{v}"
    assert Schedule.from_json(s.to_json()).actions == s.actions
    # activations never move: every message is a weight or a weight-gradient
    assert {a.payload for _, _, a in s if a.op in (Op.SEND, Op.RECV)} <= {Payload.WEIGHT, Payload.WGRAD}
    assert s.count(Op.OPT) == (n if v == "zb2" else 1) * p


@pytest.mark.parametrize("kw,match", [
    (dict(stages=4, microbatches=6), "multiple of stages"),
    (dict(stages=1, microbatches=4), "stages >= 2"),
])
def test_constraints(kw, match):
    with pytest.raises(ValueError, match=match):
        build_schedule("weipipe-interleave", **kw)


def test_zb1_needs_even():
    with pytest.raises(ValueError, match="even P and even N/P"):
        build_schedule("weipipe-zb1", stages=3, microbatches=6)
    with pytest.raises(ValueError, match="even P and even N/P"):
        build_schedule("weipipe-zb1", stages=4, microbatches=12)


# --- the notes' worked timelines ----------------------------------------------------------------

# weipipe.md §2.2, P=4, n=2: t -> work of w0..w3 ("-" idle); Fs(m)/Bj(m)
TABLE = """
F0(0)|-|-|-
F1(0)|F0(1)|-|-
F2(0)|F1(1)|F0(2)|-
F3(0)|F2(1)|F1(2)|F0(3)
F0(4)+B3(0)|F3(1)|F2(2)|F1(3)
F1(4)+B2(0)|F0(5)+B3(1)|F3(2)|F2(3)
F2(4)+B1(0)|F1(5)+B2(1)|F0(6)+B3(2)|F3(3)
F3(4)+B0(0)|F2(5)+B1(1)|F1(6)+B2(2)|F0(7)+B3(3)
B3(4)|F3(5)+B0(1)|F2(6)+B1(2)|F1(7)+B2(3)
B2(4)|B3(5)|F3(6)+B0(2)|F2(7)+B1(3)
B1(4)|B2(5)|B3(6)|F3(7)+B0(3)
B0(4)|B1(5)|B2(6)|B3(7)
-|B0(5)|B1(6)|B2(7)
-|-|B0(6)|B1(7)
-|-|-|B0(7)
"""


def _cell(text: str) -> set:
    if text == "-":
        return set()
    return {(w[0], int(w[1:w.index("(")]), int(w[w.index("(") + 1:-1])) for w in text.split("+")}


def _ops(plan, k, t, rename=None) -> set:
    rename = rename or {}
    return {(rename.get(a.op.value, a.op.value), a.unit, a.mb[0]) for a in plan.ops.get((k, t), ())}


def test_interleave_timeline_matches_notes():
    plan = weipipe_plan(WeiPipeConfig(4, 8, "interleave"))
    rows = [r.split("|") for r in TABLE.strip().splitlines()]
    assert plan.turns == len(rows) == (2 + 2) * 4 - 1
    for t, row in enumerate(rows):
        for k, cell in enumerate(row):
            assert _ops(plan, k, t) == _cell(cell), (k, t)


@pytest.mark.parametrize("ring", ["paper", "direct"])
def test_interleave_holdings_match_paper_circle(ring):
    """Worker k at turn t holds W^F_{(t-k) mod P} and W^B_{(k-t-1) mod P} (with D): direct,
    while they are in use; paper, from the owner's last turn on the copy's phase before its
    first use (turn 0 at the earliest), and D until it reaches its owner."""
    for p, n in ((3, 2), (4, 2), (5, 3)):
        plan = weipipe_plan(WeiPipeConfig(p, n * p, "interleave", ring=ring))
        paper = ring == "paper"
        for k in range(p):
            for t in range(plan.turns):
                h = plan.holdings(k, t)
                rho = t - k
                f = (t - k) % p
                f0 = max(0, f - (-f) % p) if paper else f
                assert h["F"] == ((f,) if f0 <= t <= f + n * p - 1 else ())
                b = (k - t - 1) % p
                b0 = 2 * p - 1 - b - ((-b) % p if paper else 0)
                b1 = (n + 2) * p - 2 - b
                assert h["B"] == ((b,) if b0 <= t <= b1 else ())
                d1 = b1 + ((b + 1) % p if paper else 0)
                assert h["D"] == ((b,) if 2 * p - 1 - b <= t <= d1 else ())
                if p <= rho < (n + 1) * p:        # steady and drain: B of chunk P-1-(rho mod P) uses W^B
                    assert (p - 1 - rho % p) in h["B"]
    # Fig. 1 caption: at t=5 worker 1 has W0, W3, D3 and receives W1, W2, D2 from worker 0
    plan = weipipe_plan(WeiPipeConfig(4, 8, "interleave", ring=ring))
    assert plan.holdings(1, 5) == {"F": (0,), "B": (3,), "D": (3,)}
    assert plan.holdings(1, 6) == {"F": (1,), "B": (2,), "D": (2,)}
    assert plan.holdings(0, 5) == {"F": (1,), "B": (2,), "D": (2,)}


def test_schedule_realizes_holdings():
    """At each compute turn the rank holds (received, not freed, or owned) every weight the
    paper's circle puts there, and nothing beyond this turn's and the next turn's copies."""
    for v, p, n in (("interleave", 4, 2), ("naive", 3, 2), ("zb1", 4, 2), ("zb2", 3, 2)):
        s, plan = sched(v, p, n), weipipe_plan(WeiPipeConfig(p, n * p, v))
        turns = turn_of(s)
        for r in range(p):
            held = set(s.units_owned(r))
            for i, a in enumerate(s.actions[r]):
                if a.op is Op.RECV and a.payload is Payload.WEIGHT:
                    held.add(a.unit)
                elif a.op is Op.FREE:
                    held.discard(a.unit)
                elif a.op in (Op.F, Op.B, Op.D):
                    t = turns[r][i]
                    now, nxt = plan.holdings(r, t), plan.holdings(r, t + 1)
                    need = set(now["F"]) | set(now["B"])
                    assert need <= held, (v, r, t)
                    assert held <= need | set(nxt["F"]) | set(nxt["B"]) | set(s.units_owned(r)), (v, r, t)


def test_zb1_worker0_matches_paper():
    """weipipe.md §2.3 (P=4): the paper's B pass is our D, its W pass our W."""
    plan = weipipe_plan(WeiPipeConfig(4, 16, "zb1"))
    ren = {"D": "B"}
    want = {4: "F0(4)+B3(0)", 5: "F1(4)+W3(0)", 6: "F2(4)+B2(0)", 7: "F3(4)+W2(0)",
            8: "B1(0)+B3(4)", 9: "W1(0)+W3(4)", 10: "B0(0)+B2(4)", 11: "W0(0)+W2(4)"}
    for t in range(4):
        assert _ops(plan, 0, t, ren) == {("F", t, 0)}
    for t, cell in want.items():
        assert _ops(plan, 0, t, ren) == _cell(cell), t
    assert {("F", 0, 8)} <= _ops(plan, 0, 12, ren)
    # the pair ring (W3,W1), (D3,D1), (W2,W0), (D2,D0) passes worker 0 at t = 8..11 (also at 4..7,
    # where only the upper member is in use: a copy circulates from its first use to its last)
    for t, (role, units) in zip(range(8, 12), (("B", (1, 3)), ("D", (1, 3)), ("B", (0, 2)), ("D", (0, 2)))):
        assert plan.holdings(0, t)[role] == units
    for k in range(4):                                   # worker k: the same, k turns later
        for t in range(plan.turns - k):
            assert _ops(plan, k, t + k, ren) == {(o, u, m + k) for o, u, m in _ops(plan, 0, t, ren)}


def test_zb2_rounds_and_handover():
    p, n = 4, 3
    plan = weipipe_plan(WeiPipeConfig(p, n * p, "zb2"))
    for k in range(p):
        for R in range(n):
            base, m = k + 3 * p * R, k + R * p
            for j in range(p):
                assert _ops(plan, k, base + j) == {("F", j, m)}
                assert _ops(plan, k, base + p + j) == {("D", p - 1 - j, m)}
                assert _ops(plan, k, base + 2 * p + j) == {("W", j, m)}
    ph = {(st.role, st.unit, st.version): st.phase for st in plan.streams}
    for j in range(p):   # D_j travels in phase with the forward copy W^F_j, not with W^B_j
        assert ph[("D", j, 0)] == ph[("F", j, 0)] == j
        assert ph[("B", j, 0)] == (-j - 1) % p
    s = sched("zb2", p, n)
    assert s.meta["update_every"] == p
    assert set(s.placement.weight_owner) == {p - 1}
    # worker P-1 updates W_0 in the turn it completes D_0 (3P-1) and sends it for worker 0's turn 3P
    turns = turn_of(s)
    opt0 = [turns[p - 1][i] for i, a in enumerate(s.actions[p - 1]) if a.op is Op.OPT and a.unit == 0]
    assert opt0 == [3 * p - 1 + 3 * p * R for R in range(n)]
    sends = [(turns[p - 1][i], a.tag) for i, a in enumerate(s.actions[p - 1])
             if a.op is Op.SEND and a.payload is Payload.WEIGHT and a.unit == 0]
    assert (3 * p - 1, 3 * p) in sends


# --- weight versions: the schedule against the update rule ---------------------------------------

def run_versions(s: Schedule) -> int:
    """Execute ``s`` symbolically: ranks hold weight versions, OPT bumps the owner's, SEND/RECV
    carry versions FIFO per link. A RECV is posted where it stands and completes when its message
    arrives; an action that reads or replaces unit u's weights waits for the rank's posted
    receives of u (docs/semantics.md). Every F/B/D of micro-batch m must see version
    m // update_every (0 without it). Returns the number of computes checked."""
    every = s.meta.get("update_every")
    ver = [{u: 0 for u in s.units_owned(r)} for r in range(s.num_ranks)]
    links: dict[tuple[int, int], deque] = defaultdict(deque)      # sent, not yet received
    posted: dict[tuple[int, int], deque] = defaultdict(deque)     # received-posted, not yet sent
    waiting = [defaultdict(int) for _ in range(s.num_ranks)]      # unit -> weight receives in flight
    ptr, checked, P = [0] * s.num_ranks, 0, s.num_ranks

    def deliver(r: int, a: Action, v) -> None:
        if a.payload is Payload.WEIGHT:
            ver[r][a.unit] = v
            waiting[r][a.unit] -= 1

    while any(ptr[r] < len(s.actions[r]) for r in range(P)):
        moved = False
        for r in range(P):
            while ptr[r] < len(s.actions[r]):
                a = s.actions[r][ptr[r]]
                if a.unit is not None and waiting[r][a.unit] and a.op is not Op.RECV:
                    break
                if a.op is Op.SEND:
                    v = ver[r][a.unit] if a.payload is Payload.WEIGHT else None
                    if posted[(r, a.peer)]:
                        deliver(a.peer, posted[(r, a.peer)].popleft(), v)
                    else:
                        links[(r, a.peer)].append(v)
                elif a.op is Op.RECV:
                    if a.payload is Payload.WEIGHT:
                        waiting[r][a.unit] += 1
                    if links[(a.peer, r)]:
                        deliver(r, a, links[(a.peer, r)].popleft())
                    else:
                        posted[(a.peer, r)].append(a)
                elif a.op is Op.FREE:
                    del ver[r][a.unit]
                elif a.op is Op.OPT:
                    ver[r][a.unit] += 1
                elif a.op in (Op.F, Op.B, Op.D):
                    want = a.mb[0] // every if every else 0
                    assert ver[r][a.unit] == want, f"rank {r}: {a} sees version {ver[r][a.unit]}, needs {want}"
                    checked += 1
                ptr[r] += 1
                moved = True
        assert moved, "symbolic run stuck"
    return checked


@pytest.mark.parametrize("v,p,n", [("zb2", 2, 3), ("zb2", 3, 2), ("zb2", 4, 3), ("interleave", 4, 2),
                                   ("naive", 3, 2), ("zb1", 4, 2)])
def test_weight_versions_follow_update_rule(v, p, n):
    s = sched(v, p, n)
    fb = sum(1 for _, _, a in s if a.op in (Op.F, Op.B, Op.D))
    assert run_versions(s) == fb
    if v == "zb2":   # N/P optimizer steps per unit, one per group of P micro-batches
        assert Counter(a.unit for _, _, a in s if a.op is Op.OPT) == {u: n for u in range(p)}


# --- bytes --------------------------------------------------------------------------------------

def paper_circle_messages(v: str, p: int, n: int, ring: str = "direct") -> int:
    """Weight messages from the paper's circle positions (weipipe.md §2.2, §2.3) and the
    documented rule: a worker receives a unit for turn t unless it owns it or held it at t-1.
    ``direct``: a copy is on the circle from its first use; ``paper``: from the owner's last
    turn on its phase before that (or turn 0, where the re-seed put it)."""
    held: dict[tuple[int, int], set] = defaultdict(set)

    def put(phase, t0, t1, unit):
        if ring == "paper":
            t0 = max(0, t0 - ((t0 - phase - unit) % p))
        for t in range(t0, t1 + 1):
            held[((t - phase) % p, t)].add(unit)

    for j in range(p):
        if v in ("interleave", "naive"):
            laps = n if v == "interleave" else 2 * n - 1
            put(j, j, j + laps * p - 1, j)
            put(-j - 1, 2 * p - 1 - j, 2 * p - 1 - j + laps * p - 1, j)
        else:   # zb1: forward copies, and pairs (W_{P-1-i}, W_{P/2-1-i}) at circle index 2i
            h = p // 2
            put(j, j, j + (3 * n // 2 - 1) * p - 1, j)
            i = p - 1 - j if j >= h else h - 1 - j
            first = (p if j >= h else 2 * p) + 2 * i
            last = p - 1 + (3 * n // 2 - (1 if j >= h else 0)) * p + 2 * i
            put(2 * i, first, last, j)
    return sum(1 for (k, t), us in held.items() for u in us if u != k and u not in held.get((k, t - 1), ()))


def _sends(s: Schedule) -> Counter:
    return Counter(a.payload.value for _, _, a in s if a.op is Op.SEND)


@pytest.mark.parametrize("v,p,n", [(v, p, n) for v, p, n in configs() if v != "zb2"])
def test_weight_messages_equal_paper_circle(v, p, n):
    for ring in ("paper", "direct"):
        assert _sends(sched(v, p, n, ring))["weight"] == paper_circle_messages(v, p, n, ring), ring


@pytest.mark.parametrize("v,p,n", [(v, p, n) for v, p, n in configs() if v != "zb1"])
def test_message_counts_closed_form(v, p, n):
    assert dict(_sends(sched(v, p, n, "direct"))) == ring_message_count(v, p, n * p)


def test_hand_count_interleave_p4_n2():
    """docs/weight_passing.md works this case by hand: 21 F + 15 B weight messages, 31 gradients."""
    assert ring_message_count("interleave", 4, 8) == {"weight": 36, "wgrad": 31}


def test_per_turn_sends():
    """A ring link carries at most 3 chunks per turn (2 W + 1 D; WZB1: 1 W + a pair), as the
    paper says; WZB2 at most 1 (each copy moves only while in use; the paper says 2). Seeds
    and finished gradients go straight between owner and worker: at most one more."""
    for v, p, n, cap in (("interleave", 4, 4, 3), ("naive", 4, 2, 3), ("zb1", 4, 4, 3), ("zb2", 4, 3, 1),
                         ("interleave", 5, 2, 3), ("naive", 3, 2, 3)):
        s = sched(v, p, n, "direct")
        turns = turn_of(s)
        ring = Counter((r, turns[r][i]) for r, i, a in s if a.op is Op.SEND and a.peer == (r + 1) % p)
        per = Counter((r, turns[r][i]) for r, i, a in s if a.op is Op.SEND)
        assert max(ring.values()) == cap, v
        assert max(per.values()) <= cap + 1, v
    # steady state of interleave, P=4: a lap of P turns moves 3P chunks minus the held-over and own units
    s = sched("interleave", 4, 4, "direct")
    turns = turn_of(s)
    for r in range(4):
        lap = sum(1 for i, a in enumerate(s.actions[r]) if a.op is Op.RECV and 8 + r <= turns[r][i] < 12 + r)
        assert lap == 3 * 4 - 2 - 4 + sum(1 for u in (0, 3, 2, 1) if u == r), r


@pytest.mark.parametrize("v,p,n", [("interleave", 4, 2), ("naive", 4, 2), ("zb1", 4, 2), ("zb2", 4, 2)])
@pytest.mark.parametrize("ring", ["paper", "direct"])
def test_simulator_bytes(v, p, n, ring):
    s, w = sched(v, p, n, ring), 3.0
    topo = Topology(p, ranks_per_node=2)
    res = simulate(s, UniformCost(1.0, 2.0, weight_bytes=w), topology=topo)
    by_class: Counter = Counter()
    sent = [0.0] * p
    for r, _, a in s:
        if a.op is Op.SEND:
            by_class[topo.link_class(r, a.peer)] += w
            sent[r] += w
    assert res.comm_bytes == {"local": 0.0, "intra_node": by_class["intra_node"],
                              "inter_node": by_class["inter_node"], "inter_dc": 0.0}
    assert sum(sent) == sum(res.comm_bytes.values()) == w * sum(_sends(s).values())
    if v != "zb1" and ring == "direct":
        assert sum(res.comm_bytes.values()) == w * sum(ring_message_count(v, p, n * p).values())


# --- bubbles ------------------------------------------------------------------------------------

@pytest.mark.parametrize("p,n,tf,tb", [(2, 2, 1, 2), (3, 2, 1, 2), (4, 3, 1, 2), (4, 2, 1, 1), (3, 4, 2, 3)])
def test_lockstep_interleave_equals_1f1b(p, n, tf, tb):
    """The paper's claim (same bubble as 1F1B) holds in its lock-step model for n >= 2."""
    cost = UniformCost(tf, tb)
    t = lockstep_makespan(weipipe_plan(WeiPipeConfig(p, n * p, "interleave")), cost)
    one = simulate(build_schedule("1f1b", stages=p, microbatches=n * p), cost)
    assert t == pytest.approx(one.makespan) == pytest.approx((n * p + p - 1) * (tf + tb))
    assert 1 - n * p * (tf + tb) / t == pytest.approx((p - 1) / (n * p + p - 1))


def test_lockstep_interleave_n1_differs():
    """n = 1 has no F+B turn: P forward turns, then B-only turns while others still forward."""
    p, tf, tb = 4, 1.0, 2.0
    t = lockstep_makespan(weipipe_plan(WeiPipeConfig(p, p, "interleave")), UniformCost(tf, tb))
    assert t == p * tf + (2 * p - 1) * tb < (2 * p - 1) * (tf + tb)


@pytest.mark.parametrize("v", VARIANTS)
def test_simulated_bubble_is_hop_latency(v):
    """The direct ring: weights do not wait for compute, so the simulated warm-up costs P-1
    hop latencies (plus one for the last gradient to reach its owner), not P-1 turns."""
    p, n = 4, 2
    s = sched(v, p, n, "direct")
    busy = n * p * 3.0
    for c in (0.0, 0.25, 0.5):
        links = Links(Topology(p), {"intra_node": LinkSpec(c, math.inf)})
        res = simulate(s, UniformCost(1.0, 2.0), links=links)
        assert res.makespan == pytest.approx(busy + p * c if c else busy)
        assert res.bubble_ratio < (p - 1) / (n * p + p - 1)
