"""HelixPipe schedules: the notes' worked example, placement, transfers, rejection of unusable
micro-batch counts, and the simulator's bubble against the paper's Table 2."""
import dataclasses

import pytest

from pipert.cost.helix import HelixPartsCost, table2_bubble
from pipert.ir import Op, Payload
from pipert.ir.semantics import action_time
from pipert.schedules import build_schedule
from pipert.ir.passes import expand_folds
from pipert.schedules.helixpipe import RECOMPUTE_NAMES, helix_offset
from pipert.sim.simulate import simulate
from pipert.sim.engine import analyze
from pipert.sim.validate import validate

# /work/shared/notes/helixpipe.md section 2.2: p = 4, L = 4, F = 1, forward only.
# Pl = pre(l) (C(0) holds pre(0)), Cl = C(l), Al = A(l).
WORKED_EXAMPLE = """
S0: P0.m0 P0.m1 P0.m2 P0.m3 A0.m3 A1.m2 A2.m1 A3.m0 C4.m0 C4.m1 C4.m2 C4.m3
S1: A0.m0 C1.m0 C1.m1 C1.m2 C1.m3 A1.m3 A2.m2 A3.m1
S2: A0.m1 A1.m0 C2.m0 C2.m1 C2.m2 C2.m3 A2.m3 A3.m2
S3: A0.m2 A1.m1 A2.m0 C3.m0 C3.m1 C3.m2 C3.m3 A3.m3
"""


def _example_ops(line: str) -> list[tuple[int, tuple[int, ...]]]:
    out = []
    for tok in line.split(":")[1].split():
        part, mb = tok.split(".m")
        layer = int(part[1:])
        out.append((2 * layer + (1 if part[0] == "A" else 0), (int(mb),)))
    return out


def _forwards(s, r):
    return [(a.unit, a.mb) for a in s.actions[r] if a.op is Op.F]


def test_worked_example_action_for_action():
    s = build_schedule("helixpipe", stages=4, microbatches=4, chunks=1)
    lines = [x for x in WORKED_EXAMPLE.strip().splitlines()]
    for r, line in enumerate(lines):
        assert _forwards(s, r) == _example_ops(line), f"stage {r}"
        # backward: the exact reverse of the forward list
        bwd = [(a.unit, a.mb) for a in s.actions[r] if a.op is Op.B]
        assert bwd == list(reversed(_example_ops(line)))


def test_two_folds_pair_consecutive_microbatches():
    s = build_schedule("helixpipe-2fold", stages=4, microbatches=8, chunks=1, asynchronous=False)
    pairs = [mb for u, mb in _forwards(s, 0)]
    assert pairs[:4] == [(0, 1), (2, 3), (4, 5), (6, 7)]
    example = [(u, tuple(2 * m + f for f in range(2))) for u, (m,) in _example_ops(WORKED_EXAMPLE.split("\n")[2])]
    assert _forwards(s, 1) == example


def test_two_fold_defaults_are_the_papers():
    """helixpipe-2fold is by default the asynchronous two-fold (each fold pair's compute and
    message split per micro-batch, each send right after its own compute: expand_folds), with
    recomputation without attention and the loss in backward recorded for the cost models and
    train; the options opt out one by one, and the naive family keeps none of them."""
    paper = build_schedule("helixpipe-2fold", stages=4, microbatches=8, chunks=1)
    sync = build_schedule("helixpipe-2fold", stages=4, microbatches=8, chunks=1, asynchronous=False)
    assert paper.actions == expand_folds(sync).actions
    assert all(len(a.mb) <= 1 for acts in paper.actions for a in acts)
    for r, acts in enumerate(paper.actions):
        for i, a in enumerate(acts):
            if a.op is Op.SEND and a.payload is Payload.ACT:
                assert (acts[i - 1].op, acts[i - 1].unit, acts[i - 1].mb) == (Op.F, a.unit, a.mb)
    assert (paper.meta["asynchronous"], paper.meta["recompute"], paper.meta["loss_in_backward"]) == \
        (True, "no_attention", True)
    assert (sync.meta["asynchronous"], sync.meta["recompute"]) == (False, "no_attention")
    out = build_schedule("helixpipe-2fold", stages=4, microbatches=8, recompute="none", loss_in_backward=False).meta
    assert (out["recompute"], out["loss_in_backward"]) == ("none", False)
    naive = build_schedule("helixpipe", stages=4, microbatches=8).meta
    assert (naive["asynchronous"], naive["recompute"], naive["loss_in_backward"]) == (False, "none", False)
    with pytest.raises(ValueError, match="option recompute='some' unknown; allowed: none, no_attention, full"):
        build_schedule("helixpipe-2fold", stages=4, microbatches=8, recompute="some")


def test_recompute_names_are_the_models_modes():
    from pipert.models import RECOMPUTE_MODES
    assert RECOMPUTE_NAMES == tuple(RECOMPUTE_MODES)


@pytest.mark.parametrize("name,P,M,V,F", [
    ("helixpipe", 2, 2, 1, 1), ("helixpipe", 2, 6, 2, 1), ("helixpipe", 3, 6, 1, 1), ("helixpipe", 4, 8, 2, 1),
    ("helixpipe-2fold", 2, 4, 1, 2), ("helixpipe-2fold", 4, 16, 1, 2), ("helixpipe-2fold", 3, 18, 2, 3),
])
def test_placement_transfers_validate(name, P, M, V, F):
    """Fold structure and placement on the synchronous form; the default (asynchronous for
    helixpipe-2fold) validates as well."""
    validate(build_schedule(name, stages=P, microbatches=M, chunks=V, folds=F))
    s = build_schedule(name, stages=P, microbatches=M, chunks=V, folds=F, asynchronous=False)
    L = P * V
    assert s.num_units == 2 * L + 1 and s.meta["cut"] == "helix" and s.meta["folds"] == F
    validate(s)
    simulate(s, HelixPartsCost(L, 1.0, 3.0, 2.0))
    for r, i, a in s:
        if a.op in (Op.F, Op.B):
            l, is_attn = divmod(a.unit, 2)
            d = {helix_offset(m, P, F) for m in a.mb}
            assert len(a.mb) == F and len(d) == 1
            assert r == ((l + d.pop() + 1) % P if is_attn else l % P)
    # every stage that computes A(l) away from C(l)'s stage gets its weights once and returns one gradient
    for payload in (Payload.WEIGHT, Payload.WGRAD):
        sends = [(r, a.unit, a.peer) for r, _, a in s if a.op is Op.SEND and a.payload is payload]
        assert len(sends) == len(set(sends)) == L * (P - 1)
        assert all(u % 2 == 1 for _, u, _ in sends)
    assert s.count(Op.FREE) == L * (P - 1)


@pytest.mark.parametrize("name,P,M,folds,allowed", [
    ("helixpipe", 4, 6, 1, "4, 8"), ("helixpipe-2fold", 2, 6, 2, "4, 8"), ("helixpipe-2fold", 4, 4, 2, "8, 16"),
    ("helixpipe-2fold", 2, 8, 3, "6, 12"),
])
def test_unusable_microbatch_counts_are_rejected(name, P, M, folds, allowed):
    with pytest.raises(ValueError, match=f"multiple of {P * folds}.*M={M}.*allowed: {allowed}"):
        build_schedule(name, stages=P, microbatches=M, folds=folds)


def test_bad_stages_and_folds_rejected():
    with pytest.raises(ValueError, match="stages >= 2"):
        build_schedule("helixpipe", stages=1, microbatches=2)
    with pytest.raises(ValueError, match="folds must be a positive integer"):
        build_schedule("helixpipe", stages=2, microbatches=2, folds=0)


RATIOS = [(1.0, 3.0, 2.0), (1.0, 0.25, 2.0), (0.5, 12.0, 0.25)]   # (t_pre, t_attn, t_post)


@pytest.mark.parametrize("P,V", [(2, 1), (2, 3), (4, 1), (4, 2), (8, 1)])
@pytest.mark.parametrize("folds,recompute,variant", [(1, False, "helix"), (2, False, "helix-2fold"),
                                                     (2, True, "helix-2fold-recompute"), (1, True, None)])
def test_bubble_equals_table2_for_one_group(P, V, folds, recompute, variant):
    """Zero communication, backward = 2 x forward, C(0) = pre, C(L) = post: with one group of
    P*F micro-batches the idle time of every stage is exactly Table 2's bubble, whatever t_attn
    and L; naive FILO with recomputation (not in the table) is 4(p-1)(t_pre+t_post). Each further
    group adds the same bubble again (groups run one after the other)."""
    L = P * V
    for t_pre, t_attn, t_post in RATIOS:
        for groups in (1, 2):
            s = build_schedule("helixpipe", stages=P, microbatches=groups * P * folds, chunks=V, folds=folds)
            res = simulate(s, HelixPartsCost(L, t_pre, t_attn, t_post, recompute=recompute))
            table = (table2_bubble(variant, P, L, t_pre, t_attn, t_post) if variant
                     else 4 * (P - 1) * (t_pre + t_post))
            for idle in res.idle:
                assert idle == pytest.approx(groups * table, abs=1e-9)


def test_fold_option_decides_the_allowed_counts():
    s = build_schedule("helixpipe-2fold", stages=2, microbatches=2, folds=1)
    assert s.meta["folds"] == 1 and not s.meta["asynchronous"] and [a.mb for a in s.actions[0] if a.op is Op.F][:2] == [(0,), (1,)]
    with pytest.raises(ValueError, match="multiple of 4; got M=2"):
        build_schedule("helixpipe-2fold", stages=2, microbatches=2)


@pytest.mark.parametrize("op", [Op.F, Op.B])
def test_parts_cost_prices_a_piece_as_its_share_of_the_compute(op):
    """The engine applies sub-blocks: each quarter piece of a compute takes a quarter of the whole
    compute's time under HelixPartsCost, and the split program keeps the whole one's makespan."""
    P, L = 2, 2
    s = build_schedule("helixpipe-2fold", stages=P, microbatches=4, chunks=1, asynchronous=False)
    cost = HelixPartsCost(L, 1.0, 3.0, 2.0)
    r, i, a = next((r, i, a) for r, i, a in s if a.op is op and a.unit % 2 == 0 and 0 < a.unit < 2 * L)
    acts = [list(x) for x in s.actions]
    acts[r][i:i + 1] = [dataclasses.replace(a, sub=(k, 4)) for k in range(4)]
    split = s.with_actions(acts)
    g = analyze(split, cost).graph
    whole = action_time(cost.compute_time, a, r)
    assert whole > 0 and whole == pytest.approx(len(a.mb) * cost.compute_time(dataclasses.replace(a, mb=a.mb[:1]), r))
    assert [g.dur[g.node_of[r][i + k]] for k in range(4)] == [pytest.approx(whole / 4)] * 4
    assert simulate(split, cost).makespan == pytest.approx(simulate(s, cost).makespan)
