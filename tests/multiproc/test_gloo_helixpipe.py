"""HelixPipe on gloo processes trains exactly (float64, 1e-10 against the single-process
reference): QKV weights sent to the attention stages and their gradients returned, one and two
folds, recomputation without attention, the chunked MLP, LLaMA and GPT units, the loss in C(L)'s
backward (helixpipe-2fold's default) and in its forward (the opt-out). The full grid runs
on the local transport (tests/unit/test_helixpipe_runtime.py)."""
from pipert.testing import HELIX_CASES, HELIX_P4_CASES


def _check(results):
    for r in results:
        assert "error" not in r, r
        label = str(r["case"])
        assert r["loss_err"] <= 1e-12, label
        assert r["grad_err"] <= 1e-10, label
        assert r["param_err"] <= 1e-10, label
        assert r["sent_bytes"]["weight"] == r["sent_bytes"]["wgrad"] > 0, label


def test_helixpipe_on_two_ranks(run_gloo_cases):
    _check(run_gloo_cases(HELIX_CASES[:3] + HELIX_CASES[-1:], 2))


def test_helixpipe_on_four_ranks(run_gloo_cases):
    _check(run_gloo_cases(HELIX_P4_CASES[:1], 4))
