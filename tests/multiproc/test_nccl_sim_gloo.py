"""``nccl-sim`` on gloo processes: every registered family trains exactly under NCCL's rules;
without warm-up the programs the validator calls start-up deadlocks hang and are reported."""
import time

import pytest

from pipert.launch import LaunchError
from pipert.exec.instrument import Instrumentation
from pipert.launch import launch
from pipert.sim import validate
from pipert.clirun import run_cli
from pipert.testing import Case, assert_exact, build_case_program, family_cases, fault_worker

TIMEOUT = 5.0


def test_every_family_trains_exactly_under_ncclsim_at_P4(run_gloo_cases):
    cases = family_cases(4, rules="nccl", steps=2)
    assert_exact(run_gloo_cases([c for c in cases if c.dp == 1], 4))
    assert_exact(run_gloo_cases([c for c in cases if c.dp == 2], 8))


def test_without_warmup_weipipe_hangs_at_start_and_every_rank_names_its_communicator():
    """The direct variant's first copies go straight from their owners, both ways around the ring
    at once (the paper's ring starts along the ring and does not hang at P = 4: test_nccl_rules)."""
    sched = build_case_program(Case("weipipe-interleave-direct", 4, 8))
    errors = validate(sched, transport="nccl", warmup=False, all_errors=True)
    assert [e.reason for e in errors] == ["deadlock"] and "start-up" in str(errors[0])
    t0 = time.monotonic()
    with pytest.raises(LaunchError) as err:
        launch(fault_worker, 4, args=("weipipe-interleave-direct", 8, Instrumentation(warmup=False), TIMEOUT, "nccl"),
               timeout=30.0)
    elapsed = time.monotonic() - t0
    msgs = err.value.errors
    assert sorted(msgs) == [0, 1, 2, 3], msgs
    assert "communicator up(0,1) not created after" in msgs[0] and "blocked creating down(0,1)" in msgs[0], msgs[0]
    assert all("not created after" in m for m in msgs.values()), msgs
    assert elapsed < 90, elapsed  # 4 processes' start-up on a loaded machine; creation waits time out after 5 s


def test_train_cli_runs_under_ncclsim_with_check():
    rows = run_cli("train", "--backend", "nccl-sim", "--schedule", "zb-h1", "--stages", "2", "--microbatches", "4",
                   "--batch-size", "8", "--steps", "2", "--dtype", "float64", "--check", "--json").rows()
    assert len(rows) == 2
    assert all(r["max_grad_rel_err"] <= 1e-10 and r["max_param_rel_err"] <= 1e-10 for r in rows), rows
