"""simulate(): discrete-event timing of a schedule under a cost model and a link model.

The same engine as validate() runs first, so a schedule that simulates is valid: any
broken rule raises ScheduleError.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from ..cost.topology import Topology
from ..ir.program import Program, rules_of
from ..ir.schedule import Schedule
from .engine import analyze, paused_gc
from .graph import Graph
from .metrics import Event, comm_bytes, events, exposed_comm
from .timing import Times

__all__ = ["SimResult", "simulate", "remember_simulation", "simulate_once"]


@dataclass
class SimResult:
    """Predicted timing of one schedule (time unit: the cost model's)."""

    schedule: Program | Schedule
    """The simulated program (or schedule)."""
    makespan: float
    """Time from the earliest start (0) to the last completion (a RECV completes on arrival)."""
    busy: list[float]
    """Per rank, total compute time."""
    idle: list[float]
    """Per rank, makespan - busy."""
    bubble_ratio: float
    """1 - sum(busy) / (num_ranks * makespan)."""
    peak_memory: list[float]
    """Per rank, peak running memory in cost-model units."""
    comm_bytes: dict[str, float]
    """Bytes moved per link class (all four classes present)."""
    exposed_comm: list[float]
    """Per rank, time the compute queue waited on communication (metrics.exposed_comm)."""
    graph: Graph = field(repr=False)
    """The engine's DAG (for exporters and further analysis)."""
    times: Times = field(repr=False)
    """The engine's node times."""

    @cached_property
    def events(self) -> list[Event]:
        """(rank, queue, action, start, end) per action; queue in "compute", "send", "recv"."""
        return events(self.graph, self.times)

    @property
    def num_ranks(self) -> int:
        return self.schedule.num_ranks

    def summary(self) -> str:
        return (f"{self.schedule.name}: makespan {self.makespan:g}, bubble {self.bubble_ratio:.1%}, "
                f"peak memory {max(self.peak_memory, default=0):g}")


def simulate(schedule: Program | Schedule, cost: Any, links: Any = None, topology: Any = None,
             memory_limit: Any = None, transport: str | None = None,
             nic_bandwidth: float | None = None) -> SimResult:
    """Time a Program (``pipert.compile``: exactly what the ranks run) or, when planning, a
    Schedule (before the replication and executor lowering ``compile`` adds): compute durations
    from ``cost``, messages from ``links``
    (None: every transfer and collective is free). ``topology`` (default: the links'
    topology, else all ranks on one node) classifies links for ``comm_bytes``.
    ``transport``: the communication rules, "gloo" or "nccl" (``pipert.sim.nccl``); default a
    Program's own, gloo's for a Schedule. ``nic_bandwidth``: the ranks of a node share one NIC
    of this bandwidth each way for their inter-node messages (``pipert.sim.nic``; needs
    ``links``); None: every link has its own bandwidth.
    Raises the first ScheduleError if the schedule breaks a rule."""
    with paused_gc():
        an = analyze(schedule, cost, links, memory_limit, rules_of(schedule, transport))
        if an.errors:
            raise an.errors[0]
        g, t = an.graph, an.times
        if nic_bandwidth is not None:
            from .nic import nic_times
            t = nic_times(g, links, nic_bandwidth)
        if topology is None:
            topology = getattr(links, "topology", None) or Topology(schedule.num_ranks)
        makespan = t.makespan
        P = schedule.num_ranks
        busy = list(g.busy)
        bubble = 1.0 - sum(busy) / (P * makespan) if makespan > 0 else 0.0
        return SimResult(schedule, makespan, busy, [makespan - b for b in busy], bubble, list(g.peak_memory),
                         comm_bytes(g, topology), exposed_comm(g, t), g, t)


def remember_simulation(schedule: Schedule, cost: Any, links: Any, result: SimResult) -> None:
    """Record on ``schedule`` (an attribute, not a field: ``replace`` and files drop it) that
    ``simulate(schedule, cost, links)`` gave ``result``: a generator that simulated its pick
    (zb-v's selection) spares :func:`simulate_once` the same run."""
    schedule._simulated = (cost, links, result)


def simulate_once(schedule: Schedule, cost: Any, links: Any = None, topology: Any = None) -> SimResult:
    """``simulate(schedule, cost, links, topology)``, or the result :func:`remember_simulation`
    recorded for these very ``cost`` and ``links`` objects where ``topology`` is the links' own
    (the default ``simulate`` takes then: the same run)."""
    known = getattr(schedule, "_simulated", None)
    if known is not None and known[0] is cost and known[1] is links and \
            (topology is None or topology == getattr(links, "topology", None)):
        return known[2]
    return simulate(schedule, cost, links, topology)
