"""ZB-V order selection: the fastest V-shape order within a memory limit.

Candidates, all on the V placement (:func:`.zero_bubble.zb_v_units`):

- the handcrafted order (:func:`.zero_bubble.zb_v_handcrafted`);
- the zero-bubble authors' greedy (:mod:`.zbv_greedy`), each of its four fill variants,
  at the authors' memory cap (2P stashes);
- pipert's memory-aware greedy on the same placement (``crosspipe`` wave model, whole W
  blocks), which also meets limits below the authors' cap and prices link delays; it
  costs several times the others to build, so "best" tries it up to P*M =
  ``WAVE_GREEDY_MAX_PM``, and beyond that only when neither of them fits the limit or
  when links are given;
- optionally, CP-SAT over the same problem (``crosspipe`` wave model without W pieces),
  hinted with the best of the above and kept only when it is faster.

Every candidate is timed and sized by the simulator under the caller's cost model and
links, so "faster" and "fits" mean what ``pipert simulate`` reports. The pick is the
smallest (makespan, peak memory); ties keep the earlier candidate (handcrafted first).
Without a memory limit, solver or links, the handcrafted order is returned unsimulated when
it reaches the lower bound (a rank's start-up plus its work; at F = D = W from M = 2P-1 on),
since no candidate can then be faster.
The memory limit is per rank in the cost model's memory unit, counted the simulator's
way; its default is the handcrafted order's peak (1F1B's activation memory).
"""
from __future__ import annotations

import math
from typing import Any, Sequence

from ..ir import Action, Op, Schedule
from .registry import PipelineConfig, assemble
from .zbv_greedy import zbv_greedy_variants

__all__ = ["ORDERS", "WAVE_GREEDY_MAX_PM", "select_zb_v"]

ORDERS = ("best", "handcrafted", "greedy", "wave-greedy")
"""``order`` values of zb-v: the best candidate, or only the handcrafted order, the authors'
greedy, or pipert's memory-aware greedy."""

WAVE_GREEDY_MAX_PM = 256
"""Largest P*M at which "best" always runs the memory-aware greedy (P = 8, M = 32: about
2 s on the shared 2-core development machine; its time grows faster than the other
candidates')."""


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs)


def _greedy_inputs(p: int, cost: Any, links: Any) -> dict[str, float]:
    """Scalar times and memory changes of the greedy: means over the 2P units (as the
    authors do for unequal stages); ``comm``: mean activation transfer between neighbours."""
    units = range(2 * p)
    ranks = [u if u < p else 2 * p - 1 - u for u in units]

    def t(op: Op) -> float:
        return _mean([float(cost.compute_time(Action(op, u, 0), ranks[u])) for u in units])

    stash = _mean([float(cost.memory("stash", u)) for u in units])
    stash_w = _mean([float(cost.memory("stash_w", u)) for u in units])
    comm = 0.0
    if links is not None and p > 1:
        from ..ir import Payload
        nbytes = _mean([float(cost.message_bytes(Payload.ACT, u, 1)) for u in units])
        comm = _mean([sum(links.transfer(r, r + 1, nbytes)) for r in range(p - 1)])
    return dict(f=t(Op.F), b=t(Op.D), w=t(Op.W), comm=comm, mem_f=stash, mem_b=stash_w - stash, mem_w=-stash_w)


def _greedy_times_exact(p: int, cost: Any, links: Any) -> bool:
    """True when the greedy's own makespan is the simulator's: free links, equal times on
    every unit (the greedy prices every F, D, W alike)."""
    return links is None and all(len({_duration(cost, op, u, p) for u in range(2 * p)}) == 1
                                 for op in (Op.F, Op.D, Op.W))


def _check_options(order: str, memory_limit: Any, solver_time_limit: Any) -> None:
    if order not in ORDERS:
        raise ValueError(f"zb-v order must be one of {', '.join(ORDERS)} (got {order!r})")
    for name, v in (("memory_limit", memory_limit), ("solver_time_limit", solver_time_limit)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0
                              or not math.isfinite(v)):
            raise ValueError(f"zb-v {name} must be a positive number or None (got {v!r})")


class _Timed:
    """A candidate schedule with its simulated makespan and peak memory."""

    def __init__(self, schedule: Schedule, cost: Any, links: Any, source: str) -> None:
        from ..sim import simulate
        r = simulate(schedule, cost, links)
        self.schedule, self.source, self.result = schedule, source, r
        self.makespan, self.peak = r.makespan, max(r.peak_memory)

    def key(self) -> tuple[float, float]:
        return (self.makespan, self.peak)


def select_zb_v(config: PipelineConfig, handcrafted: list[list[Action]], units: list[int], *, cost: Any = None,
                links: Any = None, memory_limit: float | None = None, solver_time_limit: float | None = None,
                order: str = "best") -> Schedule:
    """The zb-v schedule of ``config`` (module doc); ``handcrafted``: that order's per-rank computes."""
    from ..cost.uniform import UniformCost
    _check_options(order, memory_limit, solver_time_limit)
    cost = cost if cost is not None else UniformCost()
    p, m = config.stages, config.microbatches

    def build(orders: list[list[Action]], source: str) -> _Timed:
        s = assemble("zb-v", config, units, orders, split_backward=True, order=source)
        return _Timed(s, cost, links, source)

    if order in ("best", "handcrafted") and memory_limit is None and solver_time_limit is None and links is None:
        span = _asap_makespan(handcrafted, cost, p)
        if order == "handcrafted" or span <= _lower_bound(p, m, cost) + 1e-9:   # nothing can be faster
            return assemble("zb-v", config, units, handcrafted, split_backward=True, order="handcrafted",
                            predicted_makespan=span)
    hand = build(handcrafted, "handcrafted")
    limit = hand.peak if memory_limit is None else float(memory_limit)
    fits = [hand] if hand.peak <= limit + 1e-9 and order in ("best", "handcrafted") else []
    if order in ("best", "greedy"):
        beat = hand.makespan if fits and _greedy_times_exact(p, cost, links) else math.inf
        fits += _greedy_fitting(p, m, cost, links, limit, build, beat)
    if order == "wave-greedy" or \
            (order == "best" and (not fits or links is not None or p * m <= WAVE_GREEDY_MAX_PM)):
        fits += _wave_greedy(config, cost, links, limit, [hand.peak])
    if not fits:
        raise ValueError(f"zb-v memory_limit={memory_limit!r} is below the peak of every {order!r} zb-v order "
                         f"at P={p}, M={m} (the handcrafted order needs {hand.peak:g}); allowed: a limit that "
                         f"one of them fits")
    best = min(fits, key=_Timed.key)
    if solver_time_limit is not None and order == "best":
        best = _improve_by_solver(config, best, cost, links, limit, solver_time_limit, build)
    best.schedule.meta.update(memory_limit=limit, predicted_makespan=best.makespan)
    from ..sim import remember_simulation
    remember_simulation(best.schedule, cost, links, best.result)
    return best.schedule


def _duration(cost: Any, op: Op, u: int, p: int) -> float:
    return float(cost.compute_time(Action(op, u, 0), u if u < p else 2 * p - 1 - u))


def _asap_makespan(orders: list[list[Action]], cost: Any, p: int) -> float:
    """Makespan of per-rank compute orders on the V placement with free transfers: each
    op starts when its rank is free and its input is ready (what the simulator computes
    for such a schedule, without building it)."""
    n_units = 2 * p
    end: dict[tuple[Op, int, int], float] = {}
    pos, now = [0] * p, [0.0] * p
    left = sum(len(o) for o in orders)
    while left:
        moved = False
        for r in range(p):
            while pos[r] < len(orders[r]):
                a = orders[r][pos[r]]
                u, mb = a.unit, a.mb[0]
                if a.op is Op.F:
                    deps = [(Op.F, u - 1, mb)] if u > 0 else []
                elif a.op is Op.D:
                    deps = [(Op.F, u, mb)] + ([(Op.D, u + 1, mb)] if u < n_units - 1 else [])
                else:
                    deps = [(Op.D, u, mb)]
                if any(d not in end for d in deps):
                    break
                start = max([now[r]] + [end[d] for d in deps])
                now[r] = end[(a.op, u, mb)] = start + _duration(cost, a.op, u, p)
                pos[r] += 1
                left -= 1
                moved = True
        if not moved:
            raise AssertionError("the handcrafted ZB-V order deadlocks")
    return max(now)


def _lower_bound(p: int, m: int, cost: Any) -> float:
    """No order is faster: a rank starts after the forwards of micro-batch 0 before its
    first unit, then runs all its F, D and W (free transfers)."""
    best, start = 0.0, 0.0
    for r in range(p):
        work = sum(_duration(cost, op, u, p) for u in (r, 2 * p - 1 - r) for op in (Op.F, Op.D, Op.W))
        best = max(best, start + m * work)
        start += _duration(cost, Op.F, r, p)
    return best


def _greedy_fitting(p: int, m: int, cost: Any, links: Any, limit: float, build: Any,
                    beat: float = math.inf) -> list[_Timed]:
    """The fastest of the greedy's four variants at the authors' cap (2P stashes; below it
    their warm-up stalls) whose order fits ``limit`` in the simulator, by the greedy's own
    timing; empty if none does. Variants whose own makespan is not below ``beat`` are not
    simulated (the caller passes a finite ``beat`` only where the greedy's timing is exact)."""
    for v in sorted(zbv_greedy_variants(p, m, **_greedy_inputs(p, cost, links)), key=lambda v: v.makespan):
        if v.makespan >= beat - 1e-9:
            break
        t = build(v.orders, "greedy")
        if t.peak <= limit + 1e-9:
            return [t]
    return []


def _wave_greedy(config: PipelineConfig, cost: Any, links: Any, limit: float, tries: Sequence[float]) -> list[_Timed]:
    """pipert's memory-aware greedy on the V placement (``crosspipe`` wave, whole W blocks),
    lowered with its own receive positions, which its memory accounting assumes. It is not
    monotone in its limit, so it runs at ``limit`` and at each of ``tries`` above it; the
    orders that fit ``limit`` in the simulator are returned."""
    from .crosspipe.build import make_problem
    from .crosspipe.greedy import GreedyConfig, greedy_best
    from .crosspipe.lowering import lower_crosspipe
    out = []
    for lim in sorted({limit, *(t for t in tries if t > limit)}):
        pr = make_problem(config, "wave", cost, links, lim)
        try:
            g = greedy_best(pr, GreedyConfig(sub_blocks=1))
        except ValueError:          # stuck on the memory limit under every rule
            continue
        t = _Timed(lower_crosspipe(pr, g.orders, g.recv_at, name="zb-v", meta={"order": "wave-greedy"}),
                   cost, links, "wave-greedy")
        if t.peak <= limit + 1e-9:
            out.append(t)
    return out


def _improve_by_solver(config: PipelineConfig, best: _Timed, cost: Any, links: Any, limit: float,
                       time_limit: float, build: Any) -> _Timed:
    """CP-SAT (one worker, deterministic time limit) hinted with ``best``; its order is
    kept when the simulator times it faster within the limit."""
    from .crosspipe.build import make_problem, schedule_as_hint
    from .crosspipe.solver import SolverConfig, solve
    pr = make_problem(config, "wave", cost, links, limit)
    hint = schedule_as_hint(pr, best.schedule, cost, links)
    if hint is None:
        return best
    res = solve(pr, SolverConfig(time_limit_s=10 * time_limit, deterministic_limit=time_limit, workers=1,
                                 sub_blocks=1), hint=hint)
    best.schedule.meta.update(solver_status=res.status, solver_bound=res.bound)
    if res.status == "HINT":
        return best
    cand = build(res.orders, "cp-sat")
    if cand.peak <= limit + 1e-9 and cand.makespan < best.makespan - 1e-9:
        cand.schedule.meta.update(solver_status=res.status, solver_bound=res.bound)
        return cand
    return best
