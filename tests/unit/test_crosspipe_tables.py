"""CrossPipe's Tables 5 and 6 comparison is computed from sweep rows: a sweep that reproduces the
paper's figures meets every goal and every ordering, a changed row changes its verdict."""
from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))
import _crosspipe_tables as ct  # noqa: E402


def _paper_rows(scale: float = 7.0) -> list[dict]:
    """P=8 sweep rows whose makespans are the paper's seconds per micro-batch times M (in a unit
    ``scale`` times the paper's), with memory nowhere binding."""
    rows = []
    for (dcs, lat, bw, case), by in ct.PAPER.items():
        if case not in ct.CASES:
            continue
        mem, per = ct.CASES[case]
        r = {"P": 8, "M": 8 * per, "dcs": dcs, "lat": lat, "bw": bw, "memory": mem,
             "greedy_limit": "9 " * 8, "wave_limit": "9 " * 8, "status": "OPTIMAL", "gap": 0.0, "solver_s": 1.0}
        r.update({s: v * scale * r["M"] for s, v in by.items()})
        r.update({f"{s}_peak": "1 " * 8 for s in ("greedy", "optimum", "wave") if s in by})
        rows.append(r)
    return rows


def test_the_papers_own_figures_meet_every_goal_and_ordering():
    out = "\n".join(ct.paper_tables(_paper_rows()))
    n = sum(len(by) for k, by in ct.PAPER.items() if k[3] in ct.CASES)
    assert n == 90
    assert f"- {n} of {n} figures within 10 % of the paper's" in out
    assert "**does not hold**" not in out and "(does not hold)" not in out
    assert out.count("(**holds**)") == 14


def test_a_changed_row_changes_its_verdict_and_names_the_binding_memory():
    rows = _paper_rows()
    r = next(r for r in rows if (r["dcs"], r["lat"], r["bw"], r["memory"]) == (4, 2.0, 2.0, "default"))
    r["wave"] *= 1.5                                   # Wave 50 % slower at (2,2), 4 DCs, Case 1
    r["wave_peak"] = "9 " * 3 + "1 " * 5               # at its limit on 3 ranks
    out = ct.paper_tables(rows)
    assert "- 89 of 90 figures within 10 % of the paper's" in "\n".join(out)
    line = next(x for x in out if x.startswith("| 4 | 2 | 2 | C1 | Wave |"))
    assert "| 1.50 | no |" in line and "delay part x1.50" in line and "binds on 3 of 8 ranks" in line
    assert any("Wave beats UD(Sub)" in x and "Table 6" in x and "(**holds**)" in x for x in out)
    slower = next(x for x in out if "Table 6: Case 3 UD" in x)
    assert "(**holds**)" in slower                   # untouched by a Case 1 change


def test_normalisation_is_per_microbatch_against_zero_delay_zb_h1():
    t = ct.Tables(_paper_rows(scale=3.0))
    for (dcs, lat, bw, case), by in ct.PAPER.items():
        if case in ct.CASES:
            for s, v in by.items():
                assert abs(t.ours(dcs, lat, bw, case, s) - v / ct.PAPER[(dcs, 0.0, 0.0, "C1")]["zb-h1"]) < 1e-12
