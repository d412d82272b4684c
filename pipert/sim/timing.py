"""Pass 2 of the engine: longest path through the action DAG (Kahn's algorithm), deadlock
(cycle) reporting, and the weight-grad set rules that need topological order.

``start[n]`` is the latest of the times its in-edges carry (0 for a node without any),
``end0 = start + dur``, ``end1 = end0 + lat`` (see graph.py). Time 0 is the earliest start.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from typing import Any

from ..ir.action import Action
from .errors import ScheduleError
from .. import native
from .graph import Graph
from .keys import K_TRANSFER

__all__ = ["Times", "run_timing", "retimed", "same_messages", "no_earlier", "locate"]


@dataclass
class Times:
    """Start and end times of every node of a Graph."""

    start: list[float]
    """Start time per node."""
    end0: list[float]
    """Occupancy / compute end per node (frees its queues and link)."""
    end1: list[float]
    """Data-ready time per node (end0 + latency)."""

    @property
    def makespan(self) -> float:
        return max(self.end1, default=0.0)


def run_timing(g: Graph) -> tuple[Times, list[int], list[ScheduleError]]:
    """Times of all nodes, topological order, and deadlock/weight-grad errors (the sweep in C
    where pipert._simc is built: the same times and order)."""
    n_nodes = len(g.kind)
    if native.SIMC is not None and type(g.succ) is native.SIMC.Succ:
        ready, end0, end1, order, indeg = native.SIMC.longest_path(g.dur, g.lat, g.succ, g.indeg)
        return _checked(g, Times(ready, end0, end1), order, indeg)
    indeg = list(g.indeg)
    ready = [0.0] * n_nodes
    end0 = [0.0] * n_nodes
    end1 = [0.0] * n_nodes
    dur, lat, succ = g.dur, g.lat, g.succ
    stack = [n for n in range(n_nodes) if not indeg[n]]
    order: list[int] = []
    pop, push, visit = stack.pop, stack.append, order.append
    while stack:
        n = pop()
        visit(n)
        e0 = ready[n] + dur[n]
        e1 = e0 + lat[n]
        end0[n] = e0
        end1[n] = e1
        for x in succ[n]:
            m = x >> 1
            t = e1 if x & 1 else e0
            if t > ready[m]:
                ready[m] = t
            c = indeg[m] - 1
            indeg[m] = c
            if not c:
                push(m)
    return _checked(g, Times(ready, end0, end1), order, indeg)


def retimed(g: Graph, cost: Any, built_with: Any) -> Times | None:
    """The node times of graph ``g`` (built under cost model ``built_with``) with every compute
    priced by ``cost`` as pass 1 prices it (``Builder.run``): the times pass 2 gives the graph
    ``simulate(g.schedule, cost, ...)`` builds, where each message and collective of the schedule
    moves the same bytes under both models (then pass 1 builds the same nodes and edges and prices
    the same transfers; it reads the cost model otherwise only for memory). None where a message's
    bytes differ."""
    s = g.schedule
    if not same_messages(s, cost, built_with):
        return None
    dur = g.dur.tolist() if hasattr(g.dur, "tolist") else list(g.dur)
    for r, (acts, nodes) in enumerate(zip(s.actions, g.node_of)):
        for a, n in zip(acts, nodes):
            if n >= 0 and g.kind[n] == 0 and a.op in _PRICED:
                dur[n] = _price(cost, a, r)
    arrays = native.node_arrays()[1]
    if hasattr(arrays, "tolist"):     # pipert._simc's typed array for its sweep
        for x in dur:
            arrays.append(x)
        dur = arrays
    times, _, errors = run_timing(replace(g, dur=dur))
    return None if errors else times


def same_messages(schedule: Any, cost: Any, other: Any) -> bool:
    """Whether every message and collective of ``schedule`` moves the same bytes under cost models
    ``cost`` and ``other``."""
    from ..ir.semantics import COLLECTIVE_OPS, P2P_OPS
    seen: set[tuple] = set()
    for acts in schedule.actions:
        for a in acts:
            if a.op in P2P_OPS or a.op in COLLECTIVE_OPS:
                what = (a.payload, a.unit, len(a.mb) or 1)
                if what not in seen:
                    seen.add(what)
                    if cost.message_bytes(*what) != other.message_bytes(*what):
                        return False
    return True


def no_earlier(schedule: Any, cost: Any, than: Any) -> bool:
    """Whether every time the engine gives ``schedule`` under cost model ``cost`` is no earlier than
    under ``than``: each compute lasts no less and each message moves the same bytes (pass 1 then
    builds the same graph, and its times are a longest path, which no longer duration shortens)."""
    if not same_messages(schedule, cost, than):
        return False
    return all(_price(cost, a, r) >= _price(than, a, r)
               for r, acts in enumerate(schedule.actions) for a in acts if a.op in _PRICED)


def _price(cost: Any, a: Action, r: int) -> float:
    """Seconds of compute-queue action ``a`` on rank r as pass 1 prices it (``Builder.run``)."""
    from ..ir.semantics import action_time
    price = cost.compute_time
    return price(a, r) if a.sub is None and len(a.mb) < 2 else action_time(price, a, r)


def _priced() -> frozenset:
    from ..ir.semantics import COLLECTIVE_OPS, TIMED_OPS
    return frozenset(TIMED_OPS - COLLECTIVE_OPS)


_PRICED = _priced()
"""Ops whose actions pass 1 prices by the cost model (collectives: by the link model)."""


def _checked(g: Graph, times: Times, order: list[int], indeg: list[int]) -> tuple[Times, list[int],
                                                                                  list[ScheduleError]]:
    """The sweep's result with its errors: a deadlock where some node was never reached (``indeg``:
    the in-edges left), else the weight-grad set rules."""
    if len(order) < len(g.kind):
        return times, order, [_deadlock(g, indeg)]
    return times, order, _wgrad_sets(g, order)


def locate(g: Graph, nodes: set[int]) -> dict[int, list[tuple[int, int, Action]]]:
    """(rank, index, action) of every action mapped to each of ``nodes``, in rank order."""
    out: dict[int, list[tuple[int, int, Action]]] = {n: [] for n in nodes}
    for r, nodes_r in enumerate(g.node_of):
        acts = g.schedule.actions[r]
        for i, n in enumerate(nodes_r):
            if n in out:
                out[n].append((r, i, acts[i]))
    return out


def _describe(g: Graph, refs: list[tuple[int, int, Action]]) -> str:
    parts = [f"{a} (rank {r}, action {i})" for r, i, a in refs]
    return " matched with ".join(parts)


def _deadlock(g: Graph, indeg: list[int]) -> ScheduleError:
    """Find a cycle among the nodes Kahn could not reach and name it."""
    stuck = [n for n in range(len(indeg)) if indeg[n]]
    stuck_set = set(stuck)
    preds: dict[int, list[int]] = {}
    for p in stuck:
        for x in g.succ[p]:
            m = x >> 1
            if m in stuck_set:
                preds.setdefault(m, []).append(p)
    # every stuck node waits for a stuck predecessor, so walking predecessors must repeat
    seen: dict[int, int] = {}
    path: list[int] = []
    n = stuck[0]
    while n not in seen:
        seen[n] = len(path)
        path.append(n)
        n = preds[n][0]
    cycle = path[seen[n]:]
    refs = locate(g, set(cycle))
    k = min(range(len(cycle)), key=lambda j: (refs[cycle[j]][0][0], refs[cycle[j]][0][1]) if refs[cycle[j]]
            else (1 << 62, 0))
    cycle = cycle[k:] + cycle[:k]
    r, i, a = refs[cycle[0]][0]
    hops = [_describe(g, refs[c]) for c in cycle[1:]] + [f"{a} again"]
    shown = hops if len(hops) <= 8 else hops[:7] + [f"... ({len(hops) - 7} more)"]
    return ScheduleError(r, i, a, "deadlock", "deadlock: waits for " + ", which waits for ".join(shown))


def _wgrad_sets(g: Graph, order: list[int]) -> list[ScheduleError]:
    """Union weight-grad contributions in topological order; check OPTs get their update."""
    if not g.wg_parts and not g.opt_checks:
        return []
    need = set(g.wg_parts).union(c[0] for c in g.opt_checks)
    # the topological rank among these nodes (a C-level filter of the order): sorts them as the order does
    pos = {n: k for k, n in enumerate(filter(need.__contains__, order))}
    errors: list[ScheduleError] = []
    sets: dict[int, set[int]] = {}
    items = [(pos[n], 0, n, None) for n in g.wg_parts] + [(pos[c[0]], 1, c[0], c) for c in g.opt_checks]
    items.sort(key=lambda t: (t[0], t[1]))
    every = g.schedule.meta.get("update_every")
    M = g.schedule.num_microbatches
    for _, is_opt, n, chk in items:
        if not is_opt:
            parts = [mb for local, srcs in g.wg_parts[n] for mb in [local] + [sets.get(s, set()) for s in srcs]]
            union, dup = _union(parts)
            sets[n] = union
            if dup:
                refs = locate(g, {n})[n]
                r, i, a = refs[0] if g.kind[n] != K_TRANSFER else next((x for x in refs if x[2].op.value == "SEND"),
                                                                       refs[0])
                errors.append(ScheduleError(r, i, a, "wgrad", f"micro-batch(es) {dup} contribute twice to the "
                                            f"weight gradient of unit {a.unit}"))
            continue
        _, r, i, a, u, local, srcs, j = chk
        union, dup = _union([local] + [sets.get(s, set()) for s in srcs])
        if every:
            need = set(range(j * every, min((j + 1) * every, M)))
            what = f"update {j} (micro-batches {j * every}..{min((j + 1) * every, M) - 1})"
        else:
            need = set(range(M)) if j == 0 else set()
            what = "the update" if j == 0 else f"a second update (meta has no 'update_every')"
        if dup:
            errors.append(ScheduleError(r, i, a, "wgrad", f"micro-batch(es) {dup} contribute twice to the weight "
                                        f"gradient of unit {u}"))
        elif union != need:
            lack, extra = sorted(need - union), sorted(union - need)
            detail = f"OPT u{u} for {what} "
            detail += f"lacks weight-grad contributions of micro-batch(es) {_short(lack)}" if lack else \
                f"has contributions of micro-batch(es) {_short(extra)} outside it"
            errors.append(ScheduleError(r, i, a, "wgrad", detail))
    return errors


def _union(parts: list) -> tuple[set[int], list[int]]:
    union: set[int] = set()
    total = 0
    for p in parts:
        union.update(p)
        total += len(p)
    if len(union) == total:
        return union, []
    counts = Counter(m for p in parts for m in p)
    return union, sorted(m for m, c in counts.items() if c > 1)


def _short(ms: list[int]) -> str:
    return ", ".join(map(str, ms[:8])) + (f", ... ({len(ms)} in all)" if len(ms) > 8 else "")
