"""Measured compute times -> the simulator's step time (pipert.runtime.fidelity)."""
import pytest

from pipert.cost import UniformCost
from pipert.cost.topology import Links, LinkSpec, Topology
from pipert.runtime.fidelity import predict_step, profile_from_measurements
from pipert.runtime.pipeline import program_for
from pipert.schedules import build_schedule
from pipert.sim import simulate


def _parts(program, tf: float, tb: float, spread: float) -> list[dict]:
    """Per rank: every compute of its program timed twice, ``spread`` longer and shorter than tf/tb."""
    parts = []
    for r, actions in enumerate(program.actions):
        times = [(a.op.value, a.unit, (tf if a.op.value == "F" else tb) + d)
                 for a in actions if a.op.value in ("F", "B") for d in (spread, -spread)]
        times += [("OPT", None, 0.2), ("OPT", None, 0.3)]
        parts.append({"times": times, "act": {u: 1000 for u in range(program.num_units)}, "weight": {r: 10}})
    return parts


@pytest.mark.parametrize("links", [None, Links(Topology(4, num_dcs=2), {"inter_dc": LinkSpec(0.5, 4000.0)})])
def test_means_of_measured_times_predict_the_uniform_makespan(links):
    program = program_for(build_schedule("1f1b", stages=4, microbatches=8))
    prof = profile_from_measurements(_parts(program, 1.0, 2.0, spread=0.5), program.num_units)
    assert prof.max_forward == pytest.approx(1.0) and prof.t_opt == pytest.approx(0.25)
    assert [p.sizes["act"] for p in prof.profiles] == [1000] * 4
    expected = simulate(program, UniformCost(tf=1.0, tb=2.0, t_opt=0.25, act_bytes=1000), links=links).makespan
    assert predict_step(program, prof, links) == pytest.approx(expected, rel=1e-12)
