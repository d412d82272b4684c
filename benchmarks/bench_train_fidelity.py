"""Training fidelity: `pipert train --profile` on gloo processes, measured step time beside the
simulator's prediction from the same job's measured compute times and the same link model.

1F1B, ZB-H1 and crosspipe-greedy, P processes (default: as many as this host's cores, so that the
prediction with a core per rank is the one to read), the tiny model; without emulated links and
with two datacenters (the first half of the ranks | the second) whose link delays a message by 0.5 and 2 times the
longest unit forward T_F (latency), or occupies it for T_F (bandwidth). T_F is measured first
(a run without links). Each run trains --steps steps; the first --warmup are left out, the
medians of the rest are reported. Two predictions: every rank on a core of its own (the simulator
as it is, with what the job measured beyond its computes: ``pipert.tools.fidelity``), and the ranks
sharing the host's cores (``predicted_step_shared``: CPU seconds of each compute, processor
sharing). The target is judged on the first, with any number of ranks per core: it is fed with
the computes' wall times and the queues' overhead, which hold the waits for a core (`pipert
emulate --real` and `pipert train --profile` at P = 4 on 2 cores: within 10 % where the shared
prediction was not, see the report); the second is a cross-check from CPU seconds.

Writes results/train_fidelity.csv, .context.json and .md (hardware, date, commit);
``--from-csv`` rebuilds the report from the first two.
    python benchmarks/bench_train_fidelity.py [--processes P] [--steps 8] [--warmup 2] [--quick] [--from-csv]
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
M = 8
TARGET = 0.10
NAME = "train_fidelity"


def train(schedule: str, steps: int, link: list[str], P: int) -> list[dict]:
    """One `pipert train --profile --json` run on gloo; its per-step records."""
    cmd = [sys.executable, "-m", "pipert.cli", "train", "--schedule", schedule, "--stages", str(P),
           "--microbatches", str(M), "--steps", str(steps), "--backend", "gloo", "--json", "--profile", *link]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{out.stderr[-3000:]}")
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def row(schedule: str, label: str, recs: list[dict], warmup: int, lat: float, bw: float | None, P: int) -> dict:
    kept = recs[warmup:]
    med = lambda k: statistics.median(r[k] for r in kept)  # noqa: E731
    measured, predicted, busy = med("measured_step_s"), med("predicted_step_s"), med("compute_s_all_ranks")
    shared = med("predicted_shared_step_s")
    cores = len(os.sched_getaffinity(0))
    return {"schedule": schedule, "link": label, "dc_latency_s": lat, "dc_bandwidth_Bps": bw or "",
            "steps": len(kept),
            "measured_s": round(measured, 5), "predicted_s": round(predicted, 5),
            "rel_error": round((predicted - measured) / measured, 4),
            "predicted_shared_s": round(shared, 5), "rel_error_shared": round((shared - measured) / measured, 4),
            "max_forward_s": round(med("max_forward_s"), 6),
            "compute_s_all_ranks": round(busy, 5), "cpu_share": round(busy / (cores * measured), 3),
            "message_overhead_s": round(med("message_overhead_s"), 7),
            "action_overhead_s": round(med("action_overhead_s"), 7),
            "actions_per_rank": actions_per_rank(schedule, P), "load_1min": round(os.getloadavg()[0], 2),
            "processes": P, "cores": cores}


def actions_per_rank(schedule: str, P: int) -> float:
    """Mean length of a rank's program (what the executor runs: pieces merged)."""
    sys.path.insert(0, str(ROOT))
    from pipert.compiler import compile
    prog = compile(schedule, stages=P, microbatches=M)
    return sum(len(a) for a in prog.actions) / prog.num_ranks


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--processes", type=int, default=len(os.sched_getaffinity(0)),
                    help="pipeline ranks, one gloo process each (default: this host's cores)")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="1F1B only, latency ratio 1")
    ap.add_argument("--from-csv", action="store_true", help="rebuild the report from the stored CSV and context")
    args = ap.parse_args(argv)
    if args.from_csv:
        print(f"wrote {rebuild(NAME, report)}")
        return 0
    P = args.processes
    if P < 2:
        raise SystemExit(f"--processes must be >= 2, got {P}")
    if args.steps <= args.warmup:
        raise SystemExit(f"--steps {args.steps} must exceed --warmup {args.warmup}")
    t0 = time.time()
    ctx = context({"processes": P, "steps": args.steps, "warmup": args.warmup,  # the commit and load at the start
                   "scheduling group of this run": scheduling_group()})
    schedules = SCHEDULES[:1] if args.quick else SCHEDULES
    rows = []
    for name in schedules:
        base = train(name, args.steps, [], P)
        rows.append(row(name, "none", base, args.warmup, 0.0, None, P))
        tf = statistics.median(r["max_forward_s"] for r in base[args.warmup:])
        act = 2 * 64 * 64 * 4  # one message: micro-batch of 2 sequences x 64 tokens x hidden 64, float32
        links = [("lat 1xT_F", tf, None)] if args.quick else \
            [("lat 0.5xT_F", 0.5 * tf, None), ("lat 2xT_F", 2 * tf, None), ("bw 1xT_F", 0.0, act / tf)]
        for label, lat, bw in links:
            flags = ["--dcs", "2", "--dc-latency", f"{lat * 1e6:.1f}us"]
            if bw:
                flags += ["--dc-bandwidth", f"{bw:.0f}B/s"]
            rows.append(row(name, label, train(name, args.steps, flags, P), args.warmup, lat, bw, P))
        print(json.dumps(rows[-1]), flush=True)
    finish(NAME, rows, ctx, report, t0)
    return 0


def judged(r: dict) -> float:
    """The error of the prediction the target is judged on: a core per rank, fed with the job's own
    measurements (module doc)."""
    return r["rel_error"]


def report(rows: list[dict], ctx: dict, rebuilt: bool = False) -> str:
    within = [r for r in rows if abs(judged(r)) <= TARGET]
    shared_rows = [r for r in rows if isinstance(r.get("rel_error_shared"), float)]
    P = rows[0]["processes"]
    lines = report_header("Training fidelity: measured step vs the simulator fed with the job's own measurements",
                          ctx, rebuilt)
    lines += ["",
              f"`pipert train --profile` on {P} gloo processes, M = {M}, the tiny model, {ctx['steps']} steps of which "
              f"the first {ctx['warmup']} are left out (medians of the rest). The prediction is the simulator's makespan "
             f"of the program the ranks ran, with each (op, unit)'s mean compute time measured in that step (each "
             f"piece of a split W its own) and the emulated link model, as the executor runs it (a RECV posted "
             f"after its message arrived does not delay it: `pipert/sim/eager.py`). The shared prediction times the same program with each compute's CPU "
             f"seconds and the {P} ranks sharing the host's cores (processor sharing); the target, within "
             f"{TARGET:.0%}, is judged on the first (module doc).", "",
             "| schedule | link | measured s | predicted s | error | shared cores: predicted s | error | T_F s | "
             "compute of all ranks s | CPU share | load (1 min) |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        sp = f"{r['predicted_shared_s']:.4f} | {r['rel_error_shared']:+.1%}" if r in shared_rows else "- | -"
        lines.append(f"| {r['schedule']} | {r['link']} | {r['measured_s']:.4f} | {r['predicted_s']:.4f} | "
                     f"{r['rel_error']:+.1%} | {sp} | {r['max_forward_s']:.5f} | {r['compute_s_all_ranks']:.4f} | "
                     f"{r['cpu_share']:.2f} | {r['load_1min']:.1f} |")
    lines += ["", f"{len(within)} of {len(rows)} runs are within {TARGET:.0%} on the prediction with a core per rank "
                  f"({P} processes on {rows[0]['cores']} cores).", "",
              "Which prediction to read: `predicted_step_s`, also with more ranks than cores (its compute times "
              "and queue overhead were measured with the ranks sharing the cores); `predicted_shared_step_s` "
              "is a cross-check from CPU seconds and processor sharing."]
    if shared_rows:
        better = sum(abs(r["rel_error_shared"]) < abs(r["rel_error"]) for r in shared_rows)
        lines += ["", f"The shared prediction is closer to the measurement than the one with a core per rank in "
                      f"{better} of {len(shared_rows)} runs (median error {statistics.median(r['rel_error_shared'] for r in shared_rows):+.1%} "
                      f"against {statistics.median(r['rel_error'] for r in shared_rows):+.1%})."]
    measured_overheads = [r for r in rows if r.get("action_overhead_s", "") != ""]
    if measured_overheads:
        med = lambda k: statistics.median(r[k] for r in measured_overheads)  # noqa: E731
        lines += ["", f"Both predictions also count what the job measured beyond its computes "
                      f"(`pipert.tools.fidelity`): every link is slower by the messages' transit beyond the link "
                      f"model (median over the runs {med('message_overhead_s') * 1e6:.0f} us), and in the shared "
                      f"prediction each compute carries its process's other CPU (median "
                      f"{med('action_overhead_s') * 1e6:.0f} us per compute: issuing, queue hand-offs, gloo calls, "
                      f"link timers)."]
    lines += ["", load_summary(rows, ctx)]
    misses = [r for r in rows if abs(judged(r)) > TARGET]
    if misses:
        lines += ["", "## Misses, from the data", ""] + [miss(r) for r in misses]
    mean_share = statistics.mean(r["cpu_share"] for r in rows)
    lines += ["", f"Mean CPU share over the runs: {mean_share:.2f} of {rows[0]['cores']} cores "
              f"(1.00 means every core computed for the whole step)."]
    return "\n".join(lines) + "\n"


def _first(loads: str | None) -> float | None:
    """The 1-minute figure of a context's "1, 5, 15 min" load averages (None where not recorded)."""
    try:
        return float(str(loads).split(",")[0])
    except ValueError:
        return None


def load_summary(rows: list[dict], ctx: dict) -> str:
    """The load figures the run recorded, and in how many runs they exceed the run's own processes."""
    loads = [r["load_1min"] for r in rows]
    above = sum(r["load_1min"] > r["processes"] for r in rows)
    start, end = _first(ctx.get("load average (1, 5, 15 min)")), _first(ctx.get("load average at the end (1, 5, 15 min)"))
    ends = ", ".join(f"{k} {v:.2f}" for k, v in (("at the start of the benchmark", start), ("at its end", end))
                     if v is not None)
    return (f"Load: the 1-minute load average read at the end of each run was {min(loads):.1f}-{max(loads):.1f} on "
            f"{rows[0]['cores']} cores, above the run's {rows[0]['processes']} processes in {above} of {len(rows)} "
            f"runs" + (f"; {ends}." if ends else "."))


def miss(r: dict) -> str:
    """One miss: its size, the recorded figures beside it, and load named as a cause only where the
    recorded load exceeds the run's own processes."""
    err = judged(r)
    gap = -err * r["measured_s"]  # measured less predicted
    text = (f"- {r['schedule']}, link {r['link']}: the prediction is "
            f"{abs(err):.1%} {'under' if err < 0 else 'over'} the measured step ({gap * 1e3:+.1f} ms per step, "
            f"{gap / r['actions_per_rank'] * 1e6:+.0f} us per action of a rank's {r['actions_per_rank']:.0f}). The "
            f"ranks' computes add up to {r['compute_s_all_ranks']:.3f} s, a CPU share of {r['cpu_share']:.2f} of "
            f"{r['cores']} cores over the measured step ({r['processes']} processes).")
    if gap <= 0:
        return text
    load = f"The 1-minute load average read at the end of the run, {r['load_1min']:.1f},"
    if r["load_1min"] > r["processes"]:
        return (f"{text} {load} is above the run's {r['processes']} processes: more tasks were runnable than this "
                f"run has processes, so other work may have taken cores that the prediction gives to the ranks.")
    return (f"{text} {load} is not above the run's {r['processes']} processes, so the recorded load does not show "
            f"other work taking cores; this data does not say where the {gap * 1e3:.1f} ms go.")


if __name__ == "__main__":
    sys.exit(main())
