"""Processor-sharing timing over the engine's DAG (pipert.sim.shared)."""
import pytest

from pipert.cost import UniformCost
from pipert.cost.topology import Links, LinkSpec, Topology
from pipert.schedules import build_schedule
from pipert.sim import simulate
from pipert.sim.engine import analyze
from pipert.sim.shared import shared_makespan

CASES = [("1f1b", 4, 8), ("zb-h1", 4, 8), ("interleaved-1f1b", 2, 4), ("crosspipe-greedy", 4, 6), ("gpipe", 3, 5)]


@pytest.mark.parametrize("name,P,M", CASES)
@pytest.mark.parametrize("latency", [0.0, 1.5])
def test_a_device_per_rank_gives_the_engines_makespan(name, P, M, latency):
    s = build_schedule(name, stages=P, microbatches=M)
    cost = UniformCost(tf=1.0, tb=2.0, act_bytes=100)
    links = Links(Topology(P, num_dcs=2), {"inter_dc": LinkSpec(latency, 400.0)}) if P % 2 == 0 else None
    g = analyze(s, cost, links).graph
    expected = simulate(s, cost, links=links).makespan
    assert shared_makespan(g, list(range(P)), [1.0] * P) == pytest.approx(expected, rel=1e-12)
    assert shared_makespan(g, [0] * P, [float(P)]) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("name,P,M", CASES)
def test_fewer_cores_never_speed_up_and_work_bounds_hold(name, P, M):
    s = build_schedule(name, stages=P, microbatches=M)
    cost = UniformCost(tf=1.0, tb=2.0)
    g = analyze(s, cost).graph
    own = simulate(s, cost).makespan
    work = sum(simulate(s, cost).busy)
    spans = [shared_makespan(g, [0] * P, [c]) for c in (1.0, 2.0, float(P))]
    assert spans[0] >= spans[1] - 1e-9 >= spans[2] - 2e-9
    assert spans[0] >= work - 1e-9 and spans[2] == pytest.approx(own)


def test_a_chain_of_computes_is_not_slowed_by_sharing_one_core():
    # 2-stage GPipe with one micro-batch is a chain F0, F1, B1, B0: never two computes at once
    s = build_schedule("gpipe", stages=2, microbatches=1)
    g = analyze(s, UniformCost(tf=1.0, tb=2.0)).graph
    assert shared_makespan(g, [0, 0], [1.0]) == pytest.approx(6.0)


def test_bad_mappings_are_rejected():
    g = analyze(build_schedule("1f1b", stages=2, microbatches=2), UniformCost()).graph
    with pytest.raises(ValueError, match="one device per rank"):
        shared_makespan(g, [0], [1.0])
    with pytest.raises(ValueError, match="devices are 0..0"):
        shared_makespan(g, [0, 1], [1.0])
    with pytest.raises(ValueError, match="positive capacity"):
        shared_makespan(g, [0, 0], [0.0])
