"""pipert.compile: one pipeline of passes to a validated, immutable Program, and what runs is what
was validated (the executor refuses anything else)."""
import dataclasses
import inspect
import pickle

import pytest

import pipert
from pipert.compiler import compile
from pipert.ir import Op
from pipert.ir import passes as P
from pipert.ir.program import Program, ProgramError, schedule_digest
from pipert.pipeline import Pipeline
from pipert.schedules import build_schedule
from pipert.schedules.data_parallel import replicate
from pipert.sim import ScheduleError, validate
from pipert.testing import make_batch, sgd, tiny_units
from pipert.exec.instrument import Instrumentation


def _split_forwards(s, pieces: int = 2):
    """``s`` with every F run as ``pieces`` adjacent sub-blocks."""
    return s.with_actions([[p for a in acts for p in ([dataclasses.replace(a, sub=(j, pieces)) for j in range(pieces)]
                                                      if a.op is Op.F else [a])] for acts in s.actions])


def test_compile_applies_its_passes_in_order_and_the_executor_runs_the_result():
    base = _split_forwards(build_schedule("1f1b", stages=2, microbatches=2))
    program = compile(base, passes=("recompute", "offload_stashes"), dp=2, zero=1)
    assert program.passes == ("recompute", "offload_stashes", "replicate:at-opt", "merge_sub_blocks")
    by_hand = P.merge_sub_blocks(replicate(P.offload_stashes(P.recompute(base)), 2, 1, policy="at-opt"))
    assert program.to_schedule().actions == by_hand.actions
    assert not any(a.sub for _, _, a in program)          # the executor's lowering ran
    assert program.validated == program.digest == schedule_digest(by_hand, "gloo")
    validate(by_hand)
    units = tiny_units(2, "float64")
    pipe = Pipeline(units, program, optimizer=sgd)
    assert pipe.program is program
    assert all(pipe._executors[r].program == program.actions[r] for r in range(program.num_ranks))
    pipe.step(*make_batch(4))


def test_a_schedule_given_to_pipeline_is_compiled_once_with_its_options():
    s = build_schedule("pipemesh", stages=2, microbatches=4, chunks=2)
    units = tiny_units(s.num_units, "float64")
    pipe = Pipeline(units, s, optimizer=sgd, dp=2, zero=3)
    expected = compile(s, dp=2, zero=3, units=units)
    assert pipe.program.digest == expected.digest
    assert pipe.program.passes == ("replicate:pipemesh-overlap",)   # the family's registered policy
    assert pipe.program.options.dp == 2 and pipe.program.options.zero == 3
    with pytest.raises(TypeError, match="dp shape a schedule, but program .* is compiled already"):
        Pipeline(units, expected, dp=2)


def test_the_executor_refuses_a_program_that_is_not_what_was_validated():
    program = compile("1f1b", stages=2, microbatches=2)
    units = tiny_units(2, "float64")
    acts = [list(a) for a in program.actions]
    acts[1].reverse()
    forged = dataclasses.replace(program, actions=acts)   # keeps the validated digest of the original
    assert forged.validated == program.validated != forged.digest
    with pytest.raises(ProgramError, match="differs from what the validator accepted"):
        Pipeline(units, forged, optimizer=sgd)


def test_an_unvalidated_program_runs_only_under_instrumentation():
    bad = build_schedule("1f1b", stages=2, microbatches=2)
    acts = [list(a) for a in bad.actions]
    acts[1].remove(next(a for a in acts[1] if a.op is Op.RECV))  # a SEND nobody receives
    bad = bad.with_actions(acts)
    with pytest.raises(ScheduleError):
        compile(bad)
    unchecked = compile(bad, check=False)
    assert unchecked.validated is None
    with pytest.raises(ProgramError, match="was not validated"):
        Pipeline(tiny_units(2, "float64"), unchecked, optimizer=sgd)
    with pytest.raises(TypeError, match="only through Instrumentation"):
        Pipeline(tiny_units(2, "float64"), bad, optimizer=sgd, check=False)
    Pipeline(tiny_units(2, "float64"), unchecked, optimizer=sgd, instrument=Instrumentation(check=False))


def test_a_program_is_immutable_and_survives_pickling():
    program = compile("zb-h1", stages=2, microbatches=4, rules="nccl")
    with pytest.raises(dataclasses.FrozenInstanceError):
        program.actions = ()
    with pytest.raises(TypeError):
        program.meta["update_every"] = 2
    assert isinstance(program.actions, tuple) and all(isinstance(a, tuple) for a in program.actions)
    copy = pickle.loads(pickle.dumps(program))
    assert copy.digest == program.digest and copy.rules == "nccl"
    copy.verify()
    with pytest.raises(TypeError, match="already compiled"):
        compile(program)


def test_the_rules_a_program_was_validated_under_are_its_digest_and_its_runtime():
    gloo = compile("1f1b", stages=2, microbatches=2)
    nccl = compile("1f1b", stages=2, microbatches=2, rules="nccl")
    assert gloo.actions == nccl.actions and gloo.digest != nccl.digest
    units = tiny_units(2, "float64")
    assert not Pipeline(units, gloo, optimizer=sgd).simulated_nccl
    assert Pipeline(tiny_units(2, "float64"), nccl, optimizer=sgd).simulated_nccl  # nccl-sim on the local hub
    # validate() checks a Program under its own rules unless told otherwise: without warm-up,
    # WeiPipe's first weight sends hang at NCCL's communicator creation, which gloo does not have
    weipipe = compile("weipipe-interleave", stages=2, microbatches=4, rules="nccl")
    assert [e.reason for e in validate(weipipe, warmup=False, all_errors=True)] == ["deadlock"]
    assert validate(weipipe, transport="gloo", warmup=False, all_errors=True) == []


def test_named_schedules_need_their_shape_and_match_the_units():
    with pytest.raises(ValueError, match="microbatches is required"):
        compile("1f1b", stages=2)
    with pytest.raises(ValueError, match="has 2 units but the model was partitioned into 3"):
        compile("1f1b", stages=2, microbatches=2, units=tiny_units(3, "float64"))
    with pytest.raises(ValueError, match="zero=1 needs data-parallel replicas"):
        compile("1f1b", stages=2, microbatches=2, zero=1)
    with pytest.raises(ValueError, match="per parameter: compile.* needs the model's units"):
        compile("1f1b", stages=2, microbatches=4, dp=2, zero="3:mlp,1")
    assert compile("1f1b", microbatches=2, units=tiny_units(3, "float64")).num_ranks == 3  # a stage per unit


def test_pipeline_init_is_short_and_takes_few_parameters():
    lines, _ = inspect.getsourcelines(Pipeline.__init__)
    params = inspect.signature(Pipeline.__init__).parameters
    assert len(lines) <= 40, len(lines)
    assert len(params) <= 10, list(params)
    # test hooks live in the instrumentation object, not in the signatures of Pipeline or the executor
    from pipert.exec.executor import RankExecutor
    hooks = {"fault", "record", "measure_memory", "check", "trace", "digest", "warmup"}
    assert not hooks & set(params) and not hooks & set(inspect.signature(RankExecutor.__init__).parameters)


def test_compile_and_program_are_exported_from_pipert():
    assert pipert.compile is compile and pipert.Program is Program


def test_pipert_train_runs_the_program_compiled_under_its_backends_rules():
    from pipert.train import TrainConfig, _prepare
    cfg = TrainConfig(schedule="1f1b", stages=2, microbatches=4, dp=2, zero="1", model="tiny")
    for backend, rules in (("local", "gloo"), ("gloo", "gloo"), ("nccl-sim", "nccl"), ("nccl", "nccl")):
        program = _prepare(cfg, backend)
        assert isinstance(program, Program) and program.rules == rules
        program.verify()   # validated, under those rules
        assert program.passes == ("replicate:at-opt",)   # the generator ran in build_program
        assert program.num_ranks == 4 and program.options.dp == 2 and program.options.zero == "1"
