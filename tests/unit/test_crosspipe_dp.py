"""CrossPipe's DP-overlap operations: the crosspipe-overlap replication policy (paper Fig. 7)."""
from __future__ import annotations

import pytest

from pipert.cost import Links, LinkSpec, Topology, UniformCost
from pipert.ir import Op, Payload
from pipert.schedules import build_schedule
from pipert.schedules.crosspipe import ChunkScaledCost
from pipert.schedules.data_parallel import policy_for, replicate
from pipert.sim import simulate, validate

P, M = 4, 8
LAT, BW = 0.5, 1.0
WAVE_COST = ChunkScaledCost(UniformCost(tf=1.0, tb=2.0), 2)
# the replicas sit in different datacenters: replica 0 = ranks 0..3 (DC 0), replica 1 = ranks 4..7 (DC 1)
LINKS = Links(Topology(2 * P, num_dcs=2), {"inter_dc": LinkSpec(LAT, BW)})


def _wave():
    return build_schedule("crosspipe-wave", stages=P, microbatches=M, cost=WAVE_COST)


def test_crosspipe_families_replicate_with_the_overlap_policy():
    for name in ("crosspipe-greedy", "crosspipe-wave"):
        base = build_schedule(name, stages=P, microbatches=M, chunks=2 if name.endswith("wave") else 1)
        assert policy_for(base) == "crosspipe-overlap"
    assert policy_for(build_schedule("zb-v", stages=P, microbatches=M)) == "at-opt"


def test_each_reduction_follows_its_units_last_weight_gradient():
    s = replicate(_wave(), 2)
    validate(s, WAVE_COST, links=LINKS)                   # raises on any broken rule
    for acts in s.actions:
        for i, a in enumerate(acts):
            if a.op is Op.ALLREDUCE:
                last_w = max(j for j, b in enumerate(acts) if b.op is Op.W and b.unit == a.unit)
                assert i == last_w + 1
        # rank 0 holds units 0 and 7: unit 7's reduction runs while unit 0's backward computes
        assert [a.op for a in acts[-2:]] == [Op.OPT, Op.OPT]
    first = s.actions[0]
    i7 = next(i for i, a in enumerate(first) if a.op is Op.ALLREDUCE and a.unit == 2 * P - 1)
    assert any(a.op is Op.W and a.unit == 0 for a in first[i7:])


def test_simulator_prices_the_cross_dc_reduction_and_overlap_shortens_the_step():
    base = _wave()
    over, at_opt = (simulate(replicate(base, 2, policy=p), WAVE_COST, LINKS) for p in ("auto", "at-opt"))
    wgrad = WAVE_COST.message_bytes(Payload.WGRAD, 0)                       # uniform: one unit's gradient bytes
    # ring all-reduce between two members across the datacenters: 2 (alpha + (b/2)/B)
    ring = 2 * (LAT + wgrad / 2 / BW)
    durations = [e[4] - e[3] for e in over.events if e[2].op is Op.ALLREDUCE]
    assert len(durations) == 2 * P * 2 and durations == pytest.approx([ring] * len(durations))
    assert over.comm_bytes["inter_dc"] > 0
    assert over.makespan < at_opt.makespan


def test_one_unit_per_rank_overlap_equals_at_opt():
    base = build_schedule("crosspipe-greedy", stages=P, microbatches=M)
    assert replicate(base, 2).actions == replicate(base, 2, policy="at-opt").actions
