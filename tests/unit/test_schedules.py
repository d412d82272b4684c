"""Schedule generators and registry: structure, round trips, constraints and closed forms.

Closed forms are checked twice: against a compute-only critical-path timing written here
(zero-cost transfers make the schedule's time the longest path over compute dependencies
and per-rank order), and against ``pipert.sim.simulate`` with uniform costs.
"""
from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings, strategies as st

from pipert.ir import Action, Op, Schedule, parse_action
from pipert.schedules import PipelineConfig, available, build_schedule, family, register
from pipert.schedules.classic import group_sizes
from pipert.sim import validate

NAMES = ["gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-v"]
FAST = settings(max_examples=25, deadline=None)



@st.composite
def configs(draw, names=tuple(NAMES)):
    """(name, P, M, V) valid for the family ``name``."""
    name = draw(st.sampled_from(names))
    p = draw(st.integers(1, 8))
    if name == "interleaved-1f1b":
        m = draw(st.integers(1, 24))
        v = draw(st.integers(2, 4))
    else:
        m = draw(st.integers(1, 24))
        v = 2 if name == "zb-v" else 1
    return name, p, m, v


def _sim_api(attr: str):
    """pipert.sim.<attr>."""
    import pipert.sim
    return getattr(pipert.sim, attr)


def _build(name: str, p: int, m: int, v: int) -> Schedule:
    # zb-v: the handcrafted order, which the closed forms below describe; the orders zb-v may pick
    # instead (faster within the same modelled memory) are tested in test_zbv.py.
    opts = {"order": "handcrafted"} if name == "zb-v" else {}
    return build_schedule(name, stages=p, microbatches=m, chunks=v, **opts)


# --- an independent timing oracle ------------------------------------------------

def critical_path(s: Schedule, tf: float, tb: float = 0.0, td: float = 0.0, tw: float = 0.0) -> float:
    """Makespan at zero transfer cost: each compute starts when its rank is free and its
    inputs (F of u-1; F of u and B/D of u+1; D before W) are done."""
    dur = {Op.F: tf, Op.B: tb, Op.D: td, Op.W: tw, Op.OPT: 0.0}
    lists = [[a for a in acts if a.is_compute] for acts in s.actions]
    done: dict[tuple, float] = {}
    ptr, free, last = [0] * s.num_ranks, [0.0] * s.num_ranks, s.num_units - 1
    moved = True
    while moved:
        moved = False
        for r, acts in enumerate(lists):
            while ptr[r] < len(acts):
                a = acts[ptr[r]]
                m = a.mb[0] if a.mb else None
                deps = {Op.F: [("F", a.unit - 1, m)] if a.unit else [],
                        Op.W: [("G", a.unit, m)]}.get(a.op, [])
                if a.op in (Op.B, Op.D):
                    deps = [("F", a.unit, m)] + ([("G", a.unit + 1, m)] if a.unit < last else [])
                if any(d not in done for d in deps):
                    break
                free[r] = max([free[r]] + [done[d] for d in deps]) + dur[a.op]
                done[("F" if a.op is Op.F else "G" if a.op in (Op.B, Op.D) else a.op.value, a.unit, m)] = free[r]
                ptr[r] += 1
                moved = True
    assert all(p == len(acts) for p, acts in zip(ptr, lists)), "compute order deadlocks"
    return max(free)


def in_flight_peak(s: Schedule, closer: set[Op]) -> list[int]:
    """Per rank: max number of F whose stash is not yet released by an op in ``closer``."""
    out = []
    for acts in s.actions:
        n = peak = 0
        for a in acts:
            n += (a.op is Op.F) - (a.op in closer)
            peak = max(peak, n)
        out.append(peak)
    return out


# --- structure -----------------------------------------------------------------------

@FAST
@given(configs())
def test_every_unit_and_microbatch_has_its_passes_once(cfg):
    name, p, m, v = cfg
    s = _build(name, p, m, v)
    assert (s.num_ranks, s.num_units, s.num_microbatches) == (p, p * v, m)
    assert s.meta["family"] == name and s.meta["stages"] == p and s.meta["chunks"] == v
    split = family(name).split_backward
    assert s.meta["split_backward"] == split
    seen: Counter = Counter()
    pos: dict[tuple, tuple[int, int]] = {}
    for r, i, a in s:
        if a.op in (Op.F, Op.B, Op.D, Op.W):
            assert r == s.placement.rank(a.unit, a.mb[0]), f"{a} on rank {r}"
            for mb in a.mb:
                seen[(a.op, a.unit, mb)] += 1
                pos[(a.op, a.unit, mb)] = (r, i)
    backward = (Op.D, Op.W) if split else (Op.B,)
    for u in range(p * v):
        for mb in range(m):
            for op in (Op.F,) + backward:
                assert seen[(op, u, mb)] == 1, f"{op.value} u{u} m{mb} appears {seen[(op, u, mb)]} times"
            first_bwd = pos[(backward[0], u, mb)]
            assert pos[(Op.F, u, mb)] < first_bwd
            if split:
                assert first_bwd < pos[(Op.W, u, mb)]
    assert sum(seen.values()) == p * v * m * (1 + len(backward))
    opts = Counter(a.unit for r, _, a in s if a.op is Op.OPT and r == s.placement.weight_owner[a.unit])
    assert opts == Counter(range(p * v))


def _link_keys(s: Schedule, op: Op) -> dict[tuple[int, int], list]:
    """(src, dst) -> keys of the SENDs (op=SEND) or RECVs (op=RECV) on that link, in list order."""
    out: dict[tuple[int, int], list] = {}
    for r, _, a in s:
        if a.op is op:
            out.setdefault((r, a.peer) if op is Op.SEND else (a.peer, r), []).append(a.key)
    return out


@FAST
@given(configs())
def test_links_receive_in_send_order(cfg):
    """SEND/RECV match by FIFO position per directed link, so both ends list the same keys."""
    s = _build(*cfg)
    assert _link_keys(s, Op.SEND) == _link_keys(s, Op.RECV)


def test_receive_reordering_only_hoists_recvs():
    """Lowering alone leaves ZB-V's link 0->1 (act u0 and grad u2) out of send order."""
    from pipert.ir import lower
    from pipert.ir.passes import post_receives_early
    from pipert.schedules.registry import order_recvs_by_send
    s = build_schedule("zb-v", stages=2, microbatches=4)
    compute = [[a for a in acts if a.is_compute] for acts in s.actions]
    raw = lower(s.name, 2, 4, 4, s.placement, compute, s.meta, order_recvs=False)
    assert _link_keys(raw, Op.SEND) != _link_keys(raw, Op.RECV)
    fixed = order_recvs_by_send(raw)
    assert post_receives_early(fixed).actions == s.actions and order_recvs_by_send(s) is s
    for before, after in zip(raw.actions, fixed.actions):
        assert [a for a in before if a.op is not Op.RECV] == [a for a in after if a.op is not Op.RECV]
        def preceding(acts):   # RECV -> number of non-RECV actions before it
            n, out = 0, {}
            for a in acts:
                n += a.op is not Op.RECV
                if a.op is Op.RECV:
                    out[a] = n
            return out
        b, f = preceding(before), preceding(after)
        assert all(f[a] <= b[a] for a in b) and any(f[a] < b[a] for a in b) == (before != after)


@FAST
@given(configs())
def test_round_trips_json_and_text(cfg):
    s = _build(*cfg)
    assert Schedule.from_json(s.to_json()) == s
    for _, _, a in s:
        assert parse_action(str(a)) == a


@FAST
@given(configs())
def test_schedules_validate(cfg):
    _sim_api("validate")(_build(*cfg))


def test_placements():
    assert build_schedule("1f1b", stages=4, microbatches=4).placement.ranks == (0, 1, 2, 3)
    assert build_schedule("interleaved-1f1b", stages=3, microbatches=3, chunks=3).placement.ranks == \
        (0, 1, 2, 0, 1, 2, 0, 1, 2)
    s = build_schedule("zb-v", stages=4, microbatches=8)
    assert s.placement.ranks == (0, 1, 2, 3, 3, 2, 1, 0)
    assert s.units_owned(0) == [0, 7]


# --- memory --------------------------------------------------------------------------

@FAST
@given(configs())
def test_in_flight_peaks(cfg):
    name, p, m, v = cfg
    s = _build(name, p, m, v)
    if name == "gpipe":
        assert in_flight_peak(s, {Op.B}) == [m] * p
    elif name == "1f1b":
        assert in_flight_peak(s, {Op.B}) == [min(p - i, m) for i in range(p)]
    elif name == "zb-h1":   # D releases like 1F1B's B; deferred W parts never exceed rank 0's peak
        assert in_flight_peak(s, {Op.D}) == [min(p - i, m) for i in range(p)]
        assert max(in_flight_peak(s, {Op.W})) == min(p, m)
    elif name == "zb-v":    # 2 half-size chunks per stage: 2P chunk stashes = 1F1B's P stage stashes
        assert max(in_flight_peak(s, {Op.W})) == 2 * min(p, m)
    else:
        g = group_sizes(p, m)[0]
        assert in_flight_peak(s, {Op.B}) == [min(2 * (p - 1 - i) + (v - 1) * g + 1, m * v) for i in range(p)]


# --- closed forms (zero transfer cost) --------------------------------------------------

COSTS = st.tuples(st.integers(1, 4), st.integers(1, 4))


def _expected(name, p, m, v, tf, tb):
    """Makespans that hold exactly; None where no closed form is claimed."""
    if name in ("gpipe", "1f1b"):
        return (m + p - 1) * (tf + tb)
    if name == "interleaved-1f1b":  # at every M (torch's grouping), not only Megatron's M % P == 0
        return (m * v + p - 1) * (tf + tb) if m >= p else (p * v + m - 1) * (tf + tb)
    return None


def _zb_h1_expected(p, m, tf, td, tw):
    """Exact when tw <= min(tf, td): M(tf+td+tw) + (P-1)(tf+td-tw) for M >= P."""
    return (m + p - 1) * (tf + td) + max(1, m - p + 1) * tw


@FAST
@given(configs(("gpipe", "1f1b", "interleaved-1f1b")), COSTS)
def test_classic_makespans_reference(cfg, cost):
    name, p, m, v = cfg
    assert critical_path(_build(*cfg), *cost) == _expected(name, p, m, v, *cost)


@FAST
@given(st.integers(1, 8), st.integers(1, 24), st.tuples(st.integers(1, 4), st.integers(1, 4), st.integers(1, 4)))
def test_zb_h1_makespan_reference(p, m, cost):
    tf, td, tw = cost
    tw = min(tw, tf, td)
    s = build_schedule("zb-h1", stages=p, microbatches=m)
    got = critical_path(s, tf, td=td, tw=tw)
    assert got == _zb_h1_expected(p, m, tf, td, tw)
    if m >= p:
        assert got == m * (tf + td + tw) + (p - 1) * (tf + td - tw)


def test_zb_h1_formula_needs_tw_at_most_td():
    s = build_schedule("zb-h1", stages=4, microbatches=8)
    assert critical_path(s, 3, td=1, tw=2) > _zb_h1_expected(4, 8, 3, 1, 2)


@FAST
@given(st.integers(1, 8), st.integers(0, 10))
def test_zb_v_reaches_the_startup_bound(p, extra):
    """tf=td=tw=1, M >= 2P-1: makespan = 6M + P-1, i.e. the last rank's unavoidable
    (P-1)*tf start-up and nothing else."""
    m = 2 * p - 1 + extra
    assert critical_path(build_schedule("zb-v", stages=p, microbatches=m), 1, td=1, tw=1) == 6 * m + p - 1


@pytest.mark.parametrize("p,m,v", [(4, 8, 2), (4, 12, 3), (3, 5, 2), (5, 10, 2), (2, 2, 4)])
def test_interleaving_divides_the_bubble_by_v(p, m, v):
    """Same model, same M: interleaved (per-chunk tf, tb) vs 1F1B with V-times-larger stages."""
    tf, tb = 1, 2
    inter = critical_path(build_schedule("interleaved-1f1b", stages=p, microbatches=m, chunks=v), tf, tb)
    plain = critical_path(build_schedule("1f1b", stages=p, microbatches=m), v * tf, v * tb)
    work = m * v * (tf + tb)
    assert inter - work == (p - 1) * (tf + tb)
    assert plain - work == v * (p - 1) * (tf + tb)


def _simulate(s: Schedule, **times):
    """Simulate with uniform costs and free transfers (act_bytes=0 also keeps message
    buffers out of the memory peak, leaving only stashes)."""
    import pipert.cost.uniform as uniform
    return _sim_api("simulate")(s, uniform.UniformCost(act_bytes=0.0, **times))


@FAST
@given(configs(), COSTS)
def test_simulator_reproduces_closed_forms(cfg, cost):
    """Makespans as above; peak memory (stashes only, W-part kept until W) as counted above."""
    name, p, m, v = cfg
    s = _build(*cfg)
    tf, tb = cost
    if name == "zb-h1":
        td, tw = tb, min(tf, tb)
        res = _simulate(s, tf=tf, td=td, tw=tw, w_fraction=1.0)
        assert res.makespan == pytest.approx(_zb_h1_expected(p, m, tf, td, tw))
        assert max(res.peak_memory) == pytest.approx(min(p, m))
    elif name == "zb-v":
        res = _simulate(s, tf=tf, td=tf, tw=tf, w_fraction=1.0)
        assert res.makespan == pytest.approx(critical_path(s, tf, td=tf, tw=tf))
        if m >= 2 * p - 1:
            assert res.makespan == pytest.approx((6 * m + p - 1) * tf)
        assert max(res.peak_memory) == pytest.approx(2 * min(p, m))
    else:
        res = _simulate(s, tf=tf, tb=tb)
        assert res.makespan == pytest.approx(_expected(name, p, m, v, tf, tb))
        assert res.peak_memory == pytest.approx(in_flight_peak(s, {Op.B}))
        if name == "1f1b":
            assert res.peak_memory == pytest.approx([min(p - i, m) for i in range(p)])
        if name == "gpipe":
            assert res.peak_memory == pytest.approx([m] * p)
    assert res.bubble_ratio == pytest.approx(1 - sum(res.busy) / (p * res.makespan))


# --- registry and bad inputs ------------------------------------------------------------

def test_registry_lists_the_classic_families():
    assert set(NAMES) <= set(available())
    assert [family(n).split_backward for n in NAMES] == [False, False, False, True, True]
    assert build_schedule("interleaved-1f1b", stages=2, microbatches=4).meta["chunks"] == 2
    assert build_schedule("zb-v", stages=2, microbatches=4).num_units == 4


@pytest.mark.parametrize("kw,needle", [
    (dict(stages=0, microbatches=4), "stages must be a positive integer (got 0)"),
    (dict(stages=4, microbatches=-1), "microbatches must be a positive integer (got -1)"),
    (dict(stages=True, microbatches=4), "stages must be a positive integer (got True)"),
    (dict(stages=4, microbatches=4, chunks=0), "chunks must be a positive integer (got 0)"),
])
def test_non_positive_values_rejected(kw, needle):
    with pytest.raises(ValueError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        build_schedule("1f1b", **kw)


@pytest.mark.parametrize("name,kw,needles", [
    ("gpipe", dict(chunks=2), ["gpipe", "chunks == 1", "V=2"]),
    ("1f1b", dict(chunks=3), ["1f1b", "chunks == 1", "V=3"]),
    ("zb-h1", dict(chunks=2), ["zb-h1", "chunks == 1", "V=2"]),
    ("zb-v", dict(chunks=3), ["zb-v", "chunks == 2", "V=3"]),
    ("interleaved-1f1b", dict(chunks=1), ["interleaved-1f1b", "chunks >= 2", "V=1"]),
    ("1f1b", dict(flavour="x"), ["does not take option(s) flavour"]),
])
def test_bad_family_inputs_rejected(name, kw, needles):
    args = dict(stages=4, microbatches=8) | kw
    with pytest.raises(ValueError) as e:
        build_schedule(name, **args)
    for n in needles:
        assert n in str(e.value)


def test_unknown_name_lists_allowed():
    with pytest.raises(ValueError) as e:
        build_schedule("2f2b", stages=2, microbatches=2)
    assert "2f2b" in str(e.value) and all(n in str(e.value) for n in NAMES)


def test_register_is_open_and_guards_names(monkeypatch):
    from pipert.schedules import registry
    monkeypatch.setattr(registry, "_FAMILIES", dict(registry._FAMILIES))

    def one_rank(config: PipelineConfig, *, reverse: bool = False) -> Schedule:
        return build_schedule("gpipe", stages=config.stages, microbatches=config.microbatches)

    with pytest.raises(ValueError, match="already registered"):
        register("1f1b", one_rank, "dup")
    register("test-only", one_rank, "test family", replace=True)
    assert "test-only" in available()
    assert build_schedule("test-only", stages=2, microbatches=3, reverse=True).num_microbatches == 3
    with pytest.raises(ValueError, match="allowed: reverse"):
        build_schedule("test-only", stages=2, microbatches=3, bogus=1)


def test_generators_check_configs_themselves():
    from pipert.schedules import gpipe, zb_v
    with pytest.raises(ValueError, match="chunks == 2"):
        zb_v(PipelineConfig(2, 2, 1))
    with pytest.raises(ValueError, match="chunks == 1"):
        gpipe(PipelineConfig(2, 2, 2))
    assert [str(a) for a in gpipe(PipelineConfig(1, 2)).actions[0]] == ["F u0 m0", "F u0 m1", "B u0 m0",
                                                                          "B u0 m1", "OPT u0"]
    assert Action(Op.F, 0, 0) in gpipe(PipelineConfig(1, 1)).actions[0]


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 8), st.integers(1, 40), st.integers(2, 3))
def test_interleaved_builds_and_validates_every_microbatch_count(p, m, v):
    """torch's grouping (max(1, M // P) rounds, as equal as they can be) at any M: the program
    validates (no deadlock: receives on different links never wait for each other)."""
    s = build_schedule("interleaved-1f1b", stages=p, microbatches=m, chunks=v)
    sizes = group_sizes(p, m)
    assert sum(sizes) == m and max(sizes) - min(sizes) <= 1 and len(sizes) == max(1, m // p)
    validate(s)


_DETERMINISM = {"tawpipe": dict(ranks_per_node=2), "crosspipe-greedy": dict(num_dcs=2, dc_latency=2.0, dc_transfer=1.0),
                "crosspipe-wave": dict(num_dcs=2, dc_latency=2.0, dc_transfer=1.0),
                "crosspipe-optimal": dict(num_dcs=2, dc_latency=2.0, dc_transfer=1.0)}


@pytest.mark.parametrize("name", sorted(available()))
def test_every_generator_builds_the_same_program_twice(name):
    """Every rank may build its own program: a generator (CP-SAT included) must give the same
    program for the same input, or ranks disagree (the lost receive of a nondeterministic
    solve)."""
    stages = 4 if name == "tawpipe" else 2
    kw = dict(stages=stages, microbatches=4, **_DETERMINISM.get(name, {}))
    first = build_schedule(name, **kw)
    for _ in range(2):
        again = build_schedule(name, **kw)
        assert again.actions == first.actions and again.placement == first.placement


def test_interleaved_builds_every_microbatch_count_exhaustively_where_torch_does():
    """Every (P, M) of a small grid, including those Megatron's M % P == 0 rule refuses and
    torch builds (e.g. P=4, M=10): built, validated, every compute once."""
    for p in (2, 3, 4):
        for v in (2, 3):
            for m in range(1, 3 * p + 2):
                s = build_schedule("interleaved-1f1b", stages=p, microbatches=m, chunks=v)
                validate(s)
                assert (s.count(Op.F), s.count(Op.B)) == (p * v * m, p * v * m), (p, v, m)
