"""PipeMesh planner: the recomputation DP against brute force, the planner against an exhaustive
search over (q, recomputation set), the equations' special cases and the budget errors."""
from __future__ import annotations

from itertools import product

import pytest
from hypothesis import given, settings, strategies as st

from pipert.planner import (Components, OpCost, plan, plan_fixed, queue_plan, recompute_brute, recompute_dp)
from pipert.planner.pipemesh import (enqueue_sequence, exposed_dp, iteration_time, live_passes, megatron_plan,
                                     split_even, state_memory, zero3_enabled, zero3_saves_memory)
from pipert.planner.search import candidate_queues
from pipert.schedules import build_schedule
from pipert.schedules.pipemesh import peak_live_passes

ops_st = st.lists(st.builds(OpCost, name=st.just("op"), size=st.integers(0, 6),
                            time=st.floats(0, 5, allow_nan=False)), min_size=0, max_size=8)


@settings(max_examples=150, deadline=None)
@given(ops=ops_st, values=st.lists(st.floats(0, 50, allow_nan=False), min_size=1, max_size=60),
       j=st.integers(0, 40))
def test_recompute_dp_equals_brute_force(ops, values, j):
    """Any dp_time that is defined on 0..len(values)-1 and undefined above (upward-closed)."""
    def dp_time(o):
        return values[o] if o < len(values) else None

    dp, brute = recompute_dp(ops, dp_time, j), recompute_brute(ops, dp_time, j)
    assert (dp is None) == (brute is None)
    if dp is None:
        return
    assert dp.objective == pytest.approx(brute.objective, rel=1e-12, abs=1e-9)
    # the returned set really has that cost
    stored = sum(o.size for o, r in zip(ops, dp.recomputed) if not r)
    rt = sum(o.time for o, r in zip(ops, dp.recomputed) if r)
    assert stored == dp.stored and dp_time(stored) + j * rt == pytest.approx(dp.objective, rel=1e-12, abs=1e-9)


comp_st = st.builds(
    lambda P, D, M, extra, fwd, bwd, dpc, ppc, psi: Components(P, D, M, P + extra, fwd, 2 * fwd * bwd, dpc, ppc, psi),
    P=st.integers(1, 4), D=st.integers(2, 4), M=st.integers(1, 6), extra=st.integers(0, 9),
    fwd=st.floats(0.1, 3), bwd=st.floats(0.5, 1.5), dpc=st.floats(0, 20), ppc=st.floats(0, 1),
    psi=st.integers(0, 1000))


def _exhaustive(c, ops, budget, base):
    """min over every valid q and every recomputation subset of T_iter with M_sum < budget."""
    best = None
    for qp in candidate_queues(c):
        state = sum(state_memory(c, qp.sharding).values())
        for rec in product((False, True), repeat=len(ops)):
            stored = sum(o.size for o, r in zip(ops, rec) if not r)
            if state + live_passes(qp.q, c.chunks, c.stages, c.microbatches) * (base + stored) >= budget:
                continue
            t = iteration_time(c, qp.dp_crit, sum(o.time for o, r in zip(ops, rec) if r))["total"]
            best = t if best is None else min(best, t)
    return best


@settings(max_examples=120, deadline=None)
@given(c=comp_st, ops=st.lists(st.builds(OpCost, name=st.sampled_from("abc"), size=st.integers(0, 40),
                                         time=st.floats(0, 1)), max_size=6),
       budget=st.floats(100, 20000), base=st.integers(0, 30))
def test_planner_equals_exhaustive_search(c, ops, budget, base):
    want = _exhaustive(c, ops, budget, base)
    if want is None:
        with pytest.raises(ValueError, match="memory budget .* is below the minimum"):
            plan(c, ops, budget, base)
        return
    p = plan(c, ops, budget, base)
    assert p.time["total"] == pytest.approx(want, rel=1e-12)
    assert p.memory["total"] < budget


def test_impossible_budget_names_budget_and_minimum():
    c = Components(2, 2, 2, 4, 1.0, 2.0, 3.0, 0.1, 1e9)
    ops = [OpCost("gelu", 1 << 20, 0.01)]
    need = min(sum(state_memory(c, qp.sharding).values()) for qp in candidate_queues(c))
    with pytest.raises(ValueError) as e:
        plan(c, ops, budget=need / 2, base_activation=0)
    msg = str(e.value)
    assert f"{need / 2 / (1 << 30):.3f} GiB" in msg and f"{need / (1 << 30):.3f} GiB" in msg
    with pytest.raises(ValueError, match="budget=0"):
        plan(c, ops, budget=0)


def test_sequences_and_warmup():
    assert split_even(10, 3) == (3, 3, 4)
    assert enqueue_sequence(12, 6, 3) == (6, 6)
    assert enqueue_sequence(13, 6, 3) == (6, 3, 4)
    with pytest.raises(ValueError, match="smaller than P=4"):
        enqueue_sequence(13, 6, 4)         # (6, 3, 4): a group below P
    with pytest.raises(ValueError, match=r"\[P, B\] = \[3, 12\]"):
        enqueue_sequence(12, 2, 3)
    assert live_passes(6, 6, 3, 12, 1) == 6 * 5 + 4 + 1
    assert live_passes(6, 6, 3, 12, 3) == 6 * 5 + 1
    assert live_passes(4, 2, 4, 4, 1) == 8          # all M B passes: capped


@settings(max_examples=40, deadline=None)
@given(c=comp_st, data=st.data())
def test_planner_sequences_run_as_the_pipemesh_schedule(c, data):
    """Every sequence pair the planner offers builds and validates as the pipemesh schedule, and
    its activation peak is the generator's."""
    qps = candidate_queues(c)
    qp = data.draw(st.sampled_from(qps))
    s = build_schedule("pipemesh", stages=c.stages, microbatches=c.microbatches, chunks=c.chunks,
                       enqueue=qp.enqueue, dequeue=qp.dequeue)
    assert s.meta["enqueue"] == list(qp.enqueue)
    for i in range(1, c.stages + 1):
        assert live_passes(qp.q, c.chunks, c.stages, c.microbatches, i) == \
            peak_live_passes(c.stages, c.chunks, c.microbatches, qp.q, i - 1)


def test_eq2_windows_and_megatron_special_case():
    c = Components(stages=4, dp=3, chunks=2, microbatches=8, fwd=1.0, bwd=2.0, dp_comm=10.0, params=100)
    mt = megatron_plan(c)
    assert mt.enqueue == mt.dequeue == (4, 4)
    # D_o = 2 C_DP + (M-1)(H(C_DP, P fwd) + H(C_DP, P bwd)) = 20 + 6 + 2; ZeRO-1: no other term
    assert mt.exposed == {"D_o": 28.0, "D_g": 0.0, "D_p_fwd": 0.0, "D_p_bwd": 0.0}
    with pytest.raises(ValueError, match="multiple of P=4"):
        megatron_plan(Components(4, 3, 2, 10, 1.0, 2.0, 10.0))


def test_case_a_hides_gradient_and_parameter_traffic():
    # B C^bwd = 24*2 >= S C_DP = 2*5: case A; M = 8, D = 4: ZeRO-3 saves memory (2/4 + 8/8 < 2)
    c = Components(stages=4, dp=4, chunks=8, microbatches=24, fwd=1.0, bwd=2.0, dp_comm=5.0, params=800)
    qp = queue_plan(c, 12)
    assert qp.case == "A" and qp.dequeue == (12, 12) and qp.sharding.zero_grad == 800
    assert qp.sharding.bz2 == 3 and qp.sharding.bz3_bwd == 9
    assert qp.sharding.zero_param == 800          # 9 * 2 >= 5: every parameter can be ZeRO-3
    assert qp.exposed["D_g"] == qp.exposed["D_p_fwd"] == qp.exposed["D_p_bwd"] == 0
    assert qp.dp_crit == 2 * 5.0                  # only the first chunk's RS and AG stay exposed
    mem = state_memory(c, qp.sharding)
    assert mem["parameters"] == pytest.approx((2 / 4 + 8 / 8) * 800)
    # M = 4: the paper enables ZeRO-3 only with M > 4
    c4 = Components(stages=4, dp=3, chunks=4, microbatches=24, fwd=1.0, bwd=2.0, dp_comm=5.0, params=800)
    assert queue_plan(c4, 12).sharding.zero_param == 0


@pytest.mark.parametrize("chunks, saves", [(5, False), (6, False), (7, True)])
def test_zero3_follows_the_papers_m_above_4_rule(chunks, saves):
    """With D = 3, M = 5 and 6 get ZeRO-3 (the paper's M > 4) although M_p's formula makes it
    cost memory there (2/3 + 8/M >= 2); the share is the largest with D_p^bwd = 0."""
    c = Components(stages=4, dp=3, chunks=chunks, microbatches=24, fwd=1.0, bwd=2.0, dp_comm=10.0, params=900)
    qp = queue_plan(c, 12)
    assert zero3_enabled(c) and zero3_saves_memory(c) == saves
    # B_Z2 = ceil(10 / 2) = 5, B_Z3^bwd = 12 - 5 = 7: 7 backward passes hide 14 >= 10, all of psi
    assert qp.sharding.bz3_bwd == 7 and qp.sharding.zero_param == 900
    assert qp.exposed["D_p_bwd"] == 0
    tight = queue_plan(Components(4, 3, chunks, 24, 1.0, 2.0, 20.0, params=900), 12)
    # B_Z2 = 10, B_Z3^bwd = 2: 4 of C_DP = 20 hidden, so psi_p = 900 * 4 / 20
    assert tight.sharding.zero_param == pytest.approx(180.0) and tight.exposed["D_p_bwd"] == pytest.approx(0.0)
    mem = state_memory(c, qp.sharding)["parameters"]
    assert (mem < 2 * 900) == saves


def test_case_b_sizes_last_dequeue_and_zero2_share():
    # B C^bwd = 12 < S C_DP = 2*30: case B
    c = Components(stages=2, dp=2, chunks=2, microbatches=12, fwd=0.5, bwd=1.0, dp_comm=30.0, params=100)
    qp = queue_plan(c, 6)
    assert qp.case == "B" and sum(qp.dequeue) == 12
    assert qp.dequeue[-1] == 10 and qp.dequeue[0] == 2   # d_S = ceil(30/1) capped at B - (S-1) P
    assert qp.sharding.zero_param == 0
    assert qp.sharding.zero_grad == pytest.approx(100 * 2 * 1.0 / 30.0)
    assert qp.exposed["D_g"] == 0


def test_fixed_schedules_share_the_dp():
    c = Components(stages=2, dp=2, chunks=2, microbatches=8, fwd=1.0, bwd=2.0, dp_comm=6.0, params=1000)
    ops = [OpCost("norm", 10, 0.05), OpCost("proj", 40, 1.0)]
    mt = plan_fixed("megatron", c, ops, budget=1e9)
    bf = plan_fixed("breadth-first", c, ops, budget=1e9)
    pm = plan(c, ops, budget=1e9)
    assert pm.time["total"] <= min(mt.time["total"], bf.time["total"]) + 1e-12
    assert mt.queue.q == 2 and bf.queue.q == 8
    with pytest.raises(ValueError, match="allowed: megatron, breadth-first"):
        plan_fixed("gpipe", c, ops, 1e9)


def test_components_reject_bad_input():
    with pytest.raises(ValueError, match="microbatches=2: PipeMesh needs B >= P=4"):
        Components(4, 2, 2, 2, 1.0, 2.0, 1.0)
    with pytest.raises(ValueError, match="fwd=-1"):
        Components(1, 2, 2, 2, -1, 2.0, 1.0)
    with pytest.raises(ValueError, match="size=-3"):
        OpCost("x", -3, 1.0)
    assert exposed_dp(Components(1, 2, 1, 1, 1.0, 1.0, 0.0), (1,), (1,), queue_plan(
        Components(1, 2, 1, 1, 1.0, 1.0, 0.0), 1).sharding)["D_o"] == 0


def test_cli_plan_pipemesh_json_and_errors(capsys):
    import json

    from pipert.cli import main
    assert main(["plan", "--pipemesh", "--paper", "gpt3-a100", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    p = out["plan"]
    assert p["schedule"] == "pipemesh" and p["P"] == 3 and p["D"] == 3 and p["M"] == 6 and p["B"] == 12
    assert sum(p["enqueue"]) == sum(p["dequeue"]) == 12 and p["enqueue"][0] == p["q"]
    assert p["memory"]["total"] < p["budget"]
    assert p["time"]["total"] == pytest.approx(sum(v for k, v in p["time"].items() if k != "total"))
    assert p["time"]["dp_crit"] == pytest.approx(p["dp_crit"])
    from pipert.schedules.zero_rules import check_zero_spec
    check_zero_spec(out["zero_spec"])   # the plan's shares, as pipert train --zero takes them
    assert out["zero_spec"].startswith("p=") and ",g=" in out["zero_spec"]
    mt = out["baselines"]["megatron"]
    assert mt["q"] == 3 and p["time"]["total"] <= mt["time"]["total"]
    assert main(["plan", "--pipemesh", "--paper", "gpt3-a100", "--memory-budget", "5"]) == 2
    err = capsys.readouterr().err
    assert "memory budget 5.000 GiB is below the minimum" in err
    assert main(["plan", "--pipemesh", "--paper", "gpt9"]) == 2
    assert "--paper 'gpt9' unknown; allowed: gpt3-a100, gpt3-v100, llama2-v100, falcon-v100" in capsys.readouterr().err
    assert main(["plan", "--pipemesh", "--model", "7b"]) == 2
    assert "--model '7b' unknown with --pipemesh; allowed: gpt3-58b, llama2-55b, falcon-66b" in capsys.readouterr().err
