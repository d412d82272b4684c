"""Saved-tensor hooks only where a program needs them: a unit whose weights can be rebound or whose
stash moves while a stash is alive (pipert.exec.stash.hooked_units); elsewhere autograd keeps what
it saves, and the step equals the reference either way."""
import pytest
import torch

from pipert.compiler import compile
from pipert.exec.instrument import Instrumentation
from pipert.exec.stash import StashLedger, hooked_units
from pipert.ir import Action, Op, Payload
from pipert.pipeline import Pipeline
from pipert.testing import make_batch, sgd, tiny_units
from pipert.tools.reference import reference_step


def _units_of(actions) -> set[int]:
    return {a.unit for a in actions if a.unit is not None and a.op in (Op.F, Op.B, Op.D, Op.W)}


def test_activation_passing_programs_hook_no_unit():
    for name in ("1f1b", "zb-h1", "interleaved-1f1b"):
        program = compile(name, stages=2, microbatches=4)
        assert [hooked_units(acts) for acts in program.actions] == [set(), set()], name


def test_moving_weights_or_stashes_hooks_exactly_the_units_they_touch():
    zero3 = compile("zb-h1", stages=2, microbatches=4, dp=2, zero=3)
    assert all(hooked_units(acts) == _units_of(acts) for acts in zero3.actions)
    ring = compile("weipipe-interleave", stages=2, microbatches=4)
    assert all(hooked_units(acts) == _units_of(acts) and acts for acts in ring.actions)
    offload = compile("1f1b", stages=2, microbatches=4, passes=("offload_stashes",))
    moved = [{a.unit for a in acts if a.payload is Payload.STASH} for acts in offload.actions]
    assert any(moved)
    assert [hooked_units(acts) for acts in offload.actions] == moved


def test_a_compute_after_an_opt_of_its_unit_is_hooked():
    acts = [Action(Op.F, unit=0, mb=(0,)), Action(Op.OPT, unit=0), Action(Op.F, unit=0, mb=(1,)),
            Action(Op.F, unit=1, mb=(0,)), Action(Op.OPT, unit=1)]
    assert hooked_units(acts) == {0}
    assert hooked_units([Action(Op.OPT), Action(Op.F, unit=3, mb=(0,))]) == {3}


@pytest.mark.parametrize("passes,hooked", [((), False), (("offload_stashes",), True)])
def test_the_hooks_run_only_where_the_program_needs_them_and_both_steps_are_exact(monkeypatch, passes, hooked):
    packed = []
    real = StashLedger._pack
    monkeypatch.setattr(StashLedger, "_pack", lambda self, t: packed.append(1) or real(self, t))
    units = tiny_units(2, "float64")
    x, y = make_batch(4)
    ref = reference_step(units, x, y, 4, sgd)
    pipe = Pipeline(units, compile("1f1b", stages=2, microbatches=4, passes=passes), optimizer=sgd)
    loss = pipe.step(x, y)
    assert bool(packed) is hooked
    assert loss == pytest.approx(ref.loss, rel=1e-12)
    params = pipe.named_parameters()
    assert set(params) == set(ref.params_after)
    for name, p in params.items():
        torch.testing.assert_close(p, ref.params_after[name], rtol=1e-12, atol=1e-12)


def test_measuring_memory_hooks_every_unit():
    units = tiny_units(2, "float64")
    x, y = make_batch(4)
    pipe = Pipeline(units, compile("1f1b", stages=2, microbatches=4), optimizer=sgd,
                    instrument=Instrumentation(measure_memory=True))
    pipe.step(x, y)
    assert all(ex.state.stash.hooked is None for ex in pipe._executors.values())
