"""CrossPipe sweep: static vs CrossPipe schedules under cross-DC latency and bandwidth delay.

Grid: P = 4, M = 8 on every cell; P = 8 on the paper's Tables 5/6 (lat, bw) cells (``--p8-cells
all``: every cell) with M = 16 and, for the paper's Case 3, M = 32; 2 and 4 datacenters (equal
consecutive blocks of ranks), cross-DC latency and link occupancy per message in {0, 0.25, 1, 2} *
T_F, uniform costs T_F = T_D = T_W = 1 (D/W split; 1F1B and interleaved use B = D + W), receive
buffers of M70's boundary size (``M70_ACT_FRACTION`` of a stash), memory limit per rank =
CrossPipe's default budget (the paper's: the rank's peak in the static counterpart, 1F1B plus a
W share for UD; ``default_memory_limit``) ("default") and twice that ("relaxed"). Schedules with two
chunks per rank (interleaved 1F1B, ZB-V, CrossPipe Wave) run the same model cut in twice
as many units (``ChunkScaledCost``). Every makespan is ``pipert.sim.simulate``'s. The Tables 5/6
comparison is ``_crosspipe_tables.py``.

Also: greedy run time vs P and M, CP-SAT time to optimality (or 1% gap) vs P, and the
paper's §5.2 cross-DC PP vs DP comparison. Writes benchmarks/results/crosspipe_sweep.csv
(the sweep), crosspipe_greedy.csv, crosspipe_solver.csv, crosspipe_pp_dp.csv, the context
(crosspipe_sweep.context.json) and crosspipe_sweep.md, built from them alone (``--from-csv``
rebuilds it).

    python benchmarks/bench_crosspipe.py [--quick] [--p8-cells paper|all] [--time-limit S] [--p4-time-limit S]
        [--from-csv]
"""
from __future__ import annotations

import argparse
import functools
import itertools
import math
import statistics
import time
from pathlib import Path

import ortools
from _crosspipe_tables import M70_ACT_FRACTION, PAPER, paper_tables
from _common import RESULTS, context, read_csv, rebuild, report_header, save_context, write_csv

from pipert.cost import Links, Topology, UniformCost
from pipert.schedules import build_schedule
from pipert.schedules.crosspipe import (ChunkScaledCost, best_hint, GreedyConfig, SolverConfig, default_memory_limit,
                                        greedy_best, greedy_schedule, problem_from_cost, solve)
from pipert.schedules.crosspipe.select import PPvsDP, compare_pp_dp, format_pp_dp, llama3_405b
from pipert.sim import simulate

BASE = UniformCost(tf=1.0, td=1.0, tw=1.0, act_bytes=M70_ACT_FRACTION)
STATIC = [("1f1b", 1), ("interleaved-1f1b", 2), ("zb-h1", 1), ("zb-v", 2)]
COLS = ["1f1b", "interleaved-1f1b", "zb-h1", "zb-v", "greedy", "wave", "optimum"]
SOLVER_FIELDS = ["P", "M", "hint", "status", "gap", "makespan", "bound", "wall_s"]


def cell(P: int, dcs: int, lat: float, bw: float, relax: float, tl: float, solver: bool, M: int | None = None) -> dict:
    """One sweep row: every schedule's makespan at M micro-batches (default 2P) on ``dcs`` DCs."""
    M = M or 2 * P
    topo = Topology(P, num_dcs=dcs)
    links = Links.uniform_dc(topo, lat, bw)
    row: dict = {"P": P, "M": M, "dcs": dcs, "lat": lat, "bw": bw, "memory": "default" if relax == 1 else "relaxed"}
    for name, v in STATIC:
        c = BASE if v == 1 else ChunkScaledCost(BASE, v)
        row[name] = simulate(build_schedule(name, stages=P, microbatches=M, chunks=v), c, links).makespan
    for pat, col, c in (("ud", "greedy", BASE), ("wave", "wave", ChunkScaledCost(BASE, 2))):
        lim = tuple(x * relax for x in default_memory_limit(pat, P, M, c))     # per rank
        pr = problem_from_cost(P, M, pat, c, links, memory_limit=lim)
        g = greedy_best(pr, GreedyConfig(sub_blocks=4))
        row[col], row[f"{col}_s"], row[f"{col}_limit"] = g.makespan, g.runtime_s, _per_rank(lim)
        row[f"{col}_peak"] = _per_rank(g.peak_memory)
        if pat == "ud":
            row["greedy_n1"] = greedy_best(pr, GreedyConfig(sub_blocks=1)).makespan
            if solver:
                h = best_hint(pr, c, links, 4)      # the better of the greedy and ZB-H1
                r = solve(pr, SolverConfig(time_limit_s=tl, relative_gap=0.01, sub_blocks=4), hint=h)
                sim = simulate(r.schedule(pr), c, links)
                row["optimum"], row["optimum_peak"] = sim.makespan, _per_rank(sim.peak_memory)
                row.update(bound=r.bound, status=r.status, gap=r.gap, solver_s=r.runtime_s)
                row["greedy_gap"] = g.makespan / row["optimum"] - 1
    return row


def _per_rank(xs) -> str:
    return " ".join(f"{x:g}" for x in xs)


PAPER_CELLS = sorted({(lat, bw) for _, lat, bw, _ in PAPER})
"""The (lat, bw) cells of the paper's Tables 5 and 6."""


def sweep(args: argparse.Namespace) -> list[dict]:
    """P=4 (M=8) on the whole delay grid; P=8 on ``--p8-cells`` (the paper's cells or the whole grid)
    with M=16 (default and relaxed memory) and the paper's Case 3, M=32 on relaxed memory."""
    D = (0.0, 1.0, 2.0) if args.quick else (0.0, 0.25, 1.0, 2.0)
    grid = list(itertools.product(D, D))
    runs = [(4, dcs, relax, 8, grid) for relax in (1.0, 2.0) for dcs in ((2,) if args.quick else (2, 4))]
    if not args.quick:
        p8 = grid if args.p8_cells == "all" else PAPER_CELLS
        runs += [(8, dcs, relax, M, p8) for dcs in (2, 4) for relax, M in ((1.0, 16), (2.0, 16), (2.0, 32))]
    rows = []
    for P, dcs, relax, M, cells in runs:
        tl = args.p4_time_limit if P == 4 else args.time_limit
        for lat, bw in cells:
            rows.append(cell(P, dcs, lat, bw, relax, tl, not args.no_solver, M))
            print(_fmt_row(rows[-1]), flush=True)
    return rows


def _fmt_row(r: dict) -> str:
    vals = " ".join(f"{c}={r[c]:g}" for c in COLS if c in r)
    return f"P={r['P']} M={r['M']} dcs={r['dcs']} lat={r['lat']} bw={r['bw']} mem={r['memory']}: {vals}"


def greedy_scaling(args: argparse.Namespace) -> list[tuple]:
    """(P, M, single-run s, portfolio s) for UD with 4 sub-blocks, 4 DCs, lat = bw = 1."""
    grid = [(4, 8), (8, 16), (16, 32), (16, 64)] if args.quick else \
        [(4, 8), (8, 16), (8, 64), (16, 32), (16, 64), (16, 128), (32, 64), (32, 128)]
    out = []
    for P, M in grid:
        links = Links.uniform_dc(Topology(P, num_dcs=4), 1.0, 1.0)
        pr = problem_from_cost(P, M, "ud", BASE, links, memory_limit=P + 1)
        one = min(greedy_schedule(pr, GreedyConfig(sub_blocks=4)).runtime_s for _ in range(3))
        best = min(greedy_best(pr, GreedyConfig(sub_blocks=4)).runtime_s for _ in range(2))
        out.append((P, M, one, best))
        print(f"greedy P={P} M={M}: {one:.3f} s single, {best:.3f} s portfolio", flush=True)
    return out


def solver_scaling(args: argparse.Namespace) -> list[tuple]:
    """(P, M, hint, status, gap, s) for UD, 2 DCs, lat = bw = 1, time limit 60 s, 1% gap."""
    cases = [(2, True), (4, True), (4, False)] if args.quick else [(2, True), (4, True), (4, False), (6, True),
                                                                    (8, True)]
    out = []
    for P, hint in cases:
        links = Links.uniform_dc(Topology(P, num_dcs=2), 1.0, 1.0)
        pr = problem_from_cost(P, 2 * P, "ud", BASE, links, memory_limit=P + 1)
        t0 = time.perf_counter()
        try:
            r = solve(pr, SolverConfig(time_limit_s=60, relative_gap=0.01, use_hint=hint))
            res = (r.status, r.gap, r.makespan, r.bound)
        except RuntimeError:
            res = ("NONE", float("nan"), float("nan"), float("nan"))
        out.append((P, 2 * P, hint) + res + (time.perf_counter() - t0,))
        print(f"solver P={P} hint={hint}: {res} {out[-1][-1]:.1f} s", flush=True)
    return out


def pp_dp(args: argparse.Namespace) -> list[tuple]:
    lats = (0.004,) if args.quick else (0.004, 0.128)
    bws = (4e9, 64e9, 1024e9) if args.quick else (4e9, 16e9, 64e9, 256e9, 1024e9, 4096e9)
    return [(lat, bw, compare_pp_dp(llama3_405b(lat, bw))) for lat in lats for bw in bws]


# --- report ------------------------------------------------------------------------------

def _limit(cell) -> str:
    """A limit cell of the CSV: one number for every rank, or one per rank (rank 0 first)."""
    return f"{cell:g}" if isinstance(cell, (int, float)) else f"({cell.replace(' ', ', ')})"


def _grid_tables(rows: list[dict]) -> list[str]:
    out = []
    keys = sorted({(r["memory"], r["P"], r["M"], r["dcs"]) for r in rows},
                  key=lambda k: (k[0] != "default", k[1], k[2], k[3]))
    for mem, P, M, dcs in keys:
        sel = [r for r in rows if (r["memory"], r["P"], r["M"], r["dcs"]) == (mem, P, M, dcs)]
        out += ["", f"### P={P}, M={M}, {dcs} DCs, {mem} memory (UD limit {_limit(sel[0]['greedy_limit'])}, "
                    f"Wave limit {_limit(sel[0]['wave_limit'])} per rank)", "",
                "| lat/T_F | bw/T_F | 1F1B | IV1F1B | ZB-H1 | ZB-V | greedy | greedy n_sub=1 | wave | optimum | "
                "status, gap | greedy vs opt | greedy s | solver s |",
                "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|:--|---:|---:|---:|"]
        for r in sel:
            opt = f"{r['optimum']:g}" if "optimum" in r else "-"
            st = f"{r['status']}, {r['gap']:.1%}" if "status" in r else "-"
            gg = f"{r['greedy_gap']:+.1%}" if "greedy_gap" in r else "-"
            ss = f"{r['solver_s']:.1f}" if "solver_s" in r else "-"
            best = min(r[c] for c in COLS if c in r)
            b = {c: f"**{r[c]:g}**" if r[c] == best else f"{r[c]:g}" for c in COLS if c in r}
            cells = [b[c] for c in COLS[:5]] + [f"{r['greedy_n1']:g}", b["wave"], b.get("optimum", opt)]
            out.append(f"| {r['lat']:g} | {r['bw']:g} | " + " | ".join(cells) +
                       f" | {st} | {gg} | {r['greedy_s']:.3f} | {ss} |")
    return out


def _get(rows: list[dict], **kw) -> dict | None:
    return next((r for r in rows if all(r[k] == v for k, v in kw.items())), None)


def _trend_checks(rows: list[dict]) -> list[str]:
    d = [r for r in rows if r["P"] == 4 and r["dcs"] == 2 and r["memory"] == "default"]
    z = _get(d, lat=0.0, bw=0.0)
    hi = max(r["lat"] for r in d)
    h = _get(d, lat=hi, bw=hi)
    out = ["", "### Figure 8 trends (P=4, M=8, 2 DCs, default memory)", ""]
    if not z or not h:
        return out
    split = all(r["zb-h1"] <= r["1f1b"] for r in d)
    out.append(f"- split W beats combined B (ZB-H1 <= 1F1B in every cell): **{'holds' if split else 'differs'}**")
    wave_ud = {k: ("CrossWave" if r["wave"] < r.get("optimum", r["greedy"]) else "CrossUD") for k, r in (("0", z), ("hi", h))}
    out.append(f"- V placement vs UD: at zero delay ZB-V {z['zb-v']:g} / CrossWave {z['wave']:g} vs ZB-H1 "
               f"{z['zb-h1']:g} / CrossUD {z.get('optimum', z['greedy']):g} (better: {wave_ud['0']}); at "
               f"({hi:g},{hi:g}) CrossWave {h['wave']:g} vs CrossUD {h.get('optimum', h['greedy']):g} "
               f"(better: {wave_ud['hi']})")
    slope = {c: (h[c] - z[c]) / z[c] for c in ("1f1b", "interleaved-1f1b", "zb-h1", "zb-v")}
    out.append(f"- delay sensitivity of the static schedules, growth (0,0)->({hi:g},{hi:g}): "
               + ", ".join(f"{c} {v:+.0%}" for c, v in slope.items())
               + f"; most sensitive: {max(slope, key=slope.get)}")
    gaps = [r["greedy_gap"] for r in d if "greedy_gap" in r]
    if gaps:
        out.append(f"- greedy vs optimum (P=4): median {statistics.median(gaps):+.1%}, max {max(gaps):+.1%}, "
                   f"equal in {sum(g < 1e-9 for g in gaps)}/{len(gaps)} cells")
    eq = [(x, _get(d, lat=x, bw=0.0), _get(d, lat=0.0, bw=x)) for x in sorted({r["lat"] for r in d}) if x > 0]
    out.append("- latency vs bandwidth (makespan at (x,0) vs (0,x), CrossUD greedy / ZB-H1): " + "; ".join(
        f"x={x:g}: {a['greedy']:g} vs {b['greedy']:g} / {a['zb-h1']:g} vs {b['zb-h1']:g}" for x, a, b in eq if a and b))
    p8 = [r for r in rows if r["P"] == 8 and r["dcs"] == 2 and r["memory"] == "default"]
    if p8:
        best = lambda r: min(r["greedy"], r.get("optimum", r["greedy"]), r["wave"])
        red1 = max(1 - best(r) / r["1f1b"] for r in p8)
        red2 = max(1 - best(r) / min(r["zb-h1"], r["1f1b"]) for r in p8)
        out += ["", f"### Figure 11 (model level, P=8, M=16, 2 DCs, {len(p8)} (lat, bw) cells)", "",
                f"- largest reduction of the best CrossPipe schedule vs 1F1B: {red1:.1%}; vs the best of 1F1B/ZB-H1: "
                f"{red2:.1%} (paper, measured on M70: up to 33.6% vs original, 21.9% vs optimized 1F1B)"]
    return out


def report(rows: list[dict], ctx: dict, rebuilt: bool = False, folder: Path = RESULTS) -> str:
    """The markdown report from ``crosspipe_sweep.csv`` (``rows``), its context and the greedy,
    solver and PP-vs-DP CSVs beside it in ``folder``."""
    rows = [{k: v for k, v in r.items() if v != ""} for r in rows]  # cells a run did not fill
    gs = [(r["P"], r["M"], r["single_s"], r["portfolio_s"]) for r in read_csv(folder / "crosspipe_greedy.csv")]
    ss = [tuple(r[k] for k in SOLVER_FIELDS) for r in read_csv(folder / "crosspipe_solver.csv")]
    ppdp = [(r["latency_s"], r["bandwidth"], PPvsDP(r["pp_time"], r["pp_schedule"], r["dp_time"], r["single_dc_time"]))
            for r in read_csv(folder / "crosspipe_pp_dp.csv")]
    lines = report_header("CrossPipe sweep: static vs CrossPipe schedules under cross-DC delay", ctx, rebuilt) + ["",
        "Uniform costs T_F = T_D = T_W = 1 (1F1B and interleaved: B = D + W), receive buffers of "
        f"{_ctx_act(ctx)} stash (M70's stage boundary); M = 2P unless a heading says otherwise; DCs are equal consecutive "
        "blocks of ranks; a cross-DC message occupies its link for bw (FIFO per rank's send queue) and arrives lat "
        "later; other messages are free. Makespans in T_F units from `pipert.sim.simulate`. Bold: the best "
        "schedule of the row. greedy = CrossUDSub (4 W sub-blocks, best of 3 "
        "steady-state rules), wave = the same greedy on the V placement, optimum = CP-SAT on the UD placement "
        "(hinted with the better of the greedy and ZB-H1, stopped at 1% gap or the time limit; status HINT = "
        "no better schedule than the hint found).",
        "", "## Sweep"] + _grid_tables(rows)
    lines += ["", "## Comparison with the paper"] + _trend_checks(rows) + paper_tables(rows)
    lines += ["", "## Greedy run time (UD, 4 sub-blocks, 4 DCs, lat = bw = 1)", "",
              "| P | M | single run s | portfolio (3 rules) s |", "|---:|---:|---:|---:|"]
    lines += [f"| {P} | {M} | {a:.3f} | {b:.3f} |" for P, M, a, b in gs]
    if len(gs) > 2:
        lines += ["", f"Growth: single-run time ~ (P*M)^{_slope([P * M for P, M, _, _ in gs], [a for _, _, a, _ in gs]):.2f} "
                      "(least squares on log-log; 1.0 = linear in the number of blocks)." + _greedy_target(gs)]
    lines += ["", "## CP-SAT time to optimality or 1% gap (UD, 2 DCs, lat = bw = 1, M = 2P, limit 60 s)", "",
              "| P | M | greedy hint | status | gap | makespan | bound | wall s |", "|---:|---:|:--|:--|---:|---:|---:|---:|"]
    lines += [f"| {P} | {M} | {'yes' if h else 'no'} | {st} | {gap:.1%} | {mk:g} | {bd:g} | {t:.1f} |"
              for P, M, h, st, gap, mk, bd, t in ss]
    hinted = [(P * M, t) for P, M, h, st, *_, t in ss if h and P > 2]
    if len(hinted) > 1:
        lines += ["", f"Growth (hinted, P >= 4): wall ~ (P*M)^{_slope(*zip(*hinted)):.2f}; the model has O(P*M) "
                      "intervals and O(M^2) order literals per rank."]
    lines += ["", "## Cross-DC PP vs DP (paper §5.2, Llama-3-405B, 2 DCs)", "",
              "PP: the better of CrossPipe UD and Wave (greedy), every PP message carries s*d*2 bytes for each of the "
              "64 DP replicas over the shared cross-DC link. DP: ZB-V in one DC plus 2*alpha + 2N bytes / B "
              "unoverlapped.", "", "```", format_pp_dp(ppdp), "```"]
    return "\n".join(lines) + "\n"


def _ctx_act(ctx: dict) -> str:
    """The receive-buffer size the run used, from its context (runs before it used one stash)."""
    run = ctx.get("run", "")
    return run.split("receive buffer = ")[1].split(" ")[0] if "receive buffer = " in run else "1"


def _greedy_target(gs: list[tuple]) -> str:
    """The verdict on the greedy's target (P=16, M=64, 4 sub-blocks, portfolio < 2 s) where the run has that row."""
    row = next(((a, b) for P, M, a, b in gs if (P, M) == (16, 64)), None)
    if row is None:
        return ""
    return (f" Target P=16, M=64 with 4 sub-blocks < 2 s: {row[0]:.3f} s single / {row[1]:.3f} s portfolio, "
            f"{'met' if row[1] < 2.0 else 'met by the single run only' if row[0] < 2.0 else 'missed'}.")


def _slope(xs, ys) -> float:
    lx, ly = [math.log(x) for x in xs], [math.log(max(y, 1e-6)) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="P=4, 2 DCs, delays {0,1,2}: about 2 minutes")
    ap.add_argument("--time-limit", type=float, default=8.0, help="CP-SAT limit per P=8 cell (s)")
    ap.add_argument("--p4-time-limit", type=float, default=30.0, help="CP-SAT limit per P=4 cell (s)")
    ap.add_argument("--p8-cells", choices=("paper", "all"), default="paper",
                    help="P=8 delay cells: the paper's Tables 5/6 cells (default) or the whole grid")
    ap.add_argument("--no-solver", action="store_true", help="skip the CP-SAT optimum")
    ap.add_argument("--out", type=Path, default=RESULTS, help="output folder")
    ap.add_argument("--from-csv", action="store_true", help="rebuild the report from the stored CSVs and context")
    args = ap.parse_args()
    make = functools.partial(report, folder=args.out)
    if args.from_csv:
        print(f"wrote {rebuild('crosspipe_sweep', make, args.out)} from the stored CSVs")
        return
    ctx = context(extra={"OR-Tools": f"{ortools.__version__}, CP-SAT with 2 workers"})
    t0 = time.perf_counter()
    rows = sweep(args)
    gs = greedy_scaling(args)
    ss = [] if args.no_solver else solver_scaling(args)
    ppdp = pp_dp(args)
    fields = ["P", "M", "dcs", "lat", "bw", "memory", "greedy_limit", "wave_limit"] + COLS + \
        ["greedy_n1", "greedy_peak", "wave_peak", "optimum_peak", "bound", "status", "gap", "greedy_gap", "greedy_s", "wave_s", "solver_s"]
    write_csv(args.out / "crosspipe_greedy.csv", [dict(zip(("P", "M", "single_s", "portfolio_s"), g)) for g in gs])
    write_csv(args.out / "crosspipe_solver.csv", [dict(zip(SOLVER_FIELDS, r)) for r in ss], SOLVER_FIELDS)
    write_csv(args.out / "crosspipe_pp_dp.csv", [dict(latency_s=lat, bandwidth=bw, pp_time=r.pp_time,
                                                      pp_schedule=r.pp_schedule, dp_time=r.dp_time,
                                                      single_dc_time=r.single_dc_time) for lat, bw, r in ppdp])
    p8 = "" if args.quick else ", P=8 on " + ("every (lat, bw) cell" if args.p8_cells == "all" else
                                              "the (lat, bw) cells of the paper Tables 5/6")
    ctx["run"] = (f"{'--quick' if args.quick else 'full'}{p8}; solver limit {args.p4_time_limit:g} s (P=4) / "
                  f"{args.time_limit:g} s (P=8) per cell, stop at 1% gap; receive buffer = {BASE.act_bytes:g} stash; total wall "
                  f"{(time.perf_counter() - t0) / 60:.1f} min")
    write_csv(args.out / "crosspipe_sweep.csv", rows, fields)
    save_context("crosspipe_sweep", ctx, args.out)
    rebuild("crosspipe_sweep", make, args.out, rebuilt=False)
    print(f"wrote {args.out / 'crosspipe_sweep.csv'} and .md in {(time.perf_counter() - t0) / 60:.1f} min")


if __name__ == "__main__":
    main()
