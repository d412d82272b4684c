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
from typing import Sequence

from .graph import Graph
from .timing import Times

__all__ = ["shared_makespan", "shared_times"]

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
    dev = _device_of_nodes(g, device_of_rank)
    return shared_times(g, [(d,) if d >= 0 else () for d in dev], capacity).makespan


def shared_times(g: Graph, resources: Sequence[tuple[int, ...]], capacity: Sequence[float]) -> Times:
    """Node times of graph ``g`` when node n runs on the shared resources ``resources[n]`` (none:
    at full speed, as in the engine): with k nodes active on resource x of capacity c, each
    progresses at ``min(1, c / k)``, a node on several resources at the least of their rates.
    Raises ValueError for a graph the engine could not time (a cycle) or a bad capacity."""
    if any(c <= 0 for c in capacity):
        raise ValueError(f"capacity {list(capacity)}: every device needs a positive capacity")
    N = len(g.kind)
    indeg = list(g.indeg)
    ready, start, end0, end1 = [0.0] * N, [0.0] * N, [0.0] * N, [0.0] * N
    releases = [(0.0, n) for n in range(N) if not indeg[n]]
    heapq.heapify(releases)
    active: dict[int, float] = {}          # node -> work left
    load = [0] * len(capacity)             # resource -> active nodes on it
    now, done = 0.0, 0

    def finish(n: int, e0: float) -> None:
        nonlocal done
        done += 1
        end0[n], end1[n] = e0, e0 + g.lat[n]
        for x in g.succ[n]:
            m = x >> 1
            ready[m] = max(ready[m], end1[n] if x & 1 else e0)
            indeg[m] -= 1
            if not indeg[m]:
                heapq.heappush(releases, (ready[m], m))

    def rate(n: int) -> float:
        return min(1.0, min(capacity[x] / load[x] for x in resources[n]))

    while releases or active:
        rates = {n: rate(n) for n in active}
        step = min((left / rates[n] for n, left in active.items()), default=float("inf"))
        t_next = min(releases[0][0] if releases else float("inf"), now + step)
        for n in active:
            active[n] -= (t_next - now) * rates[n]
        now = t_next
        for n in [n for n, left in active.items() if left <= _EPS * max(1.0, now)]:
            del active[n]
            for x in resources[n]:
                load[x] -= 1
            finish(n, now)
        while releases and releases[0][0] <= now:
            _, n = heapq.heappop(releases)
            start[n] = max(now, ready[n])
            if not resources[n] or g.dur[n] <= 0:
                finish(n, start[n] + g.dur[n])
            else:
                active[n] = g.dur[n]
                for x in resources[n]:
                    load[x] += 1
    if done < N:
        raise ValueError("the graph has a cycle (the engine reports it as a deadlock)")
    return Times(start, end0, end1)
