"""Pipelined training on gloo processes equals the single-process reference step."""
import pytest

from pipert.schedules import build_schedule
from pipert.testing import Case

CLASSIC = ["gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-v"]
CROSSPIPE = ["crosspipe-greedy", "crosspipe-wave", "crosspipe-optimal"]


def _cases(P: int) -> list[Case]:
    out = []
    for name in CLASSIC:
        for M in (P, 2 * P, 2 * P + 1):
            try:
                build_schedule(name, stages=P, microbatches=M)
            except ValueError:
                continue  # the family does not take this M (e.g. interleaved needs M % P == 0)
            out.append(Case(name, P, M, "float64", steps=2))
        out.append(Case(name, P, 2 * P, "float32"))
    # CrossPipe orders built for slow cross-DC links (2 DCs) still train exactly.
    delayed = (("num_dcs", 2), ("dc_latency", 2.0), ("dc_transfer", 1.0))
    for name in CROSSPIPE:
        out.append(Case(name, P, 2 * P, "float64", steps=2, options=delayed if P % 2 == 0 else ()))
    return out


# P = 4: every family on 4 gloo processes is tests/multiproc/test_nccl_sim_gloo.py's case
@pytest.mark.parametrize("P", [2, 3])
def test_classic_schedules_match_reference_on_gloo(P, run_gloo_cases):
    for r in run_gloo_cases(_cases(P), P):
        assert "error" not in r, r
        tol = 1e-10 if r["case"]["dtype"] == "float64" else 1e-5
        label = f"{r['case']['schedule']} P={P} M={r['case']['microbatches']} {r['case']['dtype']}"
        assert r["loss_err"] <= tol, label
        assert r["grad_err"] <= tol, label
        assert r["param_err"] <= tol, label
        assert r["sent_bytes"].get("act", 0) > 0 and r["sent_bytes"].get("grad", 0) > 0, label
