"""Fidelity of `pipert emulate --real`: the model's real units as threads of one process (local
transport, delayed links), measured step time beside the prediction from each step's own
measurements (``pipert.tools.fidelity``, the same as `pipert train --profile`).

1F1B, ZB-H1 and crosspipe-greedy, P ranks (default: as many as this host's cores), M = 8, the
tiny model; without links and with two datacenters whose link adds 2 ms of latency, or carries
32 MB/s. Each run is one `pipert emulate ... --real --json` (one warm-up step, then --steps
measured steps, medians). The target, within 10 %, is judged on the prediction the command says to
read (``read``: a core per rank, with any number of ranks per core).

Writes results/emulate_real.csv, .context.json and .md (hardware, date, commit, load at the start
and the end); ``--from-csv`` rebuilds the report from the first two.
    python benchmarks/bench_emulate_real.py [--ranks P] [--steps 5] [--from-csv]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _common import context, finish, rebuild, report_header, scheduling_group

ROOT = Path(__file__).resolve().parents[1]
SCHEDULES = ["1f1b", "zb-h1", "crosspipe-greedy"]
LINKS = [("none", []), ("lat 2ms", ["--dcs", "2", "--dc-latency", "2ms"]),
         ("bw 32MB/s", ["--dcs", "2", "--dc-bandwidth", "32MB/s"])]
M = 8
TARGET = 0.10
NAME = "emulate_real"


def emulate(schedule: str, ranks: int, steps: int, link: list[str]) -> dict:
    """One `pipert emulate --real --json` run: its JSON object."""
    cmd = [sys.executable, "-m", "pipert.cli", "emulate", schedule, "-P", str(ranks), "-M", str(M), "--real",
           "--real-model", "tiny", "--steps", str(steps), "--json", *link]
    out = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=ROOT,
                         timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def row(schedule: str, label: str, d: dict, ranks: int) -> dict:
    measured, own, shared = d["measured_step_s"], d["predicted_step_s"], d["predicted_shared_step_s"]
    return {"schedule": schedule, "link": label, "measured_s": round(measured, 5), "predicted_s": round(own, 5),
            "rel_error": round((own - measured) / measured, 4),
            "predicted_shared_s": round(shared, 5) if shared is not None else "",
            "rel_error_shared": round((shared - measured) / measured, 4) if shared is not None else "",
            "read": d["read"].split()[0], "ranks": ranks, "cores": len(os.sched_getaffinity(0)),
            "load_1min": round(os.getloadavg()[0], 2)}


def judged(r: dict) -> float:
    """The error of the prediction the command said to read."""
    return r["rel_error_shared"] if r["read"] == "predicted_shared_step_s" else r["rel_error"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=len(os.sched_getaffinity(0)),
                    help="pipeline ranks, threads of one process (default: this host's cores)")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--from-csv", action="store_true", help="rebuild the report from the stored CSV and context")
    args = ap.parse_args(argv)
    if args.from_csv:
        print(f"wrote {rebuild(NAME, report)}")
        return 0
    if args.ranks < 2 or args.steps < 1:
        raise SystemExit(f"--ranks must be >= 2 and --steps >= 1, got {args.ranks} and {args.steps}")
    t0 = time.time()
    ctx = context({"ranks": args.ranks, "steps": args.steps, "scheduling group of this run": scheduling_group()})
    rows = []
    for name in SCHEDULES:
        for label, flags in LINKS:
            rows.append(row(name, label, emulate(name, args.ranks, args.steps, flags), args.ranks))
            print(json.dumps(rows[-1]), flush=True)
    finish(NAME, rows, ctx, report, t0)
    return 0


def report(rows: list[dict], ctx: dict, rebuilt: bool = False) -> str:
    lines = report_header("Emulation with real units: measured step vs the prediction from the step's own "
                          "measurements", ctx, rebuilt)
    ranks, cores = rows[0]["ranks"], rows[0]["cores"]
    lines += ["", f"`pipert emulate SCHEDULE -P {ranks} -M {M} --real --real-model tiny --steps {ctx['steps']}` on "
                  f"{cores} cores: the ranks are threads of one process. Error: predicted less measured, over "
                  f"measured. The target, within {TARGET:.0%}, is judged on the prediction the command says to "
                  f"read (`read`).", "",
              "| schedule | link | measured s | predicted s | error | shared cores: predicted s | error | read | "
              "load (1 min) |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        sp = f"{r['predicted_shared_s']:.4f} | {r['rel_error_shared']:+.1%}" if r["predicted_shared_s"] != "" \
            else "- | -"
        lines.append(f"| {r['schedule']} | {r['link']} | {r['measured_s']:.4f} | {r['predicted_s']:.4f} | "
                     f"{r['rel_error']:+.1%} | {sp} | {r['read']} | {r['load_1min']:.1f} |")
    errs = [judged(r) for r in rows]
    loads = [r["load_1min"] for r in rows]
    lines += ["", f"{sum(abs(e) <= TARGET for e in errs)} of {len(rows)} runs are within {TARGET:.0%} on the "
                  f"prediction read (median error {statistics.median(errs):+.1%}, from {min(errs):+.1%} to "
                  f"{max(errs):+.1%}).", "",
              f"Load: the 1-minute load average read after each run was {min(loads):.1f}-{max(loads):.1f} on "
              f"{cores} cores; at the start {ctx.get('load average (1, 5, 15 min)')}, at the end "
              f"{ctx.get('load average at the end (1, 5, 15 min)')}."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
