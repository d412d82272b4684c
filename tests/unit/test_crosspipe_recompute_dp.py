"""CrossPipe's recompute case (paper §7.2 Case 2) and its DP-overlap operations in the objective."""
from __future__ import annotations

import json

import pytest

from pipert.cost import Links, LinkSpec, Topology, UniformCost
from pipert.ir import Op
from pipert.schedules import build_schedule
from pipert.schedules.crosspipe import (ChunkScaledCost, GreedyConfig, default_memory_limit, greedy_best,
                                        lower_crosspipe, pattern_units, problem_from_cost)
from pipert.schedules.crosspipe.build import reduction_times
from pipert.schedules.data_parallel import replicate
from pipert.sim import simulate, validate

# boundary activations a quarter of a stash: F under recompute keeps a quarter (exact in binary)
COST = UniformCost(tf=1.0, tb=2.0, act_bytes=0.25)
EXACT = {"time_limit": 600.0}


def _links(p: int = 4, lat: float = 1.0, bw: float = 1.0) -> Links:
    return Links.uniform_dc(Topology(p, num_dcs=2), lat, bw)


def _computes(s, rank: int) -> list:
    return [a for a in s.actions[rank] if a.op in (Op.F, Op.RECOMPUTE, Op.D, Op.W)]


@pytest.mark.parametrize("name, extra", [("crosspipe-greedy", {}), ("crosspipe-optimal", EXACT)])
def test_recompute_case_rebuilds_each_stash_before_its_d_within_the_budget(name, extra):
    p, m = (4, 8) if name == "crosspipe-greedy" else (2, 4)
    links = _links(p)
    limit = default_memory_limit("ud", p, m, COST)
    s = build_schedule(name, stages=p, microbatches=m, cost=COST, links=links, recompute="full", **extra)
    plain = build_schedule(name, stages=p, microbatches=m, cost=COST, links=links, **extra)
    assert s.meta["recompute_ops"] == "full" and "recompute_ops" not in plain.meta
    for r in range(p):
        acts = _computes(s, r)
        for i, a in enumerate(acts):
            if a.op is Op.D:      # its RECOMPUTE ran before it, after its F
                j = acts.index(next(b for b in acts if b.op is Op.RECOMPUTE and b.unit == a.unit and b.mb == a.mb))
                f = acts.index(next(b for b in acts if b.op is Op.F and b.unit == a.unit and b.mb == a.mb))
                assert f < j < i
        assert sum(a.op is Op.RECOMPUTE for a in acts) == m
    rep = validate(s, COST, memory_limit=limit, links=links)      # raises on any broken rule
    assert all(peak <= lim + 1e-12 for peak, lim in zip(rep.peak_memory, limit))
    r = simulate(s, COST, links)
    # the model's prediction is what the simulator prices: RECOMPUTE at tf, F keeping its input
    assert r.makespan == pytest.approx(s.meta["predicted_makespan"], abs=1e-9)
    busy = [sum(e[4] - e[3] for e in r.events if e[0] == q and e[1] == "compute") for q in range(p)]
    assert busy == pytest.approx([m * (1.0 + 1.0 + 2.0)] * p)
    # rank 0's first unit keeps nothing (token ids): its level rises only when a RECOMPUTE rebuilds
    assert rep.peak_memory[0] < validate(plain, COST, links=links).peak_memory[0]


@pytest.mark.parametrize("pattern", ["wave", "loop"])
@pytest.mark.parametrize("lat, bw", [(0.0, 0.0), (0.5, 2.0)])
def test_recompute_greedy_times_every_compute_as_the_simulator_on_every_pattern(pattern, lat, bw):
    cost = ChunkScaledCost(COST, 2)
    links = _links(4, lat, bw)
    limit = default_memory_limit(pattern, 4, 8, cost)
    pr = problem_from_cost(4, 8, pattern, cost, links, memory_limit=limit, recompute=True)
    g = greedy_best(pr, GreedyConfig())
    s = lower_crosspipe(pr, g.orders, g.recv_at)
    validate(s, cost, memory_limit=limit, links=links)
    r = simulate(s, cost, links)
    starts = [e[3] for e in r.events if e[1] == "compute" and e[2].op is not Op.OPT]
    assert starts == pytest.approx([t.start for tl in g.timeline for t in tl], abs=1e-9)
    assert r.makespan == pytest.approx(g.makespan, abs=1e-9) and r.peak_memory == pytest.approx(g.peak_memory)


def test_recompute_and_dp_time_options_are_checked():
    with pytest.raises(ValueError, match="recompute='half' unknown; allowed: none, no_attention, full"):
        build_schedule("crosspipe-greedy", stages=2, microbatches=4, recompute="half")
    with pytest.raises(ValueError, match="dp_time='fast': give each unit's gradient reduction time"):
        build_schedule("crosspipe-greedy", stages=2, microbatches=4, dp_time="fast")
    # --options text: one time for every unit, or one per unit
    one, per = (build_schedule("crosspipe-greedy", stages=2, microbatches=4, dp_time=t) for t in ("1.5", "1.5,1.5"))
    assert one.actions == per.actions and one.meta["predicted_makespan"] == per.meta["predicted_makespan"]


def test_train_check_runs_the_recompute_case_exactly(capsys):
    from pipert.cli import main
    from pipert.train import TrainConfig, build_program
    shape = dict(schedule="crosspipe-greedy", stages=2, microbatches=4, batch_size=4, seq=16, steps=1)
    prog = build_program(TrainConfig(**shape, options="recompute=full"))
    assert sum(a.op is Op.RECOMPUTE for acts in prog.actions for a in acts) == 2 * 4
    flags = ["train", "--backend", "local", "--schedule", "crosspipe-greedy", "--stages", "2", "--microbatches", "4",
             "--batch-size", "4", "--seq", "16", "--steps", "1", "--dtype", "float64", "--json", "--check",
             "--options", "recompute=full"]
    assert main(flags) == 0
    step = json.loads([line for line in capsys.readouterr().out.splitlines() if line.startswith("{")][0])
    assert step["max_grad_rel_err"] <= 1e-10 and step["max_param_rel_err"] <= 1e-10


# --- DP overlap in the objective ---------------------------------------------------------------
P, M = 2, 4
WAVE = ChunkScaledCost(UniformCost(tf=1.0, tb=2.0), 2)
# replica 0 = ranks 0..1 (DC 0), replica 1 = ranks 2..3 (DC 1): every gradient reduction crosses
DP_LINKS = Links(Topology(2 * P, num_dcs=2), {"inter_dc": LinkSpec(0.5, 1.0)})


@pytest.mark.parametrize("name, extra", [("crosspipe-wave", {}), ("crosspipe-optimal", {"chunks": 2, **EXACT})])
def test_dp_aware_order_hides_the_reductions_the_blind_order_exposes(name, extra):
    dp_time = reduction_times(pattern_units("wave", P), P, 2, WAVE, DP_LINKS)
    # ring all-reduce of one unit's gradient (1 byte) between two members across the DCs: 2 (alpha + (b/2)/B)
    assert dp_time == pytest.approx([2 * (0.5 + 0.5 / 1.0)] * 2 * P)
    blind = build_schedule(name, stages=P, microbatches=M, cost=WAVE, links=DP_LINKS, **extra)
    aware = build_schedule(name, stages=P, microbatches=M, cost=WAVE, links=DP_LINKS, dp_time=dp_time, **extra)
    assert aware.actions != blind.actions
    sim_blind, sim_aware = (simulate(replicate(s, 2), WAVE, DP_LINKS) for s in (blind, aware))
    # the objective now holds the reductions: its prediction is the replicated program's step
    assert sim_aware.makespan == pytest.approx(aware.meta["predicted_makespan"], abs=1e-9)
    assert blind.meta["predicted_makespan"] < sim_blind.makespan - 1.0        # the blind model misses them
    assert sim_aware.makespan < sim_blind.makespan - 1.0
    # rank 0's later chunk (unit 2P-1) finishes its W first, so its reduction overlaps unit 0's backward
    both = build_schedule(name, stages=P, microbatches=M, cost=WAVE, links=DP_LINKS, dp_time=dp_time,
                          recompute="full", **extra)      # the two together: still the replicated step
    assert simulate(replicate(both, 2), WAVE, DP_LINKS).makespan == pytest.approx(both.meta["predicted_makespan"])
    r0 = aware.actions[0]
    last_w_top = max(i for i, a in enumerate(r0) if a.op is Op.W and a.unit == 2 * P - 1)
    assert any(a.op in (Op.D, Op.W) and a.unit == 0 for a in r0[last_w_top:])
