"""The validator: accepts valid schedules, rejects each broken rule with its reason code."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipert.cost import UniformCost
from pipert.ir import Action, Op, Payload, Placement, Schedule, add_optimizer_steps, lower
from pipert.sim import ScheduleError, validate
from pipert.sim import REASONS
from unit_testutil import gpipe, one_f_one_b_order


def F(u: int, m: int, **kw) -> Action:
    return Action(Op.F, unit=u, mb=(m,), **kw)


def Bk(u: int, m: int, op: Op = Op.B, **kw) -> Action:
    return Action(op, unit=u, mb=(m,), **kw)


def one_f_one_b(P: int, M: int, opt: bool = False, split: bool = False) -> Schedule:
    """1F1B; ``split`` replaces each B by D and defers all W to the end of the rank."""
    comp = one_f_one_b_order(P, M)
    if split:
        comp = [[Bk(i, a.mb[0], Op.D) if a.op is Op.B else a for a in acts] + [Bk(i, m, Op.W) for m in range(M)]
                for i, acts in enumerate(comp)]
    pl = Placement.by_unit(list(range(P)))
    if opt:
        comp = add_optimizer_steps(comp, pl)
    return lower("1f1b", P, P, M, pl, comp)


def edit(s: Schedule, rank: int, fn) -> Schedule:
    acts = [list(a) for a in s.actions]
    acts[rank] = fn(list(acts[rank]))
    return s.with_actions(acts)


def index_of(s: Schedule, rank: int, text: str) -> int:
    return [str(a) for a in s.actions[rank]].index(text)


def reason_of(s: Schedule, **kw) -> str:
    with pytest.raises(ScheduleError) as e:
        validate(s, **kw)
    assert e.value.reason in REASONS
    return e.value.reason


# --- valid schedules ---------------------------------------------------------------------
@pytest.mark.parametrize("P,M", [(1, 1), (1, 3), (2, 1), (3, 5), (4, 8), (5, 3)])
def test_accepts_classic_schedules(P: int, M: int) -> None:
    for s in (gpipe(P, M), one_f_one_b(P, M), one_f_one_b(P, M, opt=True), one_f_one_b(P, M, split=True)):
        rep = validate(s)
        assert rep.num_actions == s.num_actions()
        assert rep.num_transfers == 2 * (P - 1) * M
        assert validate(s, all_errors=True) == []


def test_report_peak_memory_counts_stashes_and_buffers() -> None:
    s = one_f_one_b(4, 8)
    assert validate(s, UniformCost(tf=1, tb=2, act_bytes=0)).peak_memory == [4, 3, 2, 1]
    # right after its 4th F, rank 0 holds 4 stashes, that F's output (until its SEND) and the
    # buffer of the first gradient (its receive is posted one compute before its B)
    assert validate(s).peak_memory[0] == 6


def test_accepts_folded_sub_blocked_and_waited_actions() -> None:
    comp = [[Action(Op.F, unit=u, mb=(0, 1)), Action(Op.B, unit=u, mb=(0, 1))] for u in range(2)]
    s = lower("fold", 2, 2, 2, Placement.by_unit([0, 1]), comp)
    validate(s)
    # F u0 split into two sub-blocks that run in order; its output exists after the last
    pieces = [Action(Op.F, unit=0, mb=(0, 1), sub=(k, 2)) for k in range(2)]
    f = index_of(s, 0, "F u0 m0,1")
    s = edit(s, 0, lambda a: a[:f] + pieces + a[f + 1:])
    assert validate(s).makespan == 1 + 1 + 2 + 4 + 4  # a fold of 2 takes twice as long
    assert reason_of(edit(s, 0, lambda a: a[:f] + [a[f + 1], a[f]] + a[f + 2:])) == "sub_block"
    # an explicit WAIT for the receive before its consumer
    i = index_of(s, 1, "RECV act u0 m0,1 <-0")
    waited = edit(s, 1, lambda a: a[:i + 1] + [Action(Op.WAIT, waits=Op.RECV, payload=Payload.ACT, unit=0,
                                                       mb=(0, 1), peer=0)] + a[i + 1:])
    validate(waited)


def test_accepts_weight_passing_with_optimizer() -> None:
    pl = Placement.by_microbatch([0, 1], [0, 1])
    comp = [[F(0, r), F(1, r), Bk(1, r), Bk(0, r)] for r in range(2)]
    s = lower("wp", 2, 2, 2, pl, add_optimizer_steps(comp, pl), weights=True)
    validate(s)
    # without the returned weight gradient, OPT u0 lacks micro-batch 1
    i = index_of(s, 0, "RECV wgrad u0 <-1")
    j = index_of(s, 1, "SEND wgrad u0 ->0")
    broken = edit(edit(s, 0, lambda a: a[:i] + a[i + 1:]), 1, lambda a: a[:j] + a[j + 1:])
    with pytest.raises(ScheduleError) as e:
        validate(broken)
    assert e.value.reason == "wgrad" and "lacks" in str(e.value) and "1" in str(e.value)


# --- each rule ---------------------------------------------------------------------------
def test_missing_input() -> None:
    s = one_f_one_b(2, 2)
    i, j = index_of(s, 0, "SEND act u0 m1 ->1"), index_of(s, 1, "RECV act u0 m1 <-0")
    broken = edit(edit(s, 0, lambda a: a[:i] + a[i + 1:]), 1, lambda a: a[:j] + a[j + 1:])
    with pytest.raises(ScheduleError) as e:
        validate(broken)
    err = e.value
    assert (err.reason, err.rank, err.action) == ("missing_input", 1, F(1, 1))
    assert "act u0 m1" in str(err) and "never produced" in str(err)


def test_input_produced_later_message() -> None:
    s = one_f_one_b(2, 2)
    i = index_of(s, 1, "RECV act u0 m0 <-0")
    swapped = edit(s, 1, lambda a: a[:i] + [a[i + 1], a[i]] + a[i + 2:])
    with pytest.raises(ScheduleError) as e:
        validate(swapped)
    assert e.value.reason == "input_later"
    assert str(e.value) == f"rank 1, action {i} (F u1 m0): input act u0 m0 is produced later, at action {i + 1}"
    assert (e.value.rank, e.value.index) == (1, i)


def test_duplicate_forward() -> None:
    s = edit(gpipe(2, 2), 0, lambda a: a + [F(0, 0)])
    assert reason_of(s) == "duplicate"


def test_missing_backward() -> None:
    s = one_f_one_b(2, 2)
    i = index_of(s, 0, "B u0 m1")
    with pytest.raises(ScheduleError) as e:
        validate(edit(s, 0, lambda a: a[:i] + a[i + 1:]))
    assert e.value.reason == "missing_compute" and e.value.action == F(0, 1)


def test_missing_w_after_d() -> None:
    s = one_f_one_b(2, 2, split=True)
    i = index_of(s, 1, "W u1 m0")
    assert reason_of(edit(s, 1, lambda a: a[:i] + a[i + 1:])) == "missing_compute"
    # W before its D: the weight-grad half of the stash does not exist yet
    d = index_of(s, 1, "D u1 m1")
    assert reason_of(edit(s, 1, lambda a: a[:d] + [Bk(1, 1, Op.W)] + [x for x in a[d:] if x != Bk(1, 1, Op.W)])) \
        == "input_later"


def test_dropped_recv_is_unmatched_send() -> None:
    s = one_f_one_b(3, 4)
    i = index_of(s, 2, "RECV act u1 m3 <-1")
    with pytest.raises(ScheduleError) as e:
        validate(edit(s, 2, lambda a: a[:i] + a[i + 1:]))
    assert (e.value.reason, e.value.rank, e.value.action.op) == ("unmatched_send", 1, Op.SEND)
    # dropping an earlier RECV shifts the FIFO: mismatches follow, but the lowest (rank, index) error is first
    j = index_of(s, 2, "RECV act u1 m0 <-1")
    errors = validate(edit(s, 2, lambda a: a[:j] + a[j + 1:]), all_errors=True)
    reasons = {e.reason for e in errors}
    assert errors[0].reason == "unmatched_send" and "mismatch" in reasons
    assert [e.sort_key for e in errors] == sorted(e.sort_key for e in errors)


def test_dropped_send_is_unmatched_recv() -> None:
    s = one_f_one_b(2, 3)
    i = index_of(s, 0, "SEND act u0 m2 ->1")
    errors = validate(edit(s, 0, lambda a: a[:i] + a[i + 1:]), all_errors=True)
    assert [e.reason for e in errors] == ["unmatched_recv"]


def test_mismatched_payload() -> None:
    s = one_f_one_b(2, 2)
    i = index_of(s, 1, "RECV act u0 m0 <-0")
    bad = edit(s, 1, lambda a: a[:i] + [Action(Op.RECV, unit=0, mb=(0,), payload=Payload.ACT, peer=0, tag=3)]
               + a[i + 1:])
    with pytest.raises(ScheduleError) as e:
        validate(bad)
    assert (e.value.reason, e.value.rank, e.value.index) == ("mismatch", 1, i)
    assert "SEND act u0 m0 ->1" in str(e.value)


def test_cross_rank_cycle_is_deadlock() -> None:
    # rank 0 runs B of m0 before F of m1; rank 1 runs both F before any B
    comp = [[F(0, 0), Bk(0, 0), F(0, 1), Bk(0, 1)], [F(1, 0), F(1, 1), Bk(1, 0), Bk(1, 1)]]
    s = lower("cycle", 2, 2, 2, Placement.by_unit([0, 1]), comp)
    with pytest.raises(ScheduleError) as e:
        validate(s)
    err = e.value
    assert err.reason == "deadlock" and "waits for" in str(err)
    assert err.rank == 0 and err.action is not None
    # the cycle passes through rank 1's forward of m1
    assert "F u1 m1 (rank 1" in str(err)


def test_memory_limit() -> None:
    s = one_f_one_b(4, 8)
    cost = UniformCost(tf=1, tb=2, act_bytes=0)
    validate(s, cost, memory_limit=4)
    with pytest.raises(ScheduleError) as e:
        validate(s, cost, memory_limit=3)
    err = e.value
    assert (err.reason, err.rank, err.action) == ("memory", 0, F(0, 3))
    errors = validate(s, cost, memory_limit=[4, 2, 2, 1], all_errors=True)
    assert [(x.reason, x.rank) for x in errors] == [("memory", 1)]


def test_opt_before_last_contribution() -> None:
    s = one_f_one_b(2, 3, opt=True)
    i = index_of(s, 0, "OPT u0")
    early = edit(s, 0, lambda a: a[:i - 1] + [a[i], a[i - 1]] + a[i + 1:])
    with pytest.raises(ScheduleError) as e:
        validate(early)
    assert e.value.reason == "wgrad" and "lacks" in str(e.value)
    # OPT off the owner
    stray = edit(s, 1, lambda a: a + [Action(Op.OPT, unit=0)])
    assert reason_of(stray) == "wgrad"


def test_collective_missing_on_one_member() -> None:
    s = one_f_one_b(2, 2, opt=True)
    ar = Action(Op.ALLREDUCE, unit=0, payload=Payload.WGRAD, group=(0, 1))
    with pytest.raises(ScheduleError) as e:
        validate(edit(s, 0, lambda a: a[:-1] + [ar, a[-1]]))
    assert e.value.reason == "collective" and "[1]" in str(e.value)


def test_bad_peer_wait_and_sub_block() -> None:
    s = gpipe(2, 1)
    assert reason_of(edit(s, 0, lambda a: a + [Action(Op.SEND, unit=0, mb=(0,), payload=Payload.ACT, peer=5)])) \
        == "bad_peer"
    w = Action(Op.WAIT, waits=Op.RECV, payload=Payload.ACT, unit=0, mb=(0,), peer=1)
    assert reason_of(edit(s, 1, lambda a: [w] + a)) == "wait"
    comp = [[Action(Op.F, unit=0, mb=(0,), sub=(0, 2)), Bk(0, 0)]]
    assert reason_of(lower("sub", 1, 1, 1, Placement.by_unit([0]), comp)) == "sub_block"


# --- property: mutations never crash or hang ---------------------------------------------
_BASE = one_f_one_b(3, 4, opt=True)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_mutations_validate_or_raise_schedule_error(data: st.DataObject) -> None:
    acts = [list(a) for a in _BASE.actions]
    for _ in range(data.draw(st.integers(1, 3))):
        r = data.draw(st.integers(0, 2))
        if data.draw(st.booleans()):
            recvs = [i for i, a in enumerate(acts[r]) if a.op is Op.RECV]
            if recvs:
                del acts[r][data.draw(st.sampled_from(recvs))]
        else:
            comp = [i for i, a in enumerate(acts[r]) if a.is_compute]
            if len(comp) >= 2:
                k = data.draw(st.integers(0, len(comp) - 2))
                i, j = comp[k], comp[k + 1]
                acts[r][i], acts[r][j] = acts[r][j], acts[r][i]
    s = _BASE.with_actions(acts)
    try:
        validate(s)
    except ScheduleError as e:
        assert e.reason in REASONS and 0 <= e.rank < 3
    errors = validate(s, all_errors=True)
    assert all(isinstance(e, ScheduleError) for e in errors)


def test_a_program_sent_to_another_process_keeps_working_lookups(tmp_path):
    """Actions cache their hash, which depends on the process's string-hash seed: a program
    pickled into a process with another seed (spawned ranks) must hash its actions anew, or
    lookups of equal actions miss (a WAIT would not find its SEND)."""
    import os
    import pickle
    import subprocess
    import sys

    from pipert.schedules import build_schedule
    s = build_schedule("weipipe-naive", stages=4, microbatches=8)
    assert any(a.op.value == "WAIT" for _, _, a in s)
    path = tmp_path / "program.pkl"
    path.write_bytes(pickle.dumps(s))
    code = ("import pickle, sys; from pipert.sim import validate; from pipert.ir import Action; "
            "s = pickle.load(open(sys.argv[1], 'rb')); validate(s); "
            "a = s.actions[0][0]; b = Action(a.op, a.unit, a.mb, a.payload, a.peer, a.group, a.root, a.tag, a.sub, "
            "a.waits); assert hash(a) == hash(b) and {a: 1}[b] == 1")
    for seed in ("1", "2"):
        out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True,
                             env={**os.environ, "PYTHONHASHSEED": seed})
        assert out.returncode == 0, out.stderr[-2000:]
