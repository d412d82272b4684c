"""CrossPipe's paper table: §5.2 cross-DC PP vs DP under the paper's inputs (App. E).

Runs ``compare_pp_dp(llama3_405b(lat, bw))`` for latency {4, 128} ms and bandwidth {4, 16, 64,
256, 1024} GB/s under two PP message conventions (s*d*2*n_DP and s*d*n_DP bytes), with the DP side
also simulated with and without the DP-overlap operations. Writes
benchmarks/results/crosspipe_paper.{csv,context.json,md}; the report is built from the CSV and
context alone (``--from-csv`` rebuilds it).

    python benchmarks/bench_crosspipe_paper.py [--from-csv]
"""
from __future__ import annotations

import argparse
import dataclasses
import time

from _common import RESULTS, context, rebuild, write_results
from _crosspipe_claims import HALF, PIPERT, report

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--from-csv", action="store_true", help="rebuild the report from the stored CSV and context")
    args = ap.parse_args()
    if args.from_csv:
        print(f"wrote {rebuild('crosspipe_paper', report)}")
        return
    ctx = context()
    t0 = time.perf_counter()
    rows = run()
    ctx["run"] = f"total wall {time.perf_counter() - t0:.0f} s"
    write_results("crosspipe_paper", rows, ctx, report)
    print(f"wrote {RESULTS / 'crosspipe_paper.md'} in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
