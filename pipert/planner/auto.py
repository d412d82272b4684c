"""``pipert plan --auto``: one search over every schedule family and layout of a cluster, ranked
by simulated step time within the per-device memory (docs/planner.md).

Each layout (:mod:`pipert.planner.layouts`) is priced in two parts:

- one replica's pipeline by the simulator (``pipert.sim.simulate``) on the analytic cost model
  (``TransformerCost`` with the layout's T, SP, micro-batch and recomputation; or the hook
  ``cost_for``, e.g. measured units) and the links its P ranks cross;
- the data-parallel part analytically: each stage's gradient collectives over its D replicas
  (ring, on the slowest link the group crosses: ``Links.collective`` over the cluster's ranks),
  started when that stage's optimizer step may begin (``pipe.finish_times``: its last backward
  ended and the gradients still arriving are in), then its optimizer step; ZeRO-1/2 reduce-scatter
  and all-gather (the bytes of an all-reduce, 1/D of the optimizer step), ZeRO-3 also gathers the
  weights once before the step's first forward (counted exposed).

Memory per device = model states (bf16 weights and gradients, 12 bytes of fp32 master weights and
AdamW moments per parameter, each sharded over D by the ZeRO stage; ZeRO-3 adds one unit's whole
weights) + the simulator's peak of everything else (stashes, buffers, weights in flight).

Pruning, cheapest first: a layout whose fully sharded model states exceed the memory is not
simulated; layouts are simulated in order of a lower bound on their step (one replica's compute
divided over its P ranks, no bubble, no communication), and the search stops once the bound
exceeds the step of the ``top``-th best found (the ``top`` cheapest-to-simulate layouts with the
lowest bounds go first: :data:`CHEAP_FIRST`); recomputation is tried only where a layout does
not fit without it (it only adds time).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from ..cost.transformer import ModelSpec, TransformerCost, partition_helix, partition_layers
from .cluster import Cluster
from .layouts import FAMILIES, WEIGHT_PASSING, Layout, family_default, layouts
from .runner import Outcome, run_in_order

__all__ = ["Candidate", "Search", "search", "analytic_cost", "schedule_of", "STATE_BYTES"]

STATE_BYTES = {"weight": 2.0, "grad": 2.0, "optimizer": 12.0}
"""Bytes per parameter of the model states (mixed precision with AdamW, as PipeMesh counts them)."""
_TOLERANCE = 1e-12
CHEAP_FIRST = ("1f1b", "interleaved-1f1b", "zb-h1", "pipemesh")
"""Families the search evaluates first (the ``top`` of them with the lowest bounds): their builds take
no costs (shared between layouts) and their simulations are the shortest, so the cutoff that proves
weight-passing layouts slower (:func:`_slower`) is finite before the first of those is tried."""
HELIX = ("helixpipe", "helixpipe-2fold")
"""Families whose layouts are proven slower before they are built (their placement is a formula)."""
PROVEN_SLOWER = WEIGHT_PASSING + HELIX
"""Families whose layouts :func:`_slower` tries to prove slower than the top before simulating them:
weight passing from its built schedule's chained bound (:func:`pipert.planner.prune.finish_bounds`),
HelixPipe from its placement."""
BUILD_OPTIONS = {"zb-v": {"order": "handcrafted"}}
"""Generator options the planner fixes, and ``pipert train --options`` repeats: ZB-V's handcrafted
order (its search over greedy orders costs seconds per layout)."""


@dataclass
class Candidate:
    """One simulated layout with its best ZeRO stage and recomputation that fit."""

    layout: Layout
    recompute: str
    """none, or no_attention (HelixPipe's recomputation without attention)."""
    zero: int
    """ZeRO stage over the D replicas (0 with D = 1)."""
    step: float
    """Predicted seconds per training step."""
    makespan: float
    """The pipeline of one replica alone (with its own optimizer step, unsharded)."""
    bubble: float
    """The pipeline's bubble ratio."""
    exposed_comm: float
    """Seconds the step waits on communication: the pipeline's worst rank, plus the data-parallel
    collectives and optimizer step not hidden behind it."""
    memory: float
    """Peak bytes of the fullest device."""
    bound: float
    """The lower bound the search ordered it by."""
    extrapolated_from: tuple[int, ...] = ()
    """Micro-batch counts simulated when the step was too large to simulate (pipert.planner.pipe)."""

    def as_dict(self) -> dict[str, Any]:
        lay = self.layout
        return {"schedule": lay.family, "P": lay.stages, "D": lay.dp, "T": lay.tp, "sp": lay.sp, "V": lay.chunks,
                "M": lay.microbatches, "micro_batch": lay.micro_batch, "recompute": self.recompute,
                "zero": self.zero, "step_s": self.step, "pipeline_s": self.makespan, "bubble": self.bubble,
                "exposed_comm_s": self.exposed_comm, "memory_bytes": self.memory, "bound_s": self.bound,
                "extrapolated_from": list(self.extrapolated_from)}


@dataclass
class Search:
    """What a search found and what it left out."""

    ranked: list[Candidate]
    """Fastest first (ties: less memory, then the name)."""
    budget: float
    """Bytes per device."""
    layouts: int = 0
    """Layouts that passed the shape checks."""
    simulated: int = 0
    pruned_memory: int = 0
    """Layouts whose model states or simulated peak exceed the memory."""
    pruned_bound: int = 0
    """Layouts whose lower bound was no better than the top ones found."""
    not_run: int = 0
    """Layouts left when the time budget ran out."""
    next_bound: float | None = None
    """The lowest lower bound among them: no layout left out is faster (None: none left out)."""
    skipped: dict[str, int] = field(default_factory=dict)
    """Shapes left out before any work, by reason."""
    failed: dict[str, int] = field(default_factory=dict)
    """Layouts whose build or simulation failed, by reason."""
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"budget_bytes": self.budget, "layouts": self.layouts, "simulated": self.simulated,
                "pruned_memory": self.pruned_memory, "pruned_bound": self.pruned_bound, "not_run": self.not_run,
                "complete": self.not_run == 0, "next_bound_s": self.next_bound,
                "skipped": dict(self.skipped), "failed": dict(self.failed), "seconds": self.seconds}


CostFor = Callable[[ModelSpec, Layout, str, int, bool], Any]
"""(model, layout, recompute, units, loss_in_backward) -> the cost model of one replica's units."""


def analytic_cost(cluster: Cluster) -> CostFor:
    """The analytic transformer cost of a layout, TP collectives on the intra-node link."""
    def cost(model: ModelSpec, lay: Layout, recompute: str, units: int,
             loss_in_backward: bool = False) -> TransformerCost:
        spec = ModelSpec(**{**model.__dict__, "micro_batch": lay.micro_batch})
        parts = partition_helix(spec) if units == 2 * spec.layers + 1 else partition_layers(spec, units)
        return TransformerCost(spec, cluster.device, parts, recompute=recompute, tp=lay.tp, sp=lay.sp,
                               tp_link=cluster.links.get("intra_node"), loss_in_backward=loss_in_backward)
    return cost


def search(model: ModelSpec, cluster: Cluster, batch: int, *, families: tuple[str, ...] = FAMILIES,
           tp: int | None = None, sp: bool = False, stages: int | None = None, dp: int | None = None,
           micro_batch: int | None = None, top: int = 5, time_budget: float = 25.0,
           cost_for: CostFor | None = None, jobs: int = 1,
           wanted: Callable[[Candidate], bool] = lambda c: True) -> Search:
    """Rank the layouts of ``model`` on ``cluster`` for a global batch of ``batch`` sequences
    (module doc). The fixed dimensions (``tp``, ``stages``, ``dp``, ``micro_batch``) narrow it.
    ``jobs``: processes simulating at once (forked; 1 with a given ``cost_for``, which may hold
    torch, not safe to fork). ``wanted``: the time budget stops the search only once it found
    one such candidate."""
    t0 = time.perf_counter()
    measured = cost_for is not None
    cost_for = cost_for or analytic_cost(cluster)
    out = Search([], cluster.device.memory)
    lays = list(layouts(cluster, model, batch, families, tp=tp, sp=sp, stages=stages, dp=dp,
                        micro_batch=micro_batch, skipped=out.skipped))
    out.layouts = len(lays)
    work: dict[tuple, tuple] = {}   # (T, SP, b) -> compute, parameters, OPT, activation, forward, least layer
    dp_bound: dict[tuple, float] = {}
    unit_max: dict[tuple, float] = {}   # (T, SP, b, units) -> the heaviest unit's F + B
    bounded = []
    for lay in lays:
        key = (lay.tp, lay.sp, lay.micro_batch)
        if key not in work:
            c = cost_for(model, lay, "none", model.layers, False)
            units = range(c.num_units)
            work[key] = (sum(c.unit_time(u, "F") + c.unit_time(u, "B") for u in units),
                         sum(c.params(u) for u in units), sum(c.unit_time(u, "OPT") for u in units),
                         c.message_bytes("act", 0), sum(c.unit_time(u, "F") for u in units),
                         min(c.unit_time(u, "F") + c.unit_time(u, "B") for u in units))
        compute, params, opt, act, forward, layer = work[key]
        if params / lay.stages * sum(STATE_BYTES.values()) / lay.dp > out.budget:
            out.pruned_memory += 1    # even ZeRO-3 over D does not fit: no schedule can
            continue
        gkey = (lay.tp, lay.stages, lay.dp)
        if gkey not in dp_bound:      # the collectives are convex in the bytes: the mean stage bounds the worst
            dp_bound[gkey] = cluster.rank_links(lay.tp).collective(
                "allreduce", lay.dp_group(0), params / lay.stages * model.dtype_bytes)
        per_rank = compute * lay.microbatches / lay.stages
        links = _link_bound(lay, cluster, act) if lay.family not in WEIGHT_PASSING else \
            _weight_bound(lay, cluster, params * model.dtype_bytes)
        # the last rank waits out the warm-up, then runs its own share: at least its whole layers
        least = lay.microbatches * (model.layers // lay.units) * lay.chunks * layer if _is_chain(lay) else 0.0
        heaviest = 0.0
        if _is_chain(lay):            # the rank of the heaviest unit (the head's, often) runs it M times
            ukey = (*key, lay.units)
            if ukey not in unit_max:
                c = cost_for(model, lay, "none", lay.units, False)
                unit_max[ukey] = max(c.unit_time(u, "F") + c.unit_time(u, "B") for u in range(c.num_units))
            heaviest = lay.microbatches * unit_max[ukey]
        bound = max(per_rank, heaviest, least + _warm_up(lay, cluster, act, forward), links) + dp_bound[gkey] + \
            opt / lay.stages / lay.dp
        bounded.append((bound, lay))
    bounded.sort(key=lambda x: (x[0], FAMILIES.index(x[1].family) if x[1].family in FAMILIES else 0))
    builds: dict[tuple, Any] = {}   # schedules of cost-free builds, shared by layouts (_build)

    def evaluate(lay: Layout, bound: float, cutoff: float) -> Outcome:
        mine = Search([], out.budget)
        sims: dict[tuple, Any] = {}   # (shape, (recompute, dp_op, ZeRO-3)) -> (schedule, SimResult) of this layout
        bounds: dict[tuple, Any] = {}  # (shape, recompute) -> (schedule or None, bound per rank)
        try:
            if cutoff < math.inf and lay.family in PROVEN_SLOWER and \
                    all(_slower(model, cluster, lay, rc, cost_for, mine, builds, sims, cutoff, bounds)
                        for rc in RECOMPUTE):
                return None, mine.simulated, mine.failed, True
            return _evaluate(model, cluster, lay, bound, cost_for, mine, builds, sims), mine.simulated, mine.failed, \
                False
        except Exception as e:  # noqa: BLE001 - a family's builder or the engine refusing a shape
            from ..sim import ScheduleError
            if not isinstance(e, (ValueError, ScheduleError)):
                raise
            failed = dict(mine.failed)
            why = f"{lay.family}: {str(e).splitlines()[0][:160]}"
            failed[why] = failed.get(why, 0) + 1
            return None, mine.simulated, failed, False
    found, stats = run_in_order(bounded, evaluate, top, time_budget, t0, 1 if measured else jobs, wanted,
                                cheap=lambda lay: lay.family in CHEAP_FIRST)
    out.next_bound = stats.pop("next_bound")
    for k, v in stats.items():
        if k == "failed":
            for why, n in v.items():
                out.failed[why] = out.failed.get(why, 0) + n
        else:
            setattr(out, k, getattr(out, k) + v)
    out.ranked = found
    out.seconds = time.perf_counter() - t0
    return out


def _link_bound(lay: Layout, cluster: Cluster, act: float) -> float:
    """Activation passing: each of the M activations crosses every stage boundary, so the
    slowest boundary link is busy M x (bytes / bandwidth) at least (0 for the other families)."""
    if lay.family in WEIGHT_PASSING or lay.stages == 1:
        return 0.0
    links = lay.links(cluster)
    return lay.microbatches * max(links.spec(p, p + 1).occupancy(act) for p in range(lay.stages - 1))


def _weight_bound(lay: Layout, cluster: Cluster, weight_bytes: float) -> float:
    """Weight passing: at each level (datacenters, nodes, ranks of the pipeline) a block of k needs
    the weights held outside it, ``(1 - 1/k)`` of them, through at most two links into it (its
    ring neighbours), at that level's bandwidth."""
    topo = lay.topology()
    rpn = topo.ranks_per_node or topo.ranks_per_dc
    levels = (("inter_dc", topo.num_dcs), ("inter_node", lay.stages // rpn), ("intra_node", lay.stages))
    return max((cluster.links[c].occupancy(weight_bytes * (1 - 1 / k) / 2) for c, k in levels if k > 1),
               default=0.0)


def _is_chain(lay: Layout) -> bool:
    """Units of whole layers passed from rank to rank (not weight passing, not HelixPipe's pieces)."""
    return lay.family not in WEIGHT_PASSING and lay.units <= lay.stages * lay.chunks and lay.stages > 1


def _warm_up(lay: Layout, cluster: Cluster, act: float, forward: float) -> float:
    """Activation passing: the last rank idles until the first micro-batch's forward has run on the
    P - 1 units before it (each 1/(P V) of the model's ``forward``) and crossed the P - 1 links
    between them (0 for the others)."""
    if not _is_chain(lay):
        return 0.0
    links = lay.links(cluster)
    hops = sum(links.spec(p, p + 1).occupancy(act) + links.spec(p, p + 1).latency for p in range(lay.stages - 1))
    return (lay.stages - 1) * forward / (lay.stages * lay.chunks) + hops


def _order(c: Candidate) -> tuple:
    return (c.step, c.memory, c.layout.family, c.layout.stages)


RECOMPUTE = ("none", "no_attention")
"""Recomputations tried, in order: the first that fits is the layout's."""


def _evaluate(model: ModelSpec, cluster: Cluster, lay: Layout, bound: float, cost_for: CostFor,
              out: Search, builds: dict | None = None, sims: dict | None = None) -> Candidate | None:
    """The layout's best (ZeRO stage, recomputation) that fits; None when none does. ``builds``:
    schedules already built (:func:`_build`); ``sims``: simulations already run (:func:`_slower`)."""
    for recompute in RECOMPUTE:
        cand = _simulate(model, cluster, lay, recompute, bound, cost_for, out, builds, sims)
        if cand is not None:
            return cand
    return None


def _simulate(model: ModelSpec, cluster: Cluster, lay: Layout, recompute: str, bound: float, cost_for: CostFor,
              out: Search, builds: dict | None = None, sims: dict | None = None) -> Candidate | None:
    from .pipe import simulate_pipe
    best: Candidate | None = None
    for zeros in _zero_builds(lay):
        cost, links, run = _runner(model, cluster, lay, recompute, cost_for, out, builds, sims, zeros[0])
        owners: list = []

        def owned(shape: Layout) -> tuple:
            sched, res = run(shape)
            owners[:] = sched.placement.weight_owner
            return sched, res
        pipe = simulate_pipe(lay, owned)
        if pipe is None:
            why = f"{lay.family}: too many (unit, micro-batch) pairs to simulate (a larger --micro-batch-size has fewer)"
            out.failed[why] = out.failed.get(why, 0) + 1
            return None
        P = lay.stages
        held, opt, biggest, allreduce, gather, scatter = _dp_parts(model, cluster, lay, cost, owners)
        for zero in zeros:
            gathered = biggest * STATE_BYTES["weight"] if zero == 3 else 0.0   # one ZeRO-3 unit whole at a time
            mem = max(h * _state_bytes(zero, lay.dp) + gathered + peak for h, peak in zip(held, pipe.peak))
            if mem > out.budget:
                continue
            tail = max(pipe.finish[p] + _dp_tail(zero, lay.dp, allreduce[p], gather[p], scatter[p], opt[p])
                       for p in range(P))
            # the step ends with the last rank's optimizer step; the pipeline's own makespan times every
            # OPT unsharded, so it is not a floor once ZeRO shards them
            step = max(tail, max(pipe.finish)) + (max(gather) if zero == 3 else 0.0)
            cand = Candidate(lay, recompute, zero, step, pipe.makespan, pipe.bubble,
                             pipe.exposed + max(step - pipe.makespan, 0.0), mem, bound, pipe.extrapolated_from)
            if best is None or (cand.step, cand.zero) < (best.step, best.zero):
                best = cand
    return best


def _zero_builds(lay: Layout) -> list[tuple[int, ...]]:
    """The ZeRO stages tried, grouped by the schedule they share: one group, unless the family plans
    its replicas' gradient reductions (CrossPipe's ``dp``, ``pipert.compiler.replica_options``), whose
    order is built for the collective (all-reduce under ZeRO-0, reduce-scatter from ZeRO-1 on) and,
    where it takes ``zero``, for where the weight gathers go (after the optimizer step under ZeRO 1/2,
    before the first forward under ZeRO 3)."""
    from ..compiler import replica_options
    if lay.dp == 1:
        return [(0,)]
    opts = replica_options(lay.family, lay.dp, 1)
    if "zero" in opts:
        return [(0,), (1, 2), (3,)]
    return [(0,), (1, 2, 3)] if "dp_op" in opts else [(0, 1, 2, 3)]


def _replica_options(lay: Layout, cluster: Cluster, zero: int) -> dict:
    """What ``pipert train --dp`` tells a family that plans its replicas' reductions
    (``pipert.compiler.replica_options``: ``dp``, ``dp_op`` of ZeRO stage ``zero``), with the links
    over the P x D ranks it prices them on; empty for the other families and D = 1."""
    from ..compiler import replica_options
    opts = replica_options(lay.family, lay.dp, zero)
    if not opts:
        return {}
    links = cluster.rank_links(lay.tp)
    return {**opts, "links": links, "topology": links.topology}


def _dp_parts(model: ModelSpec, cluster: Cluster, lay: Layout, cost: Any, owners: Any) -> tuple:
    """Per pipeline rank p of ``lay`` (``owners[u]``: the rank keeping unit u's weights): (parameters
    held, optimizer seconds unsharded, the largest unit's parameters, and the seconds of an
    all-reduce, all-gather and reduce-scatter of its gradients over its D replicas)."""
    P = lay.stages
    held, opt, biggest = [0.0] * P, [0.0] * P, 0.0
    for u, r in enumerate(owners):
        held[r] += cost.params(u)
        opt[r] += cost.unit_time(u, "OPT")
        biggest = max(biggest, cost.params(u))
    rl = cluster.rank_links(lay.tp)
    grads = [(lay.dp_group(p), held[p] * model.dtype_bytes) for p in range(P)]
    return (held, opt, biggest, [rl.collective("allreduce", g, n) for g, n in grads],
            [rl.collective("allgather", g, n) for g, n in grads],
            [rl.collective("reducescatter", g, n) for g, n in grads])


def _dp_tails(model: ModelSpec, cluster: Cluster, lay: Layout, cost: Any, owners: Any) -> list[float]:
    """Per pipeline rank, the least seconds its step runs after its last non-OPT compute over every
    ZeRO stage (:func:`_simulate`: its gradient collectives, then its optimizer step, sharded over
    D from ZeRO-1 on)."""
    _, opt, _, allreduce, gather, scatter = _dp_parts(model, cluster, lay, cost, owners)
    zeros = (0, 1) if lay.dp > 1 else (0,)   # ZeRO-1..3 share one tail
    return [min(_dp_tail(z, lay.dp, a, g, s, o) for z in zeros) for a, g, s, o in zip(allreduce, gather, scatter, opt)]


def _dp_tail(zero: int, dp: int, allreduce: float, gather: float, scatter: float, opt: float) -> float:
    """Seconds a rank's step runs after its last non-OPT compute under ZeRO stage ``zero``: its
    gradient all-reduce (ZeRO-0) or reduce-scatter and all-gather, then its optimizer step, sharded
    over the ``dp`` replicas from ZeRO-1 on."""
    return allreduce + opt if zero == 0 else scatter + gather + opt / dp


def _runner(model: ModelSpec, cluster: Cluster, lay: Layout, recompute: str, cost_for: CostFor, out: Search,
            builds: dict | None, sims: dict | None, zero: int = 0) -> tuple[Any, Any, Callable[[Layout], tuple]]:
    """(cost, links, run): ``run(shape)`` builds (for ZeRO stage ``zero``: :func:`_replica_options`)
    and simulates ``shape`` of ``lay`` (once: ``sims``)."""
    from ..sim import simulate_once
    cost = cost_for(model, lay, recompute, lay.units, family_default(lay.family, "loss_in_backward", False))
    links, topo = lay.links(cluster), lay.topology()
    sims = {} if sims is None else sims

    replicas = _replica_options(lay, cluster, zero)
    key = (recompute, replicas.get("dp_op"), replicas.get("zero") == 3)

    def run(shape: Layout) -> tuple:
        if (shape, key) not in sims:
            sched = _build(shape, cost, links, out.budget, recompute, builds, replicas)
            out.simulated += 1
            sims[(shape, key)] = sched, simulate_once(sched, cost, links, topo)   # zb-v's pick: simulated in its build
        return sims[(shape, key)]
    return cost, links, run


def _slower(model: ModelSpec, cluster: Cluster, lay: Layout, recompute: str, cost_for: CostFor, out: Search,
            builds: dict | None, sims: dict, cutoff: float, bounds: dict | None = None) -> bool:
    """Whether ``lay`` with ``recompute`` provably steps slower than ``cutoff`` (the step of the
    top-th best found), without simulating its step. The step is at least, on each rank, the end of
    its last non-OPT compute, ``finish``, plus the least its data-parallel tail takes
    (:func:`_dp_tails`); ``finish`` is bounded by :func:`pipert.planner.prune.finish_bounds` from
    the built schedule (the engine's chains of computes, messages and collectives), for HelixPipe
    first, unbuilt, by the compute its placement puts on the rank
    (:func:`pipert.planner.prune.placement_busy`), and built only where that does not prove it; or
    first by another recomputation's bound of the same schedule (``bounds``) where no time of this
    one is earlier (:func:`_borrowed_bound`). A step
    too large to simulate is the line through the simulated m and m/2 (:mod:`pipert.planner.pipe`),
    at M a rising function of the finish at m: the line through the bound at m and the finish
    simulated at m/2 lies below it at M, so only m/2, the cheaper one, is simulated."""
    from .pipe import _pipe, sim_microbatches
    from .prune import finish_bounds, placement_busy
    counts = sim_microbatches(lay)
    if not counts:
        return False
    cost, links, run = _runner(model, cluster, lay, recompute, cost_for, out, builds, sims)
    above = cutoff * (1 + 1e-9)
    at_lay = replace(lay, microbatches=counts[0])

    def cost_of(rc: str) -> Any:
        return cost_for(model, lay, rc, lay.units, family_default(lay.family, "loss_in_backward", False))

    def own() -> tuple[list[float], list[float]]:
        """(bound at m per rank, data-parallel tails) of this recomputation (bounds: recorded)."""
        sched = None
        if lay.family in HELIX:
            from ..schedules.helixpipe import check_helixpipe, helix_placement
            folds = family_default(lay.family, "folds", 1)
            check_helixpipe(lay.family, lay.stages, counts[0], lay.chunks, folds)   # refused as its build refuses
            placement = helix_placement(lay.stages, lay.stages * lay.chunks, counts[0], folds)
            at_m = placement_busy(placement, cost, lay.stages)
            tails = _dp_tails(model, cluster, lay, cost, placement.weight_owner)
        else:
            at_m, tails = [0.0] * lay.stages, None
        if tails is None or max(x + t for x, t in zip(at_m, tails)) <= above:
            # the built schedule's bound (the build is shared with the layout's own simulation)
            sched = _build(at_lay, cost, links, out.budget, recompute, builds)
            tails = tails or _dp_tails(model, cluster, lay, cost, sched.placement.weight_owner)
            at_m = [max(x, y) for x, y in zip(at_m, finish_bounds(sched, cost, links))]
        if bounds is not None:
            bounds[(at_lay, recompute)] = (sched, at_m)
        return at_m, tails
    half: list[float] = []

    def proves(at_m: list[float], tails: list[float]) -> bool:
        if len(counts) == 1:
            return max(x + t for x, t in zip(at_m, tails)) > above
        # the m/2 simulation is kept (sims) for the layout's own evaluation, which runs it too
        m, h = counts
        if not half:
            half_lay = replace(lay, microbatches=h)
            half[:] = _retimed_finish(half_lay, recompute, cost, links, out.budget, builds, sims, cost_of) or \
                _pipe(*run(half_lay)).finish
        rise = (lay.microbatches - m) / (m - h)
        return any(x + (x - y) * rise + t > above for x, y, t in zip(at_m, half, tails))
    borrowed = _borrowed_bound(at_lay, recompute, cost, links, out.budget, builds, bounds, cost_of)
    if borrowed is not None:
        sched, at_m = borrowed
        if proves(at_m, _dp_tails(model, cluster, lay, cost, sched.placement.weight_owner)):
            return True
    return proves(*own())


def _borrowed_bound(shape: Layout, recompute: str, cost: Any, links: Any, budget: float, builds: dict | None,
                    bounds: dict | None, cost_of: Callable[[str], Any]) -> tuple[Any, list[float]] | None:
    """(schedule, bound at ``shape`` per rank) recorded for another recomputation of the same built
    schedule, where it bounds ``recompute`` too: no time the engine gives the schedule under
    ``cost`` is earlier than under the other's (:func:`pipert.sim.timing.no_earlier`); else None."""
    from ..sim.timing import no_earlier
    for (done, other), (sched, at_m) in (bounds or {}).items():
        if done != shape or other == recompute or sched is None:
            continue
        if _build(shape, cost, links, budget, recompute, builds) is sched and no_earlier(sched, cost, cost_of(other)):
            return sched, at_m
    return None


def _retimed_finish(shape: Layout, recompute: str, cost: Any, links: Any, budget: float, builds: dict | None,
                    sims: dict, cost_of: Callable[[str], Any]) -> list[float] | None:
    """The finish per rank of ``shape`` with ``recompute`` (cost model ``cost``), re-timed from a
    simulation of the same built schedule under another recomputation (``sims``; ``cost_of``: the
    cost model of a recomputation), without pass 1 (:func:`pipert.sim.timing.retimed`); None where
    there is none or its messages cost other bytes."""
    from ..sim.timing import retimed
    from .pipe import finish_times
    for (done, (other, dp_op, _)), (sched, res) in list(sims.items()):
        if done != shape or other == recompute or dp_op is not None:
            continue
        if _build(shape, cost, links, budget, recompute, builds) is not sched:
            return None
        times = retimed(res.graph, cost, cost_of(other))
        return finish_times(res.graph, times) if times is not None else None
    return None


def _build(lay: Layout, cost: Any, links: Any, budget: float, recompute: str, cache: dict | None = None,
           replicas: dict | None = None) -> Any:
    """The schedule of one replica; delay-aware builders get its costs, links and what memory the
    model states leave (ZeRO-1 over D, or none with D = 1); a family that records its units'
    recomputation (helixpipe-2fold) records ``recompute``, and its loss placement is its default,
    as ``cost`` prices it. ``cache``: schedules by everything their build reads (family, P, M, V
    and the options it takes), for builds that take only plain options (not the costs or links:
    those differ per layout); a schedule is immutable, so layouts share it. ``replicas``: the options
    ``pipert train --dp`` adds for a family that plans its replicas' reductions, with the links over
    the P x D ranks (:func:`_replica_options`)."""
    from ..schedules import build_schedule, family
    held = sum(cost.params(u) for u in range(cost.num_units)) / lay.stages
    opts = {"cost": cost, "links": links, "topology": links.topology, "ranks_per_node": lay.ranks_per_node,
            "memory_limit": max(budget - held * _state_bytes(min(lay.dp - 1, 1), lay.dp), 1.0),
            "recompute": recompute, **(replicas or {})}
    accepted = family(lay.family).options()
    opts = opts if accepted is None else {k: v for k, v in opts.items() if k in accepted}
    opts.update(BUILD_OPTIONS.get(lay.family, {}))
    key = None
    if cache is not None and all(isinstance(v, (int, float, str, bool, type(None))) for v in opts.values()):
        key = (lay.family, lay.stages, lay.microbatches, lay.chunks, tuple(sorted(opts.items())))
        if key in cache:
            return cache[key]
    sched = build_schedule(lay.family, stages=lay.stages, microbatches=lay.microbatches, chunks=lay.chunks, **opts)
    if key is not None:
        cache[key] = sched
    return sched


def schedule_of(model: ModelSpec, cluster: Cluster, cand: Candidate, cost_for: CostFor | None = None) -> Any:
    """The schedule ``cand`` was simulated with (for a schedule file ``pipert train`` runs)."""
    lay = cand.layout
    cost = (cost_for or analytic_cost(cluster))(model, lay, cand.recompute, lay.units,
                                                family_default(lay.family, "loss_in_backward", False))
    return _build(lay, cost, lay.links(cluster), cluster.device.memory, cand.recompute,
                  replicas=_replica_options(lay, cluster, cand.zero))


def _state_bytes(zero: int, dp: int) -> float:
    """Bytes per held parameter of its model states under ZeRO stage ``zero`` over ``dp`` replicas."""
    w, g, o = STATE_BYTES["weight"], STATE_BYTES["grad"], STATE_BYTES["optimizer"]
    return (w / dp if zero >= 3 else w) + (g / dp if zero >= 2 else g) + (o / dp if zero >= 1 else o)

