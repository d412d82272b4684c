"""Simulator speed: the command ``pipert simulate 1f1b -P 64 -M 512 --json`` end to end (fresh
process: interpreter start, imports, schedule build, one engine pass, JSON), with its import
time measured separately, then simulate() alone over a grid of (stages P, micro-batches M).

The command runs twice over: as this environment starts Python (inherited settings: where
PYTHONDONTWRITEBYTECODE is set, pipert's modules are compiled from source at every start), and
with bytecode cached as an installed package has it (PYTHONPYCACHEPREFIX: a temporary folder that a
first, untimed run fills).

Writes benchmarks/results/sim_speed.csv (the grid), sim_speed_cli.csv (the command and its
import) and sim_speed.md (hardware, date, commit, tables, growth with the number of actions, the
1 s end-to-end and 2 s simulate() targets). Wall time is the best of a few runs (the machine may be shared);
the CPU time of the same run is reported beside it (for a child process: user + system time
from ``resource.getrusage``).

    python benchmarks/bench_sim_speed.py [--quick]
"""
from __future__ import annotations

import argparse
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import RESULTS, context, read_csv, rebuild, report_header, write_csv, write_results

from pipert.cost import UniformCost
from pipert.ir import Schedule
from pipert.schedules import build_schedule
from pipert.sim import simulate

TARGET_S = 2.0
TARGET_PM = (64, 512)
CLI_TARGET_S = 1.0
CLI_ARGV = ["simulate", "1f1b", "-P", "64", "-M", "512", "--json"]
IMPORT_PROBE = "import pipert.cli, pipert.schedules, pipert.sim"
ROOT = Path(__file__).resolve().parents[1]
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


def child_env(pycache: str | None) -> dict[str, str]:
    """The environment of a timed child: this one with the repository first on the path; with
    ``pycache``, bytecode read from and written to that folder."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if pycache is not None:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = pycache
    return env


def time_child(argv: list[str], repeats: int, env: dict[str, str]) -> tuple[float, float]:
    """(best wall s, CPU s of that run) of a fresh Python process running ``argv``."""
    best = (math.inf, math.inf)
    for _ in range(repeats):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        w0 = time.perf_counter()
        subprocess.run([sys.executable, *argv], check=True, env=env, cwd=ROOT, stdout=subprocess.DEVNULL)
        w = time.perf_counter() - w0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        if w < best[0]:
            best = (w, cpu)
    return best


CLI_PARTS = (("python", ["-c", "pass"]), ("import", ["-c", IMPORT_PROBE]),
             ("end_to_end", ["-m", "pipert.cli", *CLI_ARGV]))
NO_BYTECODE = "PYTHONDONTWRITEBYTECODE"
CACHED = "_bytecode"
"""Suffix of the rows timed with bytecode cached."""


def time_cli(repeats: int) -> list[dict]:
    """The interpreter alone, the imports of the simulate command, and the whole command: as this
    environment starts Python, then with bytecode cached."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="pipert-pycache-") as pycache:
        for suffix, env in (("", child_env(None)), (CACHED, child_env(pycache))):
            if suffix:  # fills the cache with every module the command imports
                subprocess.run([sys.executable, *CLI_PARTS[-1][1]], check=True, env=env, cwd=ROOT,
                               stdout=subprocess.DEVNULL)
            for what, argv in CLI_PARTS:
                wall, cpu = time_child(argv, repeats, env)
                rows.append({"what": what + suffix, "command": " ".join(argv), "wall_s": wall, "cpu_s": cpu})
                print(f"{what + suffix:<20} wall={wall:.3f}s cpu={cpu:.3f}s", flush=True)
    return rows


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
    cli = time_cli(args.repeats)
    rows = []
    for P, M in grid:
        s, source = build(P, M)
        wall, cpu, makespan = time_one(s, args.repeats)
        n = s.num_actions()
        rows.append({"P": P, "M": M, "actions": n, "wall_s": wall, "cpu_s": cpu, "us_per_action": 1e6 * wall / n,
                     "makespan": makespan, "expected_makespan": 3.0 * (M + P - 1), "source": source})
        print(f"P={P:3d} M={M:4d} actions={n:7d} wall={wall:.3f}s cpu={cpu:.3f}s "
              f"{1e6 * wall / n:.2f} us/action", flush=True)
    write_csv(RESULTS / "sim_speed_cli.csv", cli)
    write_results("sim_speed", rows, context({NO_BYTECODE: os.environ.get(NO_BYTECODE, "unset")}), report)
    target = next((r for r in rows if (r["P"], r["M"]) == TARGET_PM), None)
    e2e = min((r for r in cli if r["what"].startswith("end_to_end")), key=lambda r: r["wall_s"])
    return 0 if (target is None or target["wall_s"] < TARGET_S) and e2e["wall_s"] < CLI_TARGET_S else 1


def cli_report(cli: list[dict], ctx: dict[str, str]) -> list[str]:
    by = {r["what"]: r for r in cli}
    lines = ["## The command end to end", "", f"`pipert {' '.join(CLI_ARGV)}` in a fresh process; imports timed alone "
             f"with `python -c \"{IMPORT_PROBE}\"`. Each part as this environment starts Python "
             f"(PYTHONDONTWRITEBYTECODE: {ctx.get(NO_BYTECODE, 'not recorded')}; where set, pipert's modules are "
             f"compiled at every start) and, where measured, with bytecode cached (as an installed package).", "",
             "| part | wall s (best) | CPU s | wall s, bytecode cached | CPU s, bytecode cached |",
             "|---|---:|---:|---:|---:|"]
    variants = [s for s in ("", CACHED) if "end_to_end" + s in by]
    parts = {s: _parts(by, s) for s in variants}
    for j, name in enumerate(("interpreter start", "imports (beyond the interpreter)",
                              "build + simulate + output (the rest)", "**end to end**")):
        cells = [f"{parts[s][j]['wall_s']:.3f} | {parts[s][j]['cpu_s']:.3f}" for s in variants]
        lines.append(f"| {name} | " + " | ".join(cells + ["-- | --"] * (2 - len(cells))) + " |")
    lines.append("")
    for s in variants:
        e2e, imp, py = by["end_to_end" + s], by["import" + s], by["python" + s]
        verdict = "PASS" if e2e["wall_s"] < CLI_TARGET_S else "FAIL"
        share = (imp["wall_s"] - py["wall_s"]) / e2e["wall_s"] if e2e["wall_s"] > 0 else 0.0
        how = "with bytecode cached" if s else "as this environment starts Python"
        lines.append(f"Target: end to end in < {CLI_TARGET_S:g} s, {how}: **{verdict}** ({e2e['wall_s']:.3f} s "
                     f"wall, {e2e['cpu_s']:.3f} s CPU); the imports are {share:.0%} of the wall time.")
    return lines + [""]


def _parts(by: dict[str, dict], s: str) -> list[dict]:
    """Interpreter, imports beyond it, the rest, and the whole command, of the rows with suffix s."""
    e2e, imp, py = by["end_to_end" + s], by["import" + s], by["python" + s]
    keys = ("wall_s", "cpu_s")
    return [py, {k: imp[k] - py[k] for k in keys}, {k: e2e[k] - imp[k] for k in keys}, e2e]


def report(rows: list[dict], ctx: dict[str, str], rebuilt: bool = False) -> str:
    """The report of the stored rows; the end-to-end table from ``sim_speed_cli.csv`` beside them."""
    lines = report_header("Simulator speed (1F1B, uniform cost, free links)", ctx, rebuilt) + [""]
    if (RESULTS / "sim_speed_cli.csv").exists():
        lines += cli_report(read_csv(RESULTS / "sim_speed_cli.csv"), ctx)
    lines += ["## simulate() alone (schedule built beforehand)"]
    lines += ["", "| P | M | actions | wall s (best) | CPU s | us / action | makespan ok |",
              "|---:|---:|---:|---:|---:|---:|:---:|"]
    for r in rows:
        ok = "yes" if abs(r["makespan"] - r["expected_makespan"]) < 1e-6 else "NO"
        lines.append(f"| {r['P']} | {r['M']} | {r['actions']} | {r['wall_s']:.3f} | {r['cpu_s']:.3f} | "
                     f"{r['us_per_action']:.2f} | {ok} |")
    if len(rows) >= 2:
        xs = [math.log(r["actions"]) for r in rows]
        ys = [math.log(r["wall_s"]) for r in rows]
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
        lines += ["", f"Growth: wall time ~ actions^{slope:.2f} (least squares on log-log); "
                      f"1.0 is linear in the number of actions."]
    target = next((r for r in rows if (r["P"], r["M"]) == TARGET_PM), None)
    if target is not None:
        verdict = "PASS" if target["wall_s"] < TARGET_S else "FAIL"
        lines += ["", f"Target: P={TARGET_PM[0]}, M={TARGET_PM[1]} simulates in < {TARGET_S:g} s: **{verdict}** "
                      f"({target['wall_s']:.3f} s wall, {target['cpu_s']:.3f} s CPU: wall "
                      f"{target['wall_s'] / target['cpu_s']:.2f}x CPU)."]
    ok = sum(abs(r["makespan"] - r["expected_makespan"]) < 1e-6 for r in rows)
    lines += ["", f"Schedules from: {rows[0]['source']} 1F1B builder. Makespan checked against (M+P-1)(tf+tb): "
                  f"equal in {ok} of {len(rows)} rows.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
