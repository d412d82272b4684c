"""emulate_real's second prediction: the emulated ranks share this host's cores."""
import json
import subprocess
import sys

import pytest

from pipert.cost.profiled import ProfiledCost
from pipert.ir.semantics import action_time
from pipert.schedules import build_schedule
from pipert.sim import simulate
from pipert.sim.eager import eager_analysis
from pipert.sim.shared import shared_makespan
from pipert.tools.profile import UnitProfile

P, M = 3, 5


def _cost() -> ProfiledCost:
    times = {"F": 1.0, "B": 2.0, "D": 1.2, "W": 0.8}
    return ProfiledCost([UnitProfile({op: t * (1 + u) for op, t in times.items()}, dict.fromkeys(("act", "grad", "weight", "wgrad", "stash", "stash_w", "kept"), 1))
                         for u in range(P)])


@pytest.mark.parametrize("name", ["1f1b", "zb-h1"])
def test_one_shared_device_does_all_the_work_in_turn(name):
    sched, cost = build_schedule(name, stages=P, microbatches=M), _cost()
    work = sum(action_time(cost.compute_time, a, r) for r, prog in enumerate(sched.actions) for a in prog)
    # free messages: some compute is always ready, so the one device is never idle
    assert shared_makespan(eager_analysis(sched, cost), [0] * P, [1.0]) == pytest.approx(work)
    assert shared_makespan(eager_analysis(sched, cost), [0] * P, [float(P)]) == pytest.approx(simulate(sched, cost).makespan)
    assert simulate(sched, cost).makespan < work


def test_cli_reports_both_predictions_and_which_to_read():
    import os
    out = subprocess.run([sys.executable, "-m", "pipert.cli", "emulate", "1f1b", "--real", "-P", "2", "-M", "2",
                          "--steps", "1", "--json"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    cores = len(os.sched_getaffinity(0))
    assert d["shared_cores"] == cores
    assert d["predicted_shared_step_s"] > 0 and d["predicted_step_s"] > 0
    assert d["relative_error_shared"] == pytest.approx(d["measured_step_s"] / d["predicted_shared_step_s"] - 1)
    assert d["read"].startswith("predicted_step_s")
