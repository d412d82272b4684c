"""``pipert emulate --real`` builds helixpipe-2fold's units as ``pipert train`` does: with the
schedule's recomputation (its paper default, or ``--recompute``) and its opt-out flags."""
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
