"""Emulator fidelity: emulated makespan vs the simulator's prediction.

Part 1 (issue: pipert._C / emulation): 1F1B, interleaved 1F1B and ZB-H1 for P in {4, 8, 16},
M in {2P, 4P}, compute of 2-4 ms per action (tf = 1, tb = 2, td = tw = 1 time units of
--unit seconds), without and with a cross-datacenter link (2 DCs, latency 1, transfer 0.5).
Target on a CPU host: within 10%.

Part 2 (issue: CrossPipe): the P = 4, M = 8, 2-DC cases of the CrossPipe sweep with real
delays: latency and transfer time in {0, 1, 2} x T_F, every static and CrossPipe schedule.

Writes results/fidelity.csv and results/fidelity.md.
    python benchmarks/bench_fidelity.py [--unit 0.002] [--quick]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

from _common import context, rebuild, report_header, write_results

from pipert.cost import Links, Topology, UniformCost
from pipert.emulate import emulate
from pipert.schedules import build_schedule

CLASSIC = ["1f1b", "interleaved-1f1b", "zb-h1"]
SWEEP = ["1f1b", "interleaved-1f1b", "zb-h1", "zb-v", "crosspipe-greedy", "crosspipe-wave", "crosspipe-optimal"]


def run_case(part: str, name: str, P: int, M: int, lat: float, tr: float, unit: float, repeats: int) -> dict:
    topo = Topology(P, num_dcs=2)
    links = Links.uniform_dc(topo, lat, tr) if (lat or tr) else None
    opts = {}
    if name.startswith("crosspipe"):
        opts = {"num_dcs": 2, "dc_latency": lat, "dc_transfer": tr}
        if name == "crosspipe-optimal":
            opts["time_limit"] = 10.0
    s = build_schedule(name, stages=P, microbatches=M, **opts)
    cost = UniformCost(tf=1.0, tb=2.0)
    if s.num_units != P:  # V-chunk schedules train the same model: per-unit times / V
        cost = cost.scaled(P / s.num_units)
    runs = [emulate(s, cost, links, time_unit=unit) for _ in range(repeats)]
    measured = statistics.median(r.makespan for r in runs)
    pred = runs[0].predicted
    return {"part": part, "schedule": name, "P": P, "M": M, "dc_latency": lat, "dc_transfer": tr,
            "predicted": pred, "measured": round(measured, 4), "rel_error": round((measured - pred) / pred, 5),
            "spread": round(max(r.makespan for r in runs) - min(r.makespan for r in runs), 4),
            "ms": round(measured * unit * 1e3, 2)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--unit", type=float, default=2e-3, help="seconds per time unit (tf = 1 unit)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="P = 4 only, one repeat")
    ap.add_argument("--from-csv", action="store_true", help="rebuild the report from the stored CSV and context")
    args = ap.parse_args(argv)
    if args.from_csv:
        print(f"wrote {rebuild('fidelity', report)} from the stored CSV")
        return 0
    reps = 1 if args.quick else args.repeats
    rows = []
    t0 = time.time()
    for P in ((4,) if args.quick else (4, 8, 16)):
        for M in (2 * P, 4 * P):
            for name in CLASSIC:
                for lat, tr in ((0.0, 0.0), (1.0, 0.5)):
                    rows.append(run_case("fidelity", name, P, M, lat, tr, args.unit, reps))
                    print(rows[-1], file=sys.stderr)
    for lat in (0.0, 1.0, 2.0):
        for tr in (0.0, 1.0, 2.0):
            for name in SWEEP:
                rows.append(run_case("crosspipe-sweep", name, 4, 8, lat, tr, args.unit, reps))
                print(rows[-1], file=sys.stderr)
    ctx = context(extra={"time unit": f"{args.unit} s (tf = 1 unit); median of {reps} runs; "
                                      f"total {time.time() - t0:.0f} s"})
    write_results("fidelity", rows, ctx, report)
    print("wrote benchmarks/results/fidelity.md")
    return 0


def report(rows: list[dict], ctx: dict, rebuilt: bool = False) -> str:
    fid = [r for r in rows if r["part"] == "fidelity"]
    worst = max(abs(r["rel_error"]) for r in fid)
    lines = report_header("Emulator fidelity: measured vs simulated makespan", ctx, rebuilt) + ["",
             "Compute actions are timed waits on per-rank CPU streams (pipert._C when built), messages go",
             "through the LinkEmulator with the same link model as the simulator.", "",
             "## Static schedules (target on a CPU host: |error| <= 10%)", "",
             "| schedule | P | M | cross-DC link | predicted | measured | error | spread | ms |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in fid:
        link = "no" if not (r["dc_latency"] or r["dc_transfer"]) else f"lat {r['dc_latency']}, transfer {r['dc_transfer']}"
        lines.append(f"| {r['schedule']} | {r['P']} | {r['M']} | {link} | {r['predicted']:g} | {r['measured']:.3f} "
                     f"| {r['rel_error']:+.2%} | {r['spread']:.3f} | {r['ms']} |")
    lines += ["", f"Worst |error|: {worst:.2%} -> target {'met' if worst <= 0.10 else 'MISSED'}.", "",
              "## CrossPipe sweep cases emulated (P = 4, M = 8, 2 DCs; times in T_F)", "",
              "| latency | transfer | " + " | ".join(SWEEP) + " |", "|---|---|" + "---|" * len(SWEEP)]
    sweep = [r for r in rows if r["part"] == "crosspipe-sweep"]
    for lat in (0.0, 1.0, 2.0):
        for tr in (0.0, 1.0, 2.0):
            cells = []
            for name in SWEEP:
                r = next(x for x in sweep if x["schedule"] == name and x["dc_latency"] == lat and x["dc_transfer"] == tr)
                cells.append(f"{r['measured']:.2f} (sim {r['predicted']:g})")
            lines.append(f"| {lat:g} | {tr:g} | " + " | ".join(cells) + " |")
    worst_sweep = max(abs(r["rel_error"]) for r in sweep)
    lines += ["", f"Measured (simulated) makespans; worst |error| over the sweep {worst_sweep:.2%}.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
