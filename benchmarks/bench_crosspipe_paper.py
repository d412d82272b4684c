"""CrossPipe's paper table: §5.2 cross-DC PP vs DP under the paper's inputs (App. E).

Runs ``compare_pp_dp(llama3_405b(lat, bw))`` for latency {4, 128} ms and bandwidth {4, 16, 64,
256, 1024} GB/s under two PP message conventions (s*d*2*n_DP and s*d*n_DP bytes), with the DP side
also simulated with and without the DP-overlap operations. Writes
benchmarks/results/crosspipe_paper.{csv,context.json,md}; the report is built from the CSV and
context alone (``--from-csv`` rebuilds it). The recompute case (Table 5, Case 2 against Case 1:
greedy UD and Wave at P = 8 in T_F units) goes to crosspipe_paper_recompute.{csv,context.json,md}.

    python benchmarks/bench_crosspipe_paper.py [--from-csv]
"""
from __future__ import annotations

import argparse
import dataclasses
import time

from _common import RESULTS, context, rebuild, write_results
from _crosspipe_claims import HALF, PIPERT, report
from _crosspipe_tables import M70_ACT_FRACTION
from _crosspipe_recompute_claims import PAPER as RECOMPUTE_PAPER, report as recompute_report

from pipert.schedules.crosspipe.select import compare_pp_dp, llama3_405b

LATENCIES = (0.004, 0.128)
BANDWIDTHS_GBPS = (4.0, 16.0, 64.0, 256.0, 1024.0)


def run() -> list[dict]:
    rows = []
    for msg in (PIPERT, HALF):
        for lat in LATENCIES:
            for bw in BANDWIDTHS_GBPS:
                cfg = llama3_405b(lat, bw * 1e9)
                if msg == HALF:
                    cfg = dataclasses.replace(cfg, pp_message_bytes=cfg.pp_message_bytes / 2)
                r = compare_pp_dp(cfg, simulate_dp=True)
                rows.append(dict(message=msg, latency_s=lat, bandwidth_GBps=bw, microbatches=cfg.microbatches,
                                 tf=cfg.tf, message_GB=cfg.pp_message_bytes / 1e9, pp_time=r.pp_time,
                                 pp_schedule=r.pp_schedule, pp_link_floor=r.pp_link_floor, dp_time=r.dp_time,
                                 dp_sim_time=r.dp_sim_time, dp_overlap_time=r.dp_overlap_time,
                                 single_dc_time=r.single_dc_time, speedup=r.speedup, slowdown=r.slowdown))
                print(f"{msg} {lat * 1e3:g} ms {bw:g} GB/s: PP {r.pp_time:.2f} DP {r.dp_time:.2f} "
                      f"speedup {r.speedup:.2f}", flush=True)
    return rows


KEPT_FRACTION = M70_ACT_FRACTION
"""Boundary input per stash of an M70 stage (the F input a recompute keeps)."""


def run_recompute(stages: int = 8) -> list[dict]:
    """Table 5's Case 1 (M = 2P) and Case 2 (M = 4P, recompute=full) for greedy UD and Wave."""
    from pipert.cost import Links, Topology, UniformCost
    from pipert.schedules import build_schedule
    from pipert.schedules.crosspipe import ChunkScaledCost
    from pipert.sim import simulate
    base = UniformCost(tf=1.0, td=1.0, tw=1.0, act_bytes=KEPT_FRACTION)
    rows = []
    for lat, bw in RECOMPUTE_PAPER:
        links = Links.uniform_dc(Topology(stages, num_dcs=2), lat, bw)
        for pattern, name in (("ud", "crosspipe-greedy"), ("wave", "crosspipe-wave")):
            cost = base if pattern == "ud" else ChunkScaledCost(base, 2)
            for case, m, rec in ((1, 2 * stages, "none"), (2, 4 * stages, "full")):
                s = build_schedule(name, stages=stages, microbatches=m, cost=cost, links=links, recompute=rec)
                r = simulate(s, cost, links)
                rows.append(dict(lat=lat, bw=bw, pattern=pattern, case=case, stages=stages, microbatches=m,
                                 recompute=rec, kept_fraction=KEPT_FRACTION, makespan=r.makespan,
                                 per_mb=r.makespan / m, peak=max(r.peak_memory)))
                print(f"recompute case {case} ({lat:g}, {bw:g}) {pattern}: {r.makespan / m:.3f} T_F per micro-batch",
                      flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--from-csv", action="store_true", help="rebuild the report from the stored CSV and context")
    args = ap.parse_args()
    if args.from_csv:
        print(f"wrote {rebuild('crosspipe_paper', report)}")
        print(f"wrote {rebuild('crosspipe_paper_recompute', recompute_report)}")
        return
    ctx = context()
    t0 = time.perf_counter()
    rows = run()
    ctx["run"] = f"total wall {time.perf_counter() - t0:.0f} s"
    write_results("crosspipe_paper", rows, ctx, report)
    t1 = time.perf_counter()
    rec = run_recompute()
    write_results("crosspipe_paper_recompute", rec, {**ctx, "run": f"total wall {time.perf_counter() - t1:.0f} s"},
                  recompute_report)
    print(f"wrote {RESULTS / 'crosspipe_paper.md'} and {RESULTS / 'crosspipe_paper_recompute.md'} in "
          f"{time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
