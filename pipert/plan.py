"""``pipert plan``: rank static and CrossPipe schedules for a scenario, compare cross-DC
pipeline parallelism with cross-DC data parallelism (CrossPipe §5.2), and plan PipeMesh
(``--pipemesh``, pipert/planner)."""
from __future__ import annotations

import argparse
import json
import math

__all__ = ["register", "cmd_plan"]


def cmd_plan(args: argparse.Namespace) -> int:
    from .scenario import scenario_from_args
    from .schedules.crosspipe.select import (CROSSPIPE, STATIC, compare_pp_dp, format_pp_dp, format_ranking,
                                             llama3_405b, rank_schedules)
    if args.pipemesh:
        from .planner.cli import cmd_pipemesh
        return cmd_pipemesh(args)
    if args.pp_vs_dp:
        rows = []
        for lat in args.latencies:
            for bw in args.bandwidths:
                rows.append((lat / 1e3, bw * 1e9, compare_pp_dp(llama3_405b(lat / 1e3, bw * 1e9))))
        if args.json:
            print(json.dumps({"model": "llama3-405b", "rows": [
                {"latency_s": lat, "bandwidth_Bps": bw, "pp_step": r.pp_time, "pp_schedule": r.pp_schedule,
                 "dp_step": r.dp_time, "single_dc_step": r.single_dc_time, "pp_vs_dp_speedup": r.speedup,
                 "pp_vs_single_dc": r.slowdown} for lat, bw, r in rows]}))
            return 0
        print("Llama-3-405B over 2 datacenters (TP 8, PP 16, DP 64, s = 8192): cross-DC pipeline vs data parallel")
        print(format_pp_dp(rows))
        return 0
    sc = scenario_from_args(args)
    names = list(STATIC) + list(CROSSPIPE if args.optimal else CROSSPIPE[:2])
    opts = {"crosspipe-optimal": {"time_limit": args.time_limit}}
    sc.per_stage = True
    ranked = rank_schedules(sc.stages, sc.microbatches, sc.cost, sc.links, sc.topology,
                            memory_limit=sc.memory_limit, names=names, options=opts,
                            cost_for=lambda v: sc.cost_for_units(sc.stages * v))
    links = "free links" if sc.links is None else \
        f"{sc.topology.num_dcs} DCs, latency {args.dc_latency:g}, transfer {args.dc_transfer:g}"
    if args.json:
        print(json.dumps({"stages": sc.stages, "microbatches": sc.microbatches, "memory_limit": sc.memory_limit,
                          "ranking": [{"schedule": c.name, "makespan": _finite(c.makespan),
                                       "peak_memory": _finite(c.peak_memory), "fits": c.fits,
                                       "build_s": c.build_s, "note": c.note} for c in ranked]}))
        return 0
    print(f"P={sc.stages} M={sc.microbatches} ({links}); times per stage")
    print(format_ranking(ranked, sc.memory_limit))
    return 0


def _finite(x: float) -> float | None:
    """JSON has no infinity: a candidate that could not be built has None."""
    return x if math.isfinite(x) else None


def register(sub: argparse._SubParsersAction) -> None:
    from .scenario import add_scenario_args
    p = sub.add_parser("plan", help="rank static and CrossPipe schedules; cross-DC PP vs DP; PipeMesh plans")
    add_scenario_args(p)
    p.add_argument("--optimal", action="store_true", help="also solve the CP-SAT optimum (crosspipe-optimal)")
    p.add_argument("--time-limit", type=float, default=30.0, help="CP-SAT time limit in seconds")
    p.add_argument("--pp-vs-dp", action="store_true",
                   help="compare cross-DC pipeline and data parallelism for Llama-3-405B (CrossPipe §5.2)")
    p.add_argument("--latencies", type=float, nargs="+", default=[4.0, 32.0, 128.0], help="ms, with --pp-vs-dp")
    p.add_argument("--bandwidths", type=float, nargs="+", default=[4.0, 64.0, 1024.0], help="GB/s, with --pp-vs-dp")
    from .planner.cli import add_pipemesh_args
    add_pipemesh_args(p)
    p.set_defaults(fn=cmd_plan)
