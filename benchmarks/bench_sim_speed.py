"""Simulator speed: time simulate() on 1F1B over a grid of (stages P, micro-batches M).

Writes benchmarks/results/sim_speed.csv and sim_speed.md (hardware, date, commit, table,
growth with P*M, pass/fail against the 2 s target for P=64, M=512). Wall time is the best
of a few runs (the machine may be shared); CPU time of the same run is reported beside it.

    python benchmarks/bench_sim_speed.py [--quick]
"""
from __future__ import annotations

import argparse
import math
import sys
import time

from _common import context, rebuild, report_header, write_results

from pipert.cost import UniformCost
from pipert.ir import Schedule
from pipert.schedules import build_schedule
from pipert.sim import simulate

TARGET_S = 2.0
TARGET_PM = (64, 512)
GRID = [(4, 8), (4, 64), (8, 32), (8, 128), (16, 64), (16, 256), (32, 128), (32, 512), (64, 128), (64, 256), (64, 512)]
QUICK = [(4, 8), (8, 32), (16, 64)]


def build(P: int, M: int) -> tuple[Schedule, str]:
    return build_schedule("1f1b", stages=P, microbatches=M), "registry"


def time_one(s: Schedule, repeats: int) -> tuple[float, float, float]:
    """(best wall s, CPU s of that run, makespan)."""
    cost = UniformCost(tf=1.0, tb=2.0)
    best = (math.inf, math.inf, 0.0)
    for _ in range(repeats):
        w0, c0 = time.perf_counter(), time.process_time()
        res = simulate(s, cost)
        w, c = time.perf_counter() - w0, time.process_time() - c0
        if w < best[0]:
            best = (w, c, res.makespan)
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small grid only (smoke run)")
    ap.add_argument("--repeats", type=int, default=3, help="runs per point; the best wall time is kept")
    ap.add_argument("--from-csv", action="store_true", help="rebuild the report from the stored CSV and context")
    args = ap.parse_args(argv)
    if args.from_csv:
        print(f"wrote {rebuild('sim_speed', report)} from the stored CSV")
        return 0
    grid = QUICK if args.quick else GRID
    rows = []
    for P, M in grid:
        s, source = build(P, M)
        wall, cpu, makespan = time_one(s, args.repeats)
        n = s.num_actions()
        rows.append({"P": P, "M": M, "actions": n, "wall_s": wall, "cpu_s": cpu, "us_per_action": 1e6 * wall / n,
                     "makespan": makespan, "expected_makespan": 3.0 * (M + P - 1), "source": source})
        print(f"P={P:3d} M={M:4d} actions={n:7d} wall={wall:.3f}s cpu={cpu:.3f}s "
              f"{1e6 * wall / n:.2f} us/action", flush=True)
    write_results("sim_speed", rows, context(), report)
    target = next((r for r in rows if (r["P"], r["M"]) == TARGET_PM), None)
    return 0 if target is None or target["wall_s"] < TARGET_S else 1


def report(rows: list[dict], ctx: dict[str, str], rebuilt: bool = False) -> str:
    lines = report_header("Simulator speed (1F1B, uniform cost, free links)", ctx, rebuilt)
    lines += ["", "| P | M | actions | wall s (best) | CPU s | us / action | makespan ok |",
              "|---:|---:|---:|---:|---:|---:|:---:|"]
    for r in rows:
        ok = "yes" if abs(r["makespan"] - r["expected_makespan"]) < 1e-6 else "NO"
        lines.append(f"| {r['P']} | {r['M']} | {r['actions']} | {r['wall_s']:.3f} | {r['cpu_s']:.3f} | "
                     f"{r['us_per_action']:.2f} | {ok} |")
    if len(rows) >= 2:
        xs = [math.log(r["P"] * r["M"]) for r in rows]
        ys = [math.log(r["wall_s"]) for r in rows]
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
        lines += ["", f"Growth: wall time ~ (P*M)^{slope:.2f} (least squares on log-log); "
                      f"1.0 is linear in the number of actions."]
    target = next((r for r in rows if (r["P"], r["M"]) == TARGET_PM), None)
    if target is not None:
        verdict = "PASS" if target["wall_s"] < TARGET_S else "FAIL"
        lines += ["", f"Target: P={TARGET_PM[0]}, M={TARGET_PM[1]} simulates in < {TARGET_S:g} s: **{verdict}** "
                      f"({target['wall_s']:.3f} s wall, {target['cpu_s']:.3f} s CPU). Wall time on a shared "
                      f"machine grows with its load (see the load average above); CPU time is the work itself."]
    lines += ["", f"Schedules from: {rows[0]['source']} 1F1B builder. Makespan checked against (M+P-1)(tf+tb).", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
