"""Registry builders for the CrossPipe families, and the default memory limit.

Each builder is a pure function of the pipeline config and the system it is built for
(cost model, links, memory limit): ``build(config, *, cost, links, topology, ...)``.
With no links and no ``dc_latency``/``dc_transfer`` every transfer is free.

Memory convention: the limit is one number per rank in the cost model's memory unit,
counted the simulator's way (stashes plus activation/gradient buffers -- received ones
from their RECV, written ones until sent or read -- in list order). The default budget
(``memory_budget="paper"``) is the paper's "same peak memory as the static base schedule
(CrossUD matches 1F1B)": each rank gets its counterpart's peak on that rank -- 1F1B for UD
(rank s: P - s stashes plus buffers; in uniform units P + 2, P + 1, ..., 2 at the last rank)
plus one W share ``stash_w``: a split backward keeps it from D to W, where 1F1B's combined B
frees the whole stash (the paper counts stashes only; with buffers counted too, 1F1B's bare
peak leaves the last rank no room to receive the next activation before its W ran),
the handcrafted ZB-V order for Wave, interleaved 1F1B for Loop. ``memory_budget="static-max"``
is the looser convention pipert used before: the largest per-rank peak of ZB-H1 (UD), ZB-V
(Wave) or interleaved 1F1B (Loop) applied to every rank, under which the greedy reaches
ZB-H1's makespan at zero delay (ZB-H1 itself exceeds 1F1B's peak on every rank but the
first: it keeps deferred W stashes). The recompute case (``recompute="full"``, the paper's
Case 2) keeps the same budget: F then holds only its boundary input, so more micro-batches fit.

Options every builder takes beside the system: ``recompute`` ("full": a RECOMPUTE before each D,
priced by the cost model's RECOMPUTE time and "kept" memory; "none" or "no_attention": no
RECOMPUTE actions, recomputation inside the units is the cost model's and the units' business) and ``dp_time``
(each unit's gradient reduction time when the program is replicated with the DP overlap,
:func:`reduction_times`; the greedy and the solver then prefer orders that hide it). ``dp`` (the
replicas the program will be compiled into, ``compile(..., dp=D)`` passes it) with ``links`` over
the P * D ranks and no ``dp_time`` prices the reductions itself (:func:`replica_dp_time`, the
simulator's pricing); ``dp_op`` names the reduction (``allreduce``; ``reducescatter`` under ZeRO),
one for every unit or one per unit; ``zero`` (the ZeRO stage, once or per unit) adds each unit's
weight all-gather the same way (:func:`replica_gathers`: after its optimizer step under ZeRO 1/2,
before its first F under ZeRO 3).
"""
from __future__ import annotations

from typing import Any, Sequence

from ...cost.topology import Links, Topology
from ...cost.uniform import UniformCost
from ...ir import Op, Schedule
from ..registry import PipelineConfig, check_dp_option
from .greedy import GreedyConfig, GreedyResult, Timed, greedy_best
from .lowering import lower_crosspipe, place_receives
from .model import CrossPipeProblem, pattern_chunks, pattern_units, problem_from_cost
from .solver import SolverConfig, solve

__all__ = ["RECOMPUTE", "reduction_times", "replica_dp_time", "replica_gathers", "COUNTERPART", "PAPER_COUNTERPART", "BUDGETS",
           "default_memory_limit", "resolve_system", "make_problem", "schedule_as_hint", "best_hint", "build_greedy",
           "build_wave", "build_optimal"]

COUNTERPART = {"ud": ("zb-h1", 1), "wave": ("zb-v", 2), "loop": ("interleaved-1f1b", None)}
"""pattern -> (split-backward static schedule of the same placement, its chunks): the solver's
second hint, and the budget of ``memory_budget="static-max"``."""

PAPER_COUNTERPART = {"ud": ("1f1b", 1), "wave": ("zb-v", 2), "loop": ("interleaved-1f1b", None)}
"""pattern -> (the static schedule whose per-rank peaks the paper's budget copies, its chunks)."""

BUDGETS = ("paper", "static-max")
"""``memory_budget`` values (module doc)."""

RECOMPUTE = ("none", "no_attention", "full")
"""``recompute`` values: "full" recomputes every unit's stash right before its D (module doc)."""


def reduction_times(unit_ranks: Sequence[int], stages: int, dp: int, cost: Any, links: Any,
                    op: str | Sequence[str] = "allreduce", payload: str = "wgrad") -> tuple[float, ...]:
    """Per unit u (on rank ``unit_ranks[u]``) of a program replicated ``dp`` times, the time of its
    collective over its rank's replicas (ranks r, r + P, ...) as the simulator prices it
    (``links.collective`` of the cost model's bytes of ``payload``: the gradient reduction's WGRAD,
    or a ZeRO gather's WEIGHT); ``links`` spans ``stages * dp`` ranks. ``op``: the collective of
    every unit, or one per unit (None: no collective, 0)."""
    from ...ir import Payload
    if dp < 1 or links is None:
        raise ValueError(f"reduction_times needs dp >= 1 and links over {stages} x {dp} ranks")
    ops = [op] * len(unit_ranks) if isinstance(op, str) else list(op)
    if len(ops) != len(unit_ranks):
        raise ValueError(f"dp_op: {len(ops)} collectives for {len(unit_ranks)} units; give one, or one per unit")
    return tuple(0.0 if o is None else float(links.collective(o, tuple(r + d * stages for d in range(dp)),
                                                               cost.message_bytes(Payload(payload), u)))
                 for u, (r, o) in enumerate(zip(unit_ranks, ops)))


def replica_gathers(unit_ranks: Sequence[int], stages: int, dp: int, cost: Any, links: Any,
                    zero: Any = 0) -> tuple[tuple[float, ...], tuple[bool, ...]]:
    """(gather_time, gather_first) of a program the generator plans for ``dp`` replicas under ZeRO
    stage ``zero`` (once, or one per unit): each unit's weight all-gather over its replicas as
    :func:`reduction_times` prices it (0 for ZeRO 0, with free links or one replica), and whether it
    precedes the unit's first F (ZeRO 3) rather than following its optimizer step (ZeRO 1/2), as
    ``pipert.schedules.data_parallel`` places them."""
    n = len(unit_ranks)
    zeros = _zero_stages(zero, n)
    first = tuple(z == 3 for z in zeros)
    if dp == 1 or links is None or not any(zeros):
        return (0.0,) * n, first
    return reduction_times(unit_ranks, stages, dp, cost, links, [None if z == 0 else "allgather" for z in zeros],
                           "weight"), first


def _zero_stages(zero: Any, units: int) -> list[int]:
    """``zero`` as one stage 0-3 per unit (text from ``--options``: "3" or "1,3,...")."""
    raw = zero.split(",") if isinstance(zero, str) else zero if isinstance(zero, (list, tuple)) else [zero]
    try:
        out = [int(z) for z in raw]
    except (TypeError, ValueError):
        out = []
    if len(out) == 1:
        out *= units
    if len(out) != units or any(z not in (0, 1, 2, 3) for z in out):
        raise ValueError(f"zero={zero!r}: give the ZeRO stage (0-3) of every unit, or one per unit ({units} units)")
    return out


def replica_dp_time(unit_ranks: Sequence[int], stages: int, dp: int, cost: Any, links: Any,
                    op: str | Sequence[str] = "allreduce") -> tuple[float, ...] | float:
    """``dp_time`` of a program the generator plans for ``dp`` replicas (replica d's stage s on rank
    d * P + s): :func:`reduction_times` on ``links`` over the P * D ranks; 0 with free links or one
    replica. The generator plans replica 0's pipeline (ranks 0..P-1), so every replica's pipeline
    must see the same links (ValueError otherwise, and when ``links`` spans other than P * D ranks)."""
    check_dp_option("crosspipe", dp)
    if dp == 1 or links is None:
        return 0.0
    topo = getattr(links, "topology", None)
    n = getattr(topo, "num_ranks", None)
    if n is not None and n != stages * dp:
        raise ValueError(f"dp={dp}: the links span {n} ranks, but {dp} replicas of {stages} stages run on "
                         f"{stages * dp} (replica d's stage s on rank d*{stages}+s); give links over "
                         f"{stages * dp} ranks")
    for d in range(1, dp if hasattr(links, "spec") else 1):
        for a in range(stages):
            for b in range(stages):
                if a != b and links.spec(a, b) != links.spec(d * stages + a, d * stages + b):
                    raise ValueError(f"dp={dp}: replica {d}'s stages {a} -> {b} (ranks {d * stages + a} -> "
                                     f"{d * stages + b}) cross other links than replica 0's (ranks {a} -> {b}); "
                                     f"the generator plans one pipeline for all replicas: place the replicas "
                                     f"alike in the topology (e.g. a number of DCs that divides dp or that dp "
                                     f"divides)")
    return reduction_times(unit_ranks, stages, dp, cost, links, op)


def default_memory_limit(pattern: str, stages: int, microbatches: int, cost: Any, chunks: int | None = None,
                         budget: str = "paper") -> tuple[float, ...]:
    """Per-rank memory limit of ``pattern`` under ``cost``: ``budget="paper"`` each rank's peak in
    the paper's static counterpart (1F1B for UD), ``"static-max"`` the largest per-rank peak of the
    split-backward counterpart (ZB-H1 for UD) on every rank (module doc)."""
    from ...sim import validate
    from .. import build_schedule
    if budget not in BUDGETS:
        raise ValueError(f"memory_budget={budget!r} unknown; allowed: {', '.join(BUDGETS)}")
    name, v = (PAPER_COUNTERPART if budget == "paper" else COUNTERPART)[pattern]
    v = pattern_chunks(pattern, chunks) if v is None else v
    order = {"order": "handcrafted"} if name == "zb-v" else {}    # zb-v's search may use less
    try:
        s = build_schedule(name, stages=stages, microbatches=microbatches, chunks=v, **order)
    except ValueError:     # e.g. interleaved 1F1B needs M >= P: fall back to 1F1B's / ZB-H1's peaks
        s = build_schedule("1f1b" if budget == "paper" else "zb-h1", stages=stages, microbatches=microbatches)
    peaks = tuple(float(x) for x in validate(s, cost).peak_memory)
    if budget != "paper":
        return (max(peaks),) * stages
    if any(a.op is Op.B for _, _, a in s):      # a split backward keeps stash_w from D to W, which B never holds
        peaks = tuple(p + float(cost.memory("stash_w", r)) for r, p in enumerate(peaks))
    return peaks


def resolve_system(stages: int, cost: Any = None, links: Any = None, topology: Any = None, dc_latency: float = 0.0,
                   dc_transfer: float = 0.0, num_dcs: int | None = None) -> tuple[Any, Any]:
    """(cost, links) a registry call describes: uniform costs by default; ``links`` wins over
    ``dc_latency``/``dc_transfer``, which build ``Links.uniform_dc(topology or
    Topology(P, num_dcs=num_dcs or 2), ...)``; neither: free links (None)."""
    cost = cost if cost is not None else UniformCost()
    if links is None and (dc_latency or dc_transfer):
        topo = topology if topology is not None else Topology(stages, num_dcs=num_dcs or 2)
        links = Links.uniform_dc(topo, dc_latency, dc_transfer)
    return cost, links


def make_problem(config: PipelineConfig, pattern: str, cost: Any, links: Any,
                 memory_limit: float | Sequence[float] | None = None, memory_budget: str = "paper",
                 recompute: str = "none", dp_time: float | Sequence[float] | None = None, dp: int = 1,
                 dp_op: str | Sequence[str] = "allreduce", zero: Any = 0) -> CrossPipeProblem:
    """The problem of ``pattern`` on ``config`` (memory limit default: ``memory_budget``'s, module doc;
    ``dp_time`` default: :func:`replica_dp_time` for ``dp`` replicas; ``zero``: their weight gathers,
    :func:`replica_gathers`)."""
    p, m = config.stages, config.microbatches
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute={recompute!r} unknown; allowed: {', '.join(RECOMPUTE)} (full: a RECOMPUTE "
                         f"before each D)")
    chunks = pattern_chunks(pattern, config.chunks if pattern == "loop" else None)
    if config.chunks != chunks:
        raise ValueError(f"pattern {pattern!r} runs {chunks} chunk(s) per rank (got chunks={config.chunks})")
    if memory_limit is None:
        memory_limit = default_memory_limit(pattern, p, m, cost, chunks, memory_budget)
    elif memory_budget not in BUDGETS:
        raise ValueError(f"memory_budget={memory_budget!r} unknown; allowed: {', '.join(BUDGETS)}")
    if not isinstance(memory_limit, (int, float)):
        memory_limit = tuple(float(x) for x in memory_limit)
    meta = {"memory_limit": memory_limit, "pattern": pattern}
    if recompute == "full":
        meta["recompute_ops"] = recompute
    unit_ranks = pattern_units(pattern, p, chunks)
    if dp_time is None:
        dp_time = replica_dp_time(unit_ranks, p, dp, cost, links, dp_op)
    gather_time, gather_first = replica_gathers(unit_ranks, p, dp, cost, links, zero)
    return problem_from_cost(p, m, pattern, cost, links, chunks=chunks, memory_limit=memory_limit, meta=meta,
                             recompute=recompute == "full", dp_time=_dp_time(dp_time), gather_time=gather_time,
                             gather_first=gather_first)


def _dp_time(value: Any) -> float | tuple[float, ...]:
    """``dp_time`` as a number or one per unit (text from ``--options``: "0.5" or "0.5,0.5,..."), each >= 0."""
    if value is None:
        return 0.0
    try:
        out = tuple(float(x) for x in (value.split(",") if isinstance(value, str) else
                                       value if isinstance(value, (list, tuple)) else [value]))
    except (TypeError, ValueError):
        out = ()
    if not out or any(not 0 <= x < float("inf") for x in out):
        raise ValueError(f"dp_time={value!r}: give each unit's gradient reduction time (a number >= 0, or one "
                         f"per unit separated by commas)")
    return out[0] if len(out) == 1 else out


def schedule_as_hint(problem: CrossPipeProblem, schedule: Schedule, cost: Any, links: Any) -> GreedyResult | None:
    """A simulated schedule of the same placement in the greedy's result form (for the
    solver's hint); None if it uses ops the solver does not model (B) or breaks the limit.

    Its receive positions are re-derived by the models' rule (:func:`.lowering.place_receives`
    on the simulated times): each RECV moves to where it is posted no earlier than before
    and still by its transfer's start, so the re-lowered schedule is no slower and holds
    no buffer longer than ``schedule``."""
    from ...sim import simulate
    if any(a.op is Op.B for _, _, a in schedule) or tuple(schedule.placement.ranks) != problem.unit_ranks or \
            problem.recompute or any(problem.dp_time):     # no RECOMPUTE; the simulator would not price the reductions
        return None
    r = simulate(schedule, cost, links)
    if any(peak > problem.limit(q) + 1e-9 for q, peak in enumerate(r.peak_memory)):
        return None
    timeline: list[list[Timed]] = [[] for _ in range(problem.stages)]
    messages: dict[tuple, tuple[float, float]] = {}
    for rank, queue, a, start, end in r.events:
        if queue == "compute" and a.op in (Op.F, Op.D, Op.W):
            timeline[rank].append(Timed(a, start, end))
        elif a.op is Op.RECV:
            messages[(a.payload.value, a.unit, a.mb[0])] = (start, end)
    recv_at = place_receives(problem, [[t.action for t in tl] for tl in timeline],
                             [[t.end for t in tl] for tl in timeline], {k: v[0] for k, v in messages.items()})
    return GreedyResult(timeline, r.makespan, 0.0, messages, recv_at, list(r.peak_memory))


def best_hint(problem: CrossPipeProblem, cost: Any, links: Any, sub_blocks: int = 4) -> GreedyResult:
    """The better of the greedy and the static counterpart (if the solver can take it as a
    hint): seeding CP-SAT with both keeps its result no worse than either."""
    from .. import build_schedule
    g = greedy_best(problem, GreedyConfig(sub_blocks=sub_blocks))
    name, v = COUNTERPART[problem.pattern]
    try:
        s = build_schedule(name, stages=problem.stages, microbatches=problem.microbatches, chunks=v or problem.chunks)
    except ValueError:
        return g
    h = schedule_as_hint(problem, s, cost, links)
    return h if h is not None and h.makespan < g.makespan - 1e-9 else g


def _greedy(config: PipelineConfig, pattern: str, name: str, sub_blocks: int, memory_limit: Any,
            memory_budget: str, recompute: str, dp_time: Any, dp: int, dp_op: Any, zero: Any,
            **system: Any) -> Schedule:
    cost, links = resolve_system(config.stages, **system)
    pr = make_problem(config, pattern, cost, links, memory_limit, memory_budget, recompute, dp_time, dp, dp_op, zero)
    g = greedy_best(pr, GreedyConfig(sub_blocks=sub_blocks))
    meta = {"predicted_makespan": g.makespan, "greedy_s": round(g.runtime_s, 4), "sub_blocks": sub_blocks,
            **{k: pr.meta[k] for k in ("memory_limit", "recompute_ops") if k in pr.meta}}
    return lower_crosspipe(pr, g.orders, g.recv_at, name=name, meta=meta)


def build_greedy(config: PipelineConfig, *, cost: Any = None, links: Any = None, topology: Any = None,
                 memory_limit: Any = None, memory_budget: str = "paper", sub_blocks: int = 4, dc_latency: float = 0.0,
                 dc_transfer: float = 0.0, num_dcs: int | None = None, recompute: str = "none",
                 dp_time: Any = None, dp: int = 1, dp_op: Any = "allreduce", zero: Any = 0) -> Schedule:
    """CrossUDSub: the greedy on the unidirectional placement (unit u on rank u)."""
    return _greedy(config, "ud", "crosspipe-greedy", sub_blocks, memory_budget=memory_budget, cost=cost, links=links, topology=topology,
                   recompute=recompute, dp_time=dp_time, dp=dp, dp_op=dp_op, zero=zero, memory_limit=memory_limit,
                   dc_latency=dc_latency, dc_transfer=dc_transfer, num_dcs=num_dcs)


def build_wave(config: PipelineConfig, *, cost: Any = None, links: Any = None, topology: Any = None,
               memory_limit: Any = None, memory_budget: str = "paper", sub_blocks: int = 4, dc_latency: float = 0.0,
               dc_transfer: float = 0.0, num_dcs: int | None = None, recompute: str = "none",
               dp_time: Any = None, dp: int = 1, dp_op: Any = "allreduce", zero: Any = 0) -> Schedule:
    """CrossWave (greedy): the same greedy on the V-shape placement (2 chunks per rank)."""
    return _greedy(config, "wave", "crosspipe-wave", sub_blocks, memory_budget=memory_budget, cost=cost, links=links, topology=topology,
                   recompute=recompute, dp_time=dp_time, dp=dp, dp_op=dp_op, zero=zero, memory_limit=memory_limit,
                   dc_latency=dc_latency, dc_transfer=dc_transfer, num_dcs=num_dcs)


def build_optimal(config: PipelineConfig, *, cost: Any = None, links: Any = None, topology: Any = None,
                  memory_limit: Any = None, memory_budget: str = "paper", sub_blocks: int = 4, dc_latency: float = 0.0,
                  dc_transfer: float = 0.0, num_dcs: int | None = None, pattern: str | None = None,
                  time_limit: float = 60.0, objective: str = "all", relative_gap: float = 0.0,
                  workers: int = 1, recompute: str = "none", dp_time: Any = None, dp: int = 1,
                  dp_op: Any = "allreduce", zero: Any = 0) -> Schedule:
    """CP-SAT optimum (paper §4.1), hinted and bounded by the greedy.

    ``pattern`` defaults to "ud" for chunks=1 and "wave" for chunks=2 ("loop" must be named).
    ``workers=1`` (default) searches deterministically and ``time_limit`` is CP-SAT's
    deterministic time limit (the wall clock stops a search only at 10x that), so every build
    of the same input gives the same program; more workers may return a different one of
    several optimal schedules on each build. (``Pipeline`` also builds a named schedule once
    and sends it to every rank.)
    """
    pattern = pattern or ("ud" if config.chunks == 1 else "wave")
    cost, links = resolve_system(config.stages, cost, links, topology, dc_latency, dc_transfer, num_dcs)
    pr = make_problem(config, pattern, cost, links, memory_limit, memory_budget, recompute, dp_time, dp, dp_op, zero)
    hint = best_hint(pr, cost, links, sub_blocks)
    res = solve(pr, SolverConfig(time_limit_s=10 * time_limit, deterministic_limit=time_limit, workers=workers,
                                 sub_blocks=sub_blocks, objective=objective, relative_gap=relative_gap), hint=hint)
    meta = {"sub_blocks": sub_blocks, "hint_makespan": hint.makespan,
            **{k: pr.meta[k] for k in ("memory_limit", "recompute_ops") if k in pr.meta}}
    return res.schedule(pr, name="crosspipe-optimal", meta=meta)
