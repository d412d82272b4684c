"""HelixPipe trains exactly on the local transport (float64, against the single-process
reference): p in {2, 4}, one and two folds, recomputation without attention, the chunked MLP,
LLaMA and GPT units (the same cases run on gloo in tests/multiproc/test_gloo_helixpipe.py)."""
import pytest

from pipert.testing import HELIX_CASES, HELIX_P4_CASES, run_case


@pytest.mark.parametrize("case", HELIX_CASES + HELIX_P4_CASES, ids=str)
def test_helixpipe_equals_reference(case):
    r = run_case(case)
    assert r.loss_err <= 1e-12 and r.grad_err <= 1e-10 and r.param_err <= 1e-10, r
    # QKV weights went out and their gradients came back: one message each per stage that
    # computes A(l) away from C(l)'s stage, per step
    assert r.sent_bytes.get("weight", 0) > 0 and r.sent_bytes.get("wgrad", 0) == r.sent_bytes["weight"]
