"""The CrossPipe paper table is computed from its CSV: claims, floors and reasons follow the rows."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))
import _crosspipe_claims as cc  # noqa: E402
from _common import read_csv  # noqa: E402

ROWS = read_csv(BENCH / "results" / "crosspipe_paper.csv")


def test_link_floor_and_speedups_follow_the_rows():
    for r in ROWS:
        assert r["pp_link_floor"] == pytest.approx(r["microbatches"] * r["message_GB"] / r["bandwidth_GBps"])
        assert r["pp_time"] >= r["pp_link_floor"] - 1e-9          # no PP step beats its link floor
        assert r["speedup"] == pytest.approx(r["dp_time"] / r["pp_time"])
        assert r["dp_overlap_time"] <= r["dp_sim_time"] + 1e-9   # the DP-overlap ops never lengthen the step


def test_the_3x_claim_carries_its_computed_bound():
    first = cc.claims(ROWS)[0]
    best = max((r for r in ROWS if r["bandwidth_GBps"] == 4.0 and r["message"] == cc.PIPERT), key=lambda r: r["speedup"])
    assert first["pipert"] == best["speedup"]
    bound = best["dp_time"] / best["pp_link_floor"]
    assert first["within_goal"] == (abs(best["speedup"] / 3.05 - 1) <= 0.10)
    if not first["within_goal"]:
        assert f"= {bound:.2f}" in first["reason"] and f"{best['pp_link_floor']:.1f} s" in first["reason"]


def test_changed_rows_change_the_verdict():
    rows = [dict(r) for r in ROWS]
    for r in rows:                                    # a PP step 3.05x faster than DP at 4 GB/s
        if r["bandwidth_GBps"] == 4.0 and r["message"] == cc.PIPERT:
            r["pp_time"] = r["dp_time"] / 3.05
            r["speedup"] = 3.05
    assert cc.claims(rows)[0]["within_goal"] and cc.claims(rows)[0]["reason"] == ""


def test_recompute_table_follows_its_rows():
    import _crosspipe_recompute_claims as rc
    rows = read_csv(BENCH / "results" / "crosspipe_paper_recompute.csv")
    assert {(r["lat"], r["bw"]) for r in rows} == set(rc.PAPER)
    for r in rows:
        assert r["per_mb"] == pytest.approx(r["makespan"] / r["microbatches"])
        assert r["microbatches"] == (2 if r["case"] == 1 else 4) * r["stages"]
    c1, c2 = rc._pair(rows, 0.0, 0.0, "ud")
    ratio = c2["per_mb"] / c1["per_mb"]
    assert f"| {ratio:.3f} |" in rc.report(rows, {})
    changed = [dict(r, per_mb=r["per_mb"] * 2) if r is c2 else r for r in rows]   # Case 2 twice as slow
    line = next(x for x in rc.report(changed, {}).splitlines() if x.startswith("| 0 | 0 | ud |"))
    assert "| no |" in line and "delay adds" in line
