"""``pipert emulate --real`` builds helixpipe-2fold's units as ``pipert train`` does: with the
schedule's recomputation (its paper default, or ``--recompute``) and its opt-out flags; the
emulated Pipeline runs the program's loss placement (``unit_runner``)."""
import types

import pytest

import pipert.emulate.real as real
from pipert.cli import main

ARGS = ["emulate", "helixpipe-2fold", "--real", "-P", "2", "-M", "4", "--real-model", "gpt-tiny", "--seq", "16",
        "--json"]


@pytest.fixture
def captured(monkeypatch):
    seen = {}

    def fake(sched, units, x, y, links, steps):
        seen.update(sched=sched, units=units)
        return types.SimpleNamespace(step_seconds=1.0, predicted=1.0, error=0.0, predicted_shared=1.0,
                                     error_shared=0.0, capacity=1.0)
    monkeypatch.setattr(real, "emulate_real", fake)
    return seen


def test_paper_defaults(captured):
    assert main(ARGS) == 0
    meta = captured["sched"].meta
    assert (meta["asynchronous"], meta["recompute"], meta["loss_in_backward"]) == (True, "no_attention", True)
    assert {u.save_ops for u in captured["units"]} == {frozenset({"attention"})}


def test_opt_outs(captured):
    assert main(ARGS + ["--sync-folds", "--loss-in-forward", "--recompute", "none"]) == 0
    meta = captured["sched"].meta
    assert (meta["asynchronous"], meta["recompute"], meta["loss_in_backward"]) == (False, "none", False)
    assert {u.save_ops for u in captured["units"]} == {None}


def test_profiles_run_the_last_unit_as_the_program_does(monkeypatch):
    """profile_units times C(L) with the program's loss placement: its F returns no loss (under
    loss in forward it would), every op of every unit is timed."""
    import torch

    import pipert.exec.unit as unit
    from pipert.ir import Op
    from pipert.models import build_units
    units = build_units("gpt-tiny", 5, dtype="float64", max_seq=16, cut="helix", layers=2)
    x = torch.randint(0, 256, (2, 16))
    last_outputs = []
    forward = unit.UnitRunner.forward

    def spy(self, *a, **k):
        out = forward(self, *a, **k)
        if self.is_last:
            last_outputs.append(out)
        return out
    monkeypatch.setattr(unit.UnitRunner, "forward", spy)
    cost = real.profile_units(units, x, x, reps=1, meta={"loss_in_backward": True})
    assert last_outputs and all(out is None for out in last_outputs)
    assert sorted(cost.times, key=str) == sorted(((op, u) for u in range(5) for op in (Op.F, Op.B, Op.D, Op.W)), key=str)
    assert cost.act_bytes[-1] == 0
