"""Timing when ranks share compute devices: processor sharing over the engine's DAG.

The engine (timing.py) gives every rank a device of its own. When several ranks run on one
device with fewer cores than ranks (4 gloo processes on a 2-core host; 4 emulated ranks on one
GPU), the computes that run at the same time share the device: with n computes active on a
device of capacity c, each progresses at rate ``min(1, c / n)`` (processor sharing, the
time-sliced limit of an operating system's scheduler). Transfers and collectives take no
device share. The DAG, its durations and its edges are the engine's (``Graph``), so the
program's meaning is the same as for :func:`pipert.sim.simulate`; only the clock rule differs.
With every device's capacity at least its number of ranks the result equals the engine's.
"""
from __future__ import annotations

import heapq
from typing import Any, Sequence

from .graph import Graph

__all__ = ["shared_makespan", "shared_step"]

_EPS = 1e-12


def _device_of_nodes(g: Graph, device_of_rank: Sequence[int]) -> list[int]:
    """Device index of each compute-queue node, -1 for transfers and collectives."""
    dev = [-1] * len(g.kind)
    for r, nodes in enumerate(g.compute_nodes):
        for n in nodes:
            if g.kind[n] == 0:
                dev[n] = device_of_rank[r]
    return dev


def shared_makespan(g: Graph, device_of_rank: Sequence[int], capacity: Sequence[float]) -> float:
    """Makespan of graph ``g`` when rank r computes on device ``device_of_rank[r]`` and device d
    runs ``capacity[d]`` computes at full speed (see the module doc). Raises ValueError for a
    graph the engine could not time (a cycle) or a bad mapping."""
    P = len(g.compute_nodes)
    if len(device_of_rank) != P:
        raise ValueError(f"device_of_rank: one device per rank ({P}), got {len(device_of_rank)}")
    if any(not 0 <= d < len(capacity) for d in device_of_rank):
        raise ValueError(f"device_of_rank {list(device_of_rank)}: devices are 0..{len(capacity) - 1}")
    if any(c <= 0 for c in capacity):
        raise ValueError(f"capacity {list(capacity)}: every device needs a positive capacity")
    dev = _device_of_nodes(g, device_of_rank)
    indeg = list(g.indeg)
    ready = [0.0] * len(g.kind)
    releases = [(0.0, n) for n in range(len(g.kind)) if not indeg[n]]
    heapq.heapify(releases)
    active: list[dict[int, float]] = [{} for _ in capacity]  # device -> node -> work left
    now, makespan, done = 0.0, 0.0, 0

    def finish(n: int, e0: float) -> None:
        nonlocal makespan, done
        done += 1
        e1 = e0 + g.lat[n]
        makespan = max(makespan, e1)
        for x in g.succ[n]:
            m = x >> 1
            ready[m] = max(ready[m], e1 if x & 1 else e0)
            indeg[m] -= 1
            if not indeg[m]:
                heapq.heappush(releases, (ready[m], m))

    def rate(d: int) -> float:
        return min(1.0, capacity[d] / len(active[d])) if active[d] else 0.0

    while releases or any(active):
        step = min((left / rate(d) for d, nodes in enumerate(active) for left in nodes.values()),
                   default=float("inf"))
        t_next = min(releases[0][0] if releases else float("inf"), now + step)
        for d, nodes in enumerate(active):
            r = rate(d)
            for n in nodes:
                nodes[n] -= (t_next - now) * r
        now = t_next
        for d, nodes in enumerate(active):
            for n in [n for n, left in nodes.items() if left <= _EPS * max(1.0, now)]:
                del nodes[n]
                finish(n, now)
        while releases and releases[0][0] <= now:
            _, n = heapq.heappop(releases)
            if dev[n] < 0 or g.dur[n] <= 0:
                finish(n, max(now, ready[n]) + g.dur[n])
            else:
                active[dev[n]][n] = g.dur[n]
    if done < len(g.kind):
        raise ValueError("the graph has a cycle (the engine reports it as a deadlock)")
    return makespan


def shared_step(program: Any, cost: Any, links: Any, device_of_rank: Sequence[int],
                capacity: Sequence[float]) -> float:
    """:func:`shared_makespan` of the simulator's DAG of ``program`` with ``cost`` and ``links``;
    raises the first error of a program the simulator rejects."""
    from .engine import analyze
    an = analyze(program, cost, links)
    if an.errors:
        raise an.errors[0]
    return shared_makespan(an.graph, device_of_rank, capacity)
