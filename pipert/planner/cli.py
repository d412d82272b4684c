"""``pipert plan --pipemesh``: PipeMesh's plan (q, sequences, ZeRO mix, recomputation), its
predicted iteration time and per-component memory, beside Megatron and breadth-first under
the same budget. The mesh is T x P x D devices (TP innermost, inside a node, with sequence
parallelism, as in the paper); without ``--tp`` (and ``--paper``) every T that divides the GPUs
per node and shards the model is planned, and the one of most sequences per second per device
that fits the budget is chosen."""
from __future__ import annotations

import argparse
import json
from typing import Any

from .pipemesh import Components
from .search import GiB, Plan, plan, plan_fixed
from .workload import PAPER_MODELS, Cluster, chunk_ops, workload

__all__ = ["add_pipemesh_args", "cmd_pipemesh", "choose_chunks", "build_problem"]


def add_pipemesh_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("PipeMesh planner (with --pipemesh; -P, -V = M, --model, --device, "
                             "--ranks-per-node = GPUs per node also apply)")
    g.add_argument("--pipemesh", action="store_true", help="plan PipeMesh (q, ZeRO mix, recomputation) for a model")
    g.add_argument("--paper", default=None, help="a Table IV configuration with the paper's measured times: "
                   "gpt3-a100, gpt3-v100, llama2-v100, falcon-v100")
    g.add_argument("--dp", type=int, default=None, help="data-parallel replicas D (default 3)")
    g.add_argument("--tp", type=int, default=None, help="tensor-parallel size T with sequence parallelism, inside "
                   "a node (default: every divisor of --ranks-per-node that shards the model's heads, the best per "
                   "device chosen; --paper: the paper's T = 8)")
    g.add_argument("--batch", type=int, default=None, help="global batch in sequences; B = batch / D "
                   "(default: D x --microbatches)")
    g.add_argument("--memory-budget", type=float, default=None, help="GiB per device (default: the device's memory)")
    g.add_argument("--inter-node-gbps", type=float, default=None,
                   help="network bandwidth of one node, Gbit/s (default 100)")
    g.add_argument("--json", action="store_true", help="print one JSON object")
    g.add_argument("--save", default=None, metavar="FILE", help="write the plan (sequences, ZeRO mix, buckets, "
                   "recomputation, q) as JSON; pipert train --plan FILE runs it")


def choose_chunks(model_layers: int, stages: int, make: Any) -> int:
    """The paper's rule: the largest M (dividing layers / P) with C_PP <= C^fwd; ``make(M)``
    returns the Components for M."""
    best = 1
    for m in range(1, model_layers // stages + 1):
        if model_layers % (stages * m):
            continue
        c = make(m)
        if c.pp_comm <= c.fwd:
            best = m
    return best


def build_problem(args: argparse.Namespace, tp: int | None = None, system: str = "pipemesh",
                  chunks: int | None = None) -> tuple[Components, int, list, float, str]:
    """(components, kept bytes per pass, chunk ops, budget in bytes, description) from the flags;
    ``tp`` replaces --tp and ``chunks`` -V (not with --paper, where ``system`` names the Table IV
    row, "pipemesh" or "megatron", whose own M and times are used)."""
    from ..cost.devices import DeviceSpec
    if args.paper:
        from .paper import TABLE_IV, problem
        if args.paper not in TABLE_IV:
            raise ValueError(f"--paper {args.paper!r} unknown; allowed: {', '.join(TABLE_IV)}")
        cfg = TABLE_IV[args.paper]
        budget = args.memory_budget * GiB if args.memory_budget is not None else None
        c, base, ops, budget = problem(cfg, system, budget)
        return c, base, ops, budget, (f"{cfg.model.name} on {cfg.cluster.upper()} (Table IV: B={cfg.batch}, "
                                      f"T,P,D={cfg.tp},{cfg.stages},{cfg.dp}, sequence parallel); times in ms")
    from ..scenario_flags import DEFAULT_MICROBATCHES, DEFAULT_STAGES
    name = args.model or "gpt3-58b"
    if name not in PAPER_MODELS:
        raise ValueError(f"--model {name!r} unknown with --pipemesh; allowed: {', '.join(PAPER_MODELS)}")
    m = PAPER_MODELS[name]
    dev = DeviceSpec.preset(args.device or "h100")
    gbps = args.inter_node_gbps if args.inter_node_gbps is not None else 100.0
    if not gbps > 0:
        raise ValueError(f"--inter-node-gbps {gbps}: must be > 0")
    dp, tp = args.dp or 3, tp or args.tp or 8
    stages = args.stages or DEFAULT_STAGES
    if m.layers % stages:
        allowed_p = ", ".join(str(p) for p in range(1, m.layers + 1) if m.layers % p == 0)
        raise ValueError(f"-P {stages}: {m.name}'s {m.layers} layers do not split into {stages} stages of equal "
                         f"chunks; allowed -P: {allowed_p}")
    cluster = Cluster(dev, args.ranks_per_node or 8, gbps)
    from .mesh import tp_candidates
    allowed = tp_candidates(m, cluster.gpus_per_node)
    if tp not in allowed:
        raise ValueError(f"--tp {tp}: a tensor-parallel group (with sequence parallelism) lies inside a node of "
                         f"--ranks-per-node {cluster.gpus_per_node} GPUs and splits {m.name}'s {m.heads} heads, "
                         f"{m.kv_heads} KV heads and {m.seq} tokens; allowed --tp: {', '.join(map(str, allowed))}")
    if args.batch is not None and (args.batch < 1 or args.batch % dp):
        raise ValueError(f"--batch {args.batch}: must be a positive multiple of --dp {dp}")
    B = args.batch // dp if args.batch is not None else (args.microbatches or DEFAULT_MICROBATCHES)

    def make(M: int) -> tuple:
        return workload(m, cluster, tp=tp, stages=stages, dp=dp, chunks=M, microbatches=B)

    M = chunks or args.chunks or choose_chunks(m.layers, stages, lambda k: make(k)[0])
    c, base, ops = make(M)
    budget = (args.memory_budget * GiB) if args.memory_budget is not None else dev.memory
    return c, base, ops, budget, (f"{m.name} on {dev.name}, {cluster.gpus_per_node} GPUs/node, "
                                  f"{cluster.inter_node_gbps:g} Gb/s per node; T={tp} (sequence parallel); "
                                  f"times in s")


def baseline(kind: str, args: argparse.Namespace, tp: int, pipemesh_problem: tuple) -> Plan | str:
    """``kind`` ("megatron" or "breadth-first") at its own best setting under PipeMesh's budget
    (the plan, or why none fits). With --paper: Megatron at the paper's Megatron M and times,
    breadth-first at PipeMesh's M (the paper's Fold3D runs used PipeMesh's M). Otherwise every M
    that splits the layers into equal chunks is planned (or -V's alone), and the fastest kept."""
    budget = pipemesh_problem[3]
    if args.paper:
        c, base, ops, _ = pipemesh_problem if kind == "breadth-first" else \
            build_problem(args, system="megatron")[:4]
        try:
            return plan_fixed(kind, c, ops, budget, base)
        except ValueError as e:
            return str(e)
    c0 = pipemesh_problem[0]
    layers = PAPER_MODELS[args.model or "gpt3-58b"].layers
    tried, reasons = [], []
    for m in ([args.chunks] if args.chunks else range(1, layers // c0.stages + 1)):
        if layers % (c0.stages * m):
            continue
        c, base, ops, _, _ = build_problem(args, tp, chunks=m)
        try:
            tried.append(plan_fixed(kind, c, ops, budget, base))
        except ValueError as e:
            reasons.append(f"M={m}: {e}")
    if not tried:
        return "; ".join(reasons[:3]) + (f" (and {len(reasons) - 3} more M)" if len(reasons) > 3 else "")
    return min(tried, key=lambda p: (p.time["total"], p.components.chunks))


def _line(p: Plan) -> str:
    t, mem = p.time, p.memory
    return (f"{p.name:<14} M={p.components.chunks:<3} q={p.queue.q:<3} T_iter {t['total']:.6g} (compute {t['compute']:.6g}, bubble "
            f"{t['bubble']:.6g}, PP {t['pp_crit']:.6g}, DP {t['dp_crit']:.6g})  memory {mem['total'] / GiB:.2f} GiB")


def check_pipemesh_flags(args: argparse.Namespace) -> None:
    """Counts given to the planner must be >= 1 (a 0 is refused, not read as "not given")."""
    for name, v in (("-P", args.stages), ("-M", args.microbatches), ("-V", args.chunks), ("--dp", args.dp),
                    ("--tp", args.tp), ("--ranks-per-node", args.ranks_per_node), ("--batch", args.batch)):
        if v is not None and v < 1:
            raise ValueError(f"{name} must be >= 1, got {v}")


def cmd_pipemesh(args: argparse.Namespace) -> int:
    check_pipemesh_flags(args)
    if args.paper or args.tp is not None:
        c, base, ops, budget, what = build_problem(args)
        best, tried = plan(c, ops, budget, base), []
    else:
        from .mesh import best_tp
        tried, (c, base, ops, budget, what, best) = best_tp(args, build_problem)
    others: dict[str, Any] = {kind: baseline(kind, args, _tp_of(args, tried), (c, base, ops, budget))
                              for kind in ("megatron", "breadth-first")}
    zero_spec = _zero_spec(best, c.params)
    if args.save:
        from .planfile import plan_document, save_plan
        save_plan(args.save, plan_document(best, what, _tp_of(args, tried)))
    if args.json:
        print(json.dumps({"setting": what, "tp": _tp_of(args, tried), "sp": True, "defaults": _defaults(args),
                          "tp_candidates": [t.as_dict() for t in tried], "plan": best.as_dict(), "zero_spec": zero_spec,
                          "baselines": {k: (v.as_dict() if isinstance(v, Plan) else {"error": v})
                                        for k, v in others.items()}}))
        return 0
    q = best.queue
    sh = q.sharding
    print(what)
    defaults = _defaults(args)
    if defaults:
        print("defaults: " + ", ".join(f"{k} {v}" for k, v in defaults.items()))
    if tried:
        from .mesh import format_candidates
        print(format_candidates(tried))
    print(f"P={c.stages} D={c.dp} M={c.chunks} B={c.microbatches}; C_fwd {c.fwd:.4g}, C_bwd {c.bwd:.4g}, "
          f"C_DP {c.dp_comm:.4g}, C_PP {c.pp_comm:.4g}; budget {budget / GiB:.2f} GiB")
    print(f"buffer size q={q.q}  enqueue {list(q.enqueue)}  dequeue {list(q.dequeue)}  (case {q.case})")
    share = (lambda x: x / c.params if c.params else 0.0)
    print(f"sharding: ZeRO-3 {share(sh.zero_param):.1%}, ZeRO-2 {share(sh.zero_grad - sh.zero_param):.1%}, "
          f"ZeRO-1 {share(c.params - sh.zero_grad):.1%}; buckets B_Z2={sh.bz2} B_Z3 fwd={sh.bz3_fwd} bwd={sh.bz3_bwd}")
    print(f"runtime:  pipert train --zero {zero_spec} --zero3-buffers 2  (the shares per unit, largest parameters "
          f"first); the whole plan: " + (f"pipert train --plan {args.save}" if args.save else "--save FILE, then "
                                          "pipert train --plan FILE"))
    rec = best.recomputed
    print(f"recompute {len(rec)} of {len(ops)} operations per chunk ({best.recompute.recompute_time:.4g} per pass): "
          + (", ".join(rec[:12]) + (" ..." if len(rec) > 12 else "") if rec else "none"))
    t = best.time
    print("iteration   " + ", ".join(f"{k} {v:.6g}" for k, v in t.items()))
    print("exposed DP  " + ", ".join(f"{k} {v:.6g}" for k, v in q.exposed.items()))
    print("memory GiB  " + ", ".join(f"{k} {v / GiB:.3f}" for k, v in best.memory.items()))
    print("same budget, each schedule at its own best M:")
    for kind, p in [("pipemesh", best), *others.items()]:
        print("  " + (_line(p) if isinstance(p, Plan) else f"{kind:<14} does not fit: {p}"))
    return 0


def _tp_of(args: argparse.Namespace, tried: list) -> int:
    if args.paper:
        from .paper import TABLE_IV
        return TABLE_IV[args.paper].tp if args.paper in TABLE_IV else 0
    return args.tp if args.tp is not None else next(t.tp for t in tried if t.chosen)


def _defaults(args: argparse.Namespace) -> dict[str, Any]:
    """The flags not given and the values the planner took for them (none with --paper)."""
    if args.paper:
        return {}
    from ..scenario_flags import DEFAULT_MICROBATCHES, DEFAULT_STAGES
    table = (("--model", args.model, "gpt3-58b"), ("--device", args.device, "h100"),
             ("-P", args.stages, DEFAULT_STAGES), ("--dp", args.dp, 3),
             ("--tp", args.tp, "every divisor of the GPUs per node, best per device"),
             ("--ranks-per-node", args.ranks_per_node, 8), ("--inter-node-gbps", args.inter_node_gbps, 100.0),
             ("-M", args.microbatches if args.batch is None else args.batch, DEFAULT_MICROBATCHES),
             ("-V", args.chunks, "the paper's rule (largest M with C_PP <= C_fwd)"),
             ("--memory-budget", args.memory_budget, "the device's memory"))
    return {k: d for k, v, d in table if v is None}


def _zero_spec(best: Plan, params: float) -> str:
    """The plan's ZeRO-3 and ZeRO-2/3 shares as a runtime spec (``pipert.schedules.zero_rules``)."""
    sh = best.queue.sharding
    p = sh.zero_param / params if params else 0.0
    g = sh.zero_grad / params if params else 0.0
    return f"p={p:.4f},g={max(g, p):.4f}"
