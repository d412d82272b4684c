"""Pipelined training in one process (local transport) equals the reference step."""
import pytest
import torch

from pipert.schedules import build_schedule
from pipert.testing import IR_OP_CASES, IR_OP_DP_CASES, IR_OP_TORCH_CASES, Case, run_case
from pipert.tools.reference import rel_err

CLASSIC = ["gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-v"]
CASES = [Case(n, P, M, "float64", steps=2) for n in CLASSIC for P in (2, 3, 4) for M in (P, 2 * P, 2 * P + 1)]


def _allowed(c: Case) -> bool:
    try:
        build_schedule(c.schedule, stages=c.stages, microbatches=c.microbatches)
        return True
    except ValueError:
        return False


@pytest.mark.parametrize("case", [c for c in CASES if _allowed(c)], ids=lambda c: f"{c.schedule}-P{c.stages}-M{c.microbatches}")
def test_local_float64_equals_reference(case):
    r = run_case(case)
    assert r.loss_err <= 1e-12 and r.grad_err <= 1e-10 and r.param_err <= 1e-10, r


@pytest.mark.parametrize("name", CLASSIC)
def test_local_float32_equals_reference(name):
    r = run_case(Case(name, 4, 8, "float32"))
    assert r.loss_err <= 1e-5 and r.grad_err <= 1e-5 and r.param_err <= 1e-5, r


def test_rel_err_detects_a_one_ulp_change():
    a = {"w": torch.tensor([1.0, 2.0], dtype=torch.float64)}
    b = {"w": torch.nextafter(a["w"], torch.tensor(3.0, dtype=torch.float64))}
    assert rel_err(a, b) > 0
    with pytest.raises(AssertionError, match="names differ"):
        rel_err(a, {"v": a["w"]})


@pytest.mark.parametrize("case", IR_OP_CASES + IR_OP_DP_CASES + IR_OP_TORCH_CASES, ids=str)
def test_every_ir_op_trains_exactly_on_the_local_transport(case):
    """Folds, RECOMPUTE, OFFLOAD/PREFETCH, dp pairs (ALLREDUCE, REDUCESCATTER + ALLGATHER),
    W pieces and torch's IZB programs: the same cases as on gloo (test_gloo_ir_ops.py)."""
    r = run_case(case)
    assert r.loss_err <= 1e-12 and r.grad_err <= 1e-10 and r.param_err <= 1e-10, r


def test_pipelines_end_their_worker_threads_when_closed_or_collected():
    """Each rank's queues run on worker threads: a closed or garbage-collected Pipeline ends them,
    so a process that builds many pipelines (a test suite, a sweep) does not accumulate threads."""
    import gc
    import os

    from pipert.pipeline import Pipeline
    from pipert.testing import make_batch, sgd, tiny_units

    def threads() -> int:
        return len(os.listdir("/proc/self/task"))

    def one() -> None:
        Pipeline(tiny_units(2, "float64"), "1f1b", microbatches=2, optimizer=sgd).step(*make_batch(2))

    one()  # lazily started shared threads (pools, timers) are not the Pipeline's
    gc.collect()
    before = threads()
    for _ in range(4):
        one()
        gc.collect()
    assert threads() == before
    with Pipeline(tiny_units(2, "float64"), "1f1b", microbatches=2, optimizer=sgd) as pipe:
        pipe.step(*make_batch(2))
        during = threads()
    assert threads() < during
