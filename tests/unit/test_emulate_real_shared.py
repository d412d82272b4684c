"""emulate_real's second prediction: the emulated ranks share this process's one device."""
import json
import subprocess
import sys

import pytest

from pipert.emulate.real import ProfiledCost, device_capacity
from pipert.ir import Op
from pipert.ir.semantics import action_time
from pipert.schedules import build_schedule
from pipert.sim import simulate
from pipert.sim.shared import shared_step

P, M = 3, 5


def _cost() -> ProfiledCost:
    times = {(op, u): t * (1 + u) for u in range(P) for op, t in ((Op.F, 1.0), (Op.B, 2.0), (Op.D, 1.2), (Op.W, 0.8))}
    return ProfiledCost(times, [1.0] * P, [1.0] * P)


@pytest.mark.parametrize("name", ["1f1b", "zb-h1"])
def test_one_shared_device_does_all_the_work_in_turn(name):
    sched, cost = build_schedule(name, stages=P, microbatches=M), _cost()
    work = sum(action_time(cost.compute_time, a, r) for r, prog in enumerate(sched.actions) for a in prog)
    # free messages: some compute is always ready, so the one device is never idle
    assert shared_step(sched, cost, None, [0] * P, [1.0]) == pytest.approx(work)
    assert shared_step(sched, cost, None, [0] * P, [float(P)]) == pytest.approx(simulate(sched, cost).makespan)
    assert simulate(sched, cost).makespan < work


def test_capacity_of_a_cpu_is_its_logical_cpus():
    import os

    import torch
    assert device_capacity(torch.device("cpu")) == float(os.cpu_count())
    assert device_capacity(torch.device("cuda", 0)) == 1.0


def test_cli_reports_both_predictions():
    out = subprocess.run([sys.executable, "-m", "pipert.cli", "emulate", "1f1b", "--real", "-P", "2", "-M", "2",
                          "--steps", "1", "--json"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert d["device_capacity"] == device_capacity(__import__("torch").device("cpu"))
    assert d["predicted_shared_step_s"] >= d["predicted_step_s"] > 0
    assert d["relative_error_shared"] == pytest.approx(d["measured_step_s"] / d["predicted_shared_step_s"] - 1)
