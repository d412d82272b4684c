"""CrossPipe in `pipert train` against 1F1B under an emulated cross-DC link: measured step times.

Real `pipert train --profile --json` jobs on gloo processes (P = 2 by default: one stage per
datacenter, as many ranks as this host's cores), the tiny model, M = 8, the same seed for every
run. Schedules: 1f1b; crosspipe-greedy as train builds it from the link flags (told of the link:
``pipert.linkplan``); and crosspipe-greedy link-blind: the program train builds without link
flags, exported to a schedule file (`pipert export`, uniform costs) and run under the link (a
schedule file is never re-planned). Links: none; two datacenters with 20 ms latency; and a
bandwidth-bound link that holds one boundary message for about one unit forward T_F (T_F: the
median ``max_forward_s`` of the first 1F1B run without links). Without links, told and blind are
one program, so that control runs 1f1b and crosspipe-greedy only.

Every round runs each (schedule, link) once, rounds alternate their order (ABAB... then ...BABA),
each run trains --steps steps of which the first --warmup are left out. The report compares
medians of the kept step times: the ratio of two medians with a 95 % bootstrap interval
(resampling each run's kept steps, fixed seed: the report is a function of the CSV) and the
range of the per-round ratios; beside them the simulator's prediction from each step's own
measured computes (``predicted_step_s`` of `train --profile`). Same seed: every run's loss
sequence must equal the 1F1B no-link run's of its round within float32 rounding (``LOSS_TOL``).

Writes results/crosspipe_train.csv (one row per step), .context.json and .md; ``--from-csv``
rebuilds the report from the first two.
    python benchmarks/bench_crosspipe_train.py [--processes 2] [--rounds 4] [--steps 12] [--warmup 1]
                                               [--quick] [--from-csv]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import context, finish, rebuild, report_header, scheduling_group
from _crosspipe_train_stats import comparison, loss_check, median_table

ROOT = Path(__file__).resolve().parents[1]
NAME = "crosspipe_train"
M, BATCH, SEQ, SEED = 8, 16, 64, 0
LATENCY = "20ms"
ONE_F1B, TOLD, BLIND = "1f1b", "crosspipe-greedy", "crosspipe-greedy link-blind"


def train(schedule: str, P: int, steps: int, link: list[str]) -> list[dict]:
    """One `pipert train --profile --json` run on gloo: its per-step records."""
    cmd = [sys.executable, "-m", "pipert.cli", "train", "--schedule", schedule, "--stages", str(P),
           "--microbatches", str(M), "--batch-size", str(BATCH), "--seq", str(SEQ), "--seed", str(SEED),
           "--steps", str(steps), "--backend", "gloo", "--json", "--profile", *link]
    out = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=ROOT,
                         timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{out.stderr[-3000:]}")
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def blind_program(P: int, folder: str) -> str:
    """crosspipe-greedy as train builds it without link flags, as a schedule file; checked equal
    (action by action) to what train compiles from that file and from the name."""
    sys.path.insert(0, str(ROOT))
    from pipert.train import TrainConfig, build_program
    path = str(Path(folder) / "crosspipe-greedy-blind.json")
    subprocess.run([sys.executable, "-m", "pipert.cli", "export", TOLD, "-P", str(P), "-M", str(M), "-o", path],
                   check=True, env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=ROOT, timeout=300)
    shape = dict(stages=P, microbatches=M, batch_size=BATCH, seq=SEQ, seed=SEED)
    named, filed = build_program(TrainConfig(schedule=TOLD, **shape)), build_program(TrainConfig(schedule=path, **shape))
    if [list(map(str, a)) for a in named.actions] != [list(map(str, a)) for a in filed.actions]:
        raise RuntimeError(f"{path}: the exported program differs from train's {TOLD} without link flags")
    return path


def rows_of(rnd: int, order: int, schedule: str, link: str, lat: float, bw: float | None, recs: list[dict],
            warmup: int, P: int) -> list[dict]:
    load = round(os.getloadavg()[0], 2)
    return [{"round": rnd, "order": order, "schedule": schedule, "link": link, "dc_latency_s": lat,
             "dc_bandwidth_Bps": round(bw) if bw else "", "step": r["step"], "kept": r["step"] >= warmup,
             "step_s": round(r["measured_step_s"], 6), "predicted_step_s": round(r["predicted_step_s"], 6),
             "compute_s": round(r["compute_s_all_ranks"], 6), "max_forward_s": round(r["max_forward_s"], 6), "loss": r["loss"],
             "program": recs[0]["program_digest"][:12], "load_1min": load, "processes": P,
             "cores": len(os.sched_getaffinity(0))} for r in recs]


def runs(quick: bool) -> list[tuple[str, str]]:
    """(schedule, link label) of one round, in order."""
    lat = [(s, "lat") for s in (ONE_F1B, TOLD, BLIND)]
    return [(ONE_F1B, "none"), (TOLD, "none"), *lat] + ([] if quick else [(s, "bw") for s in (ONE_F1B, TOLD, BLIND)])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--processes", type=int, default=2, help="pipeline ranks P, one gloo process each (default 2)")
    ap.add_argument("--rounds", type=int, default=4, help="interleaved repeats of every run (default 4)")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=1, help="first steps of each run left out (default 1)")
    ap.add_argument("--quick", action="store_true", help="one round of 4 steps, no bandwidth case")
    ap.add_argument("--from-csv", action="store_true", help="rebuild the report from the stored CSV and context")
    args = ap.parse_args(argv)
    if args.from_csv:
        print(f"wrote {rebuild(NAME, report)}")
        return 0
    if args.quick:
        args.rounds, args.steps = 1, 4
    P = args.processes
    if P < 2 or P % 2:
        raise SystemExit(f"--processes must be even and >= 2 (two datacenters of P/2 ranks), got {P}")
    if args.rounds < 1:
        raise SystemExit(f"--rounds must be >= 1, got {args.rounds}")
    if args.steps <= args.warmup + 1:
        raise SystemExit(f"--steps {args.steps} must exceed --warmup {args.warmup} by at least 2")
    t0 = time.time()
    from pipert.models import model_config
    message = BATCH // M * SEQ * model_config("tiny").hidden * 4   # one boundary activation, float32
    ctx = context({"processes": P, "rounds": args.rounds, "steps": args.steps, "warmup": args.warmup,
                   "model": "tiny", "M": M, "batch size": BATCH, "seq": SEQ, "seed": SEED,
                   "boundary message bytes": message, "scheduling group of this run": scheduling_group()})
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as folder:
        blind = blind_program(P, folder)
        bw = None
        for rnd in range(args.rounds):
            order = runs(args.quick)
            for i, (schedule, label) in enumerate(order if rnd % 2 == 0 else order[::-1]):
                if label == "bw" and bw is None:
                    raise RuntimeError("the bandwidth case needs T_F from a no-link 1F1B run of round 0 first")
                flags = {"none": [], "lat": ["--dcs", "2", "--dc-latency", LATENCY],
                         "bw": ["--dcs", "2", "--dc-bandwidth", f"{bw or 0:.0f}B/s"]}[label]
                recs = train(blind if schedule == BLIND else schedule, P, args.steps, flags)
                lat = float(LATENCY[:-2]) * 1e-3 if label == "lat" else 0.0
                rows += rows_of(rnd, i, schedule, label, lat, bw if label == "bw" else None, recs, args.warmup, P)
                kept = recs[args.warmup:]
                if bw is None and (schedule, label) == (ONE_F1B, "none"):
                    bw = message / statistics.median(r["max_forward_s"] for r in kept)
                print(f"round {rnd} {schedule} {label}: median step "
                      f"{statistics.median(r['measured_step_s'] for r in kept):.4f} s", flush=True)
    finish(NAME, rows, ctx, report, t0)
    return 0


LINK_TEXT = {"none": "no link", "lat": "20 ms between the datacenters",
             "bw": "bandwidth-bound (one boundary message holds the link for about one T_F)"}


def report(rows: list[dict], ctx: dict, rebuilt: bool = False) -> str:
    P, rounds = rows[0]["processes"], ctx["rounds"]
    bws = {r["dc_bandwidth_Bps"] for r in rows if r["link"] == "bw"}
    lines = report_header("CrossPipe vs 1F1B in `pipert train` under an emulated cross-DC link", ctx, rebuilt)
    lines += ["", f"`pipert train --profile --json` on {P} gloo processes ({rows[0]['cores']} cores), two datacenters "
                  f"of {P // 2} rank(s) each, the tiny model, M = {M}, seed {ctx['seed']}; {rounds} interleaved "
                  f"round(s), {ctx['steps']} steps per run of which the first {ctx['warmup']} are left out. "
                  f"Links: none; latency {LATENCY}" + (f"; bandwidth {next(iter(bws)) / 1e6:.2f} MB/s (one "
                  f"{ctx['boundary message bytes']}-byte boundary message per T_F)" if bws else "") + ". "
                  f"`{BLIND}` is the program train builds without link flags, run under the link from a schedule "
                  f"file. Median: of the kept steps of every round; interval: 95 % bootstrap interval of the "
                  f"median; predicted: the simulator from each step's measured computes (median); compute of all ranks: "
                  f"the seconds the ranks' computes took, summed (median).", ""]
    lines += median_table(rows)
    lines += ["", "## Comparisons", ""]
    for link in ("lat", "bw"):
        if any(r["link"] == link for r in rows):
            lines.append(comparison(rows, link, TOLD, ONE_F1B, LINK_TEXT[link]))
            lines.append(comparison(rows, link, TOLD, BLIND, LINK_TEXT[link]))
    lines.append(comparison(rows, "none", TOLD, ONE_F1B, LINK_TEXT["none"], control=True))
    lines += ["", "## Same training", "", loss_check(rows, ONE_F1B), "", _load(rows, ctx)]
    return "\n".join(lines) + "\n"


def _load(rows: list[dict], ctx: dict) -> str:
    loads = [r["load_1min"] for r in rows]
    return (f"Load: the 1-minute load average read after each run was {min(loads):.2f}-{max(loads):.2f} on "
            f"{rows[0]['cores']} cores ({rows[0]['processes']} processes per run); at the start "
            f"{ctx.get('load average (1, 5, 15 min)')}, at the end {ctx.get('load average at the end (1, 5, 15 min)')}.")


if __name__ == "__main__":
    sys.exit(main())
