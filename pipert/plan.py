"""``pipert plan``: rank static and CrossPipe schedules for a scenario, compare cross-DC
pipeline parallelism with cross-DC data parallelism (CrossPipe §5.2), plan PipeMesh
(``--pipemesh``, pipert/planner), and search every family and layout of a cluster (``--auto``,
pipert/planner/auto.py)."""
from __future__ import annotations

import argparse
import json
import math

__all__ = ["register", "cmd_plan", "check_plan_flags"]


def cmd_plan(args: argparse.Namespace) -> int:
    from .scenario import scenario_from_args
    from .scenario_flags import check_size
    from .schedules.crosspipe.select import (CROSSPIPE, STATIC, compare_pp_dp, format_pp_dp, format_ranking,
                                             llama3_405b, rank_schedules)
    from .planner.autocli import check_auto_flags, cmd_auto
    if args.auto:
        return cmd_auto(args)
    check_auto_flags(args)
    latencies, bandwidths = check_plan_flags(args)
    if args.pipemesh:
        from .planner.cli import cmd_pipemesh
        return cmd_pipemesh(args)
    if args.pp_vs_dp:
        rows = []
        for lat in latencies:
            for bw in bandwidths:
                rows.append((lat, bw, compare_pp_dp(llama3_405b(lat, bw))))
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
    check_size(sc.stages, sc.stages * 2, sc.microbatches, names, f"--stages {sc.stages} --microbatches "
               f"{sc.microbatches} (interleaved and V-shaped candidates: 2 units per stage)")
    opts = {"crosspipe-optimal": {"time_limit": args.time_limit if args.time_limit is not None else 30.0}}
    sc.per_stage = True
    ranked = rank_schedules(sc.stages, sc.microbatches, sc.cost, sc.links, sc.topology,
                            memory_limit=sc.memory_limit, names=names, options=opts,
                            cost_for=lambda v: sc.cost_for_units(sc.stages * v))
    dc = sc.links.specs.get("inter_dc") if sc.links is not None else None
    links = "free links" if dc is None else \
        f"{sc.topology.num_dcs} DCs, latency {dc.latency:g}, transfer {dc.per_message:g}"
    if args.json:
        print(json.dumps({"stages": sc.stages, "microbatches": sc.microbatches, "tp": sc.tp, "sp": sc.sp,
                          "memory_limit": sc.memory_limit,
                          "ranking": [{"schedule": c.name, "makespan": _finite(c.makespan),
                                       "peak_memory": _finite(c.peak_memory), "fits": c.fits,
                                       "build_s": c.build_s, "note": c.note} for c in ranked]}))
        return 0
    tp = f", T={sc.tp}{' SP' if sc.sp else ''} per stage" if sc.tp > 1 else ""
    print(f"P={sc.stages} M={sc.microbatches} ({links}{tp}); times per stage")
    print(format_ranking(ranked, sc.memory_limit))
    return 0


_PIPEMESH = ("paper", "dp", "batch", "memory_budget", "inter_node_gbps", "save")
"""Flags of PipeMesh's planner only (plan --pipemesh); --tp and --sp also size the ranking's
analytic costs (with --model)."""
_NOT_PIPEMESH = ("tf", "tb", "td", "tw", "seq", "micro_batch_size", "dcs", "dc_latency", "dc_transfer",
                 "dc_bandwidth", "memory_limit", "optimal", "time_limit", "latencies", "bandwidths", "pp_vs_dp")
"""Flags plan --pipemesh does not read (its budget is --memory-budget)."""


def check_plan_flags(args: argparse.Namespace) -> tuple[list[float], list[float]]:
    """Every flag of ``plan`` against its mode (ranking, --pp-vs-dp, --pipemesh), before any work:
    a flag the mode does not read is refused naming both. Returns the --pp-vs-dp latencies
    (seconds) and bandwidths (bytes per second)."""
    from .linkflags import parse_bandwidth, parse_duration
    from .scenario_flags import SCENARIO_FLAGS, refuse_given
    if args.pipemesh:
        refuse_given(args, _NOT_PIPEMESH, "does not apply to --pipemesh (PipeMesh's planner reads -P, -V, -M, "
                                          "--model, --device, --ranks-per-node and its own flags)")
        if args.paper:
            refuse_given(args, [n for n in (*SCENARIO_FLAGS, *_PIPEMESH, "tp") if n not in ("paper", "memory_budget")],
                         f"does not apply to --paper {args.paper}: a Table IV configuration fixes the setting "
                         f"(--memory-budget may change its budget)")
        return [], []
    refuse_given(args, _PIPEMESH, "is a flag of PipeMesh's planner: give --pipemesh too")
    if not args.pp_vs_dp:
        refuse_given(args, ("latencies", "bandwidths"), "applies to --pp-vs-dp: give it too")
        if not args.optimal:
            refuse_given(args, ("time_limit",), "limits CP-SAT's search: give --optimal too")
        if args.time_limit is not None and not 0 < args.time_limit < math.inf:
            raise ValueError(f"--time-limit must be a finite time > 0, got {args.time_limit}")
        return [], []
    refuse_given(args, (*SCENARIO_FLAGS, "tp", "sp", "optimal", "time_limit"),
                 "does not apply to --pp-vs-dp, which compares the fixed Llama-3-405B setting of CrossPipe §5.2 "
                 "(its flags: --latencies, --bandwidths)")
    lats = [parse_duration(t, "--latencies") for t in args.latencies or _LATENCIES]
    bws = [parse_bandwidth(t, "--bandwidths") for t in args.bandwidths or _BANDWIDTHS]
    for t, v in zip(args.latencies or (), lats):
        if not 0 < v < math.inf:
            raise ValueError(f"--latencies {t}: each latency must be a finite time > 0")
    return lats, bws


_LATENCIES = ("4ms", "32ms", "128ms")
_BANDWIDTHS = ("4GB/s", "64GB/s", "1024GB/s")


def _finite(x: float) -> float | None:
    """JSON has no infinity: a candidate that could not be built has None."""
    return x if math.isfinite(x) else None


def register(sub: argparse._SubParsersAction) -> None:
    from .scenario_flags import add_scenario_args
    p = sub.add_parser("plan", help="rank static and CrossPipe schedules; cross-DC PP vs DP; PipeMesh plans; "
                       "--auto: every family and layout of a cluster")
    add_scenario_args(p)
    from .linkflags import duration_arg
    p.add_argument("--optimal", action="store_true", help="also solve the CP-SAT optimum (crosspipe-optimal)")
    p.add_argument("--time-limit", type=duration_arg("s"), default=None,
                   help="CP-SAT time limit, with --optimal: 2min, or a bare number of seconds (default 30)")
    p.add_argument("--pp-vs-dp", action="store_true",
                   help="compare cross-DC pipeline and data parallelism for Llama-3-405B (CrossPipe §5.2)")
    p.add_argument("--latencies", nargs="+", default=None,
                   help=f"cross-DC latencies with a unit, with --pp-vs-dp (default: {' '.join(_LATENCIES)})")
    p.add_argument("--bandwidths", nargs="+", default=None,
                   help=f"cross-DC bandwidths with a unit, with --pp-vs-dp (default: {' '.join(_BANDWIDTHS)})")
    from .planner.cli import add_pipemesh_args
    add_pipemesh_args(p)
    p.add_argument("--sp", action="store_true", help="sequence parallelism over the --tp group (ranking with "
                   "--model; --pipemesh always plans with it)")
    from .planner.autocli import add_auto_args
    add_auto_args(p)
    p.set_defaults(fn=cmd_plan)
