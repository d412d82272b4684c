"""Weight-passing schedules on gloo processes equal the reference over 3 steps."""
import pytest

from pipert.testing import Case

WEIPIPE = ["weipipe-naive", "weipipe-interleave", "weipipe-zb1", "weipipe-zb2"]


def _cases(P: int) -> list[Case]:
    # two turns per step at P = 2; one at P = 6 (its cost is the processes, its subject tawpipe's groups)
    out = [Case(n, P, M, "float64", steps=3) for n in WEIPIPE for M in ((P, 2 * P) if P == 2 else (P,))
           if not (n == "weipipe-zb1" and (P % 2 or (M // P) % 2))]
    out += [Case("tawpipe", P, P, "float64", steps=3, options=(("ranks_per_node", g),))
            for g in (2, 3) if P % g == 0 and P // g >= 2]
    return out


# P = 4: every family on 4 gloo processes is tests/multiproc/test_nccl_sim_gloo.py's case; P = 6
# groups tawpipe's nodes by 2 and by 3
@pytest.mark.parametrize("P", [2, 6])
def test_weight_passing_matches_reference_on_gloo(P, run_gloo_cases):
    for r in run_gloo_cases(_cases(P), P):
        label = f"{r['case']['schedule']} P={P} M={r['case']['microbatches']} {r['case']['options']}"
        assert "error" not in r, r
        assert r["loss_err"] <= 1e-10 and r["grad_err"] <= 1e-10 and r["param_err"] <= 1e-10, label
