"""The emulator: every rank of a schedule in one process, the engine's DAG realised on streams.

The schedule's action DAG (``pipert.sim.engine.analyze``: the same nodes and edges the simulator
times, built from the op table) is issued node by node, in a topological order, onto streams:

- a compute-queue node on its rank's compute stream: a timed wait of the cost model's duration
  (a calibrated timer on a CPU, a wait kernel on a GPU);
- a transfer on its directed link's stream: the link is busy for the occupancy (FIFO per link);
  the data lands one latency later on the link's arrival stream, so the next message of the link
  may start while the previous one is still in flight;
- a collective on its group's stream, for the link model's collective time.

Each edge is an event: a node's stream waits for the event of each predecessor (its occupancy
end or its data-ready end, as in the DAG). All streams start together at a common deadline after
the host has issued everything, so dispatch time is not measured; the measured makespan is set
beside the simulator's prediction.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

from ..comm.links import LinkEmulator, LinkSpec
from ..device.streams import StreamSet, clock, ideal_done, sleep_until
from ..ir import Action, Schedule
from ..ir.program import Program, rules_of
from ..sim.engine import analyze
from ..sim.keys import K_COLLECTIVE, K_COMPUTE, K_TRANSFER

__all__ = ["EmulationResult", "emulate", "scaled_link_emulator"]


@dataclass
class EmulationResult:
    """Measured and predicted makespans, in the cost model's time unit."""

    schedule: Program | Schedule
    makespan: float
    predicted: float
    time_unit: float
    """Seconds per time unit of the cost model."""
    events: list[tuple[int, str, Action, float, float]] = field(default_factory=list)
    """(rank, queue, action, start, end) in time units from the common start: the same
    shape as SimResult.events, so pipert.sim.export writes traces and charts of it."""
    ideal_makespan: float | None = None
    """The makespan on the streams' ideal clocks (CPU streams; None on devices): what the
    issued delays, waits and transfers add up to without any thread wake-up overhead. It
    equals ``predicted`` when the emulator issued the simulator's graph faithfully."""

    @property
    def bubble_ratio(self) -> float:
        """1 - measured compute time / (ranks x makespan)."""
        busy = sum(e - s for r, q, a, s, e in self.events if q == "compute" and a.is_compute)
        return 1.0 - busy / (self.schedule.num_ranks * self.makespan) if self.makespan else 0.0

    @property
    def error(self) -> float:
        """(measured - predicted) / predicted."""
        return (self.makespan - self.predicted) / self.predicted if self.predicted else 0.0


def scaled_link_emulator(links: Any, num_ranks: int, time_unit: float, backend: str | None = None) -> LinkEmulator:
    """A LinkEmulator in seconds from a pipert.cost Links in model time units."""
    em = LinkEmulator(num_ranks, backend=backend)
    if links is None:
        return em
    for s in range(num_ranks):
        for d in range(num_ranks):
            sp = links.spec(s, d)
            em.set_link(s, d, LinkSpec(sp.latency * time_unit, sp.bandwidth / time_unit, sp.per_message * time_unit))
    return em


def _arrive(sent: Any, latency: float) -> None:
    """On a link's arrival stream: the message arrives one latency after its own occupancy
    ended (ideally). Arrivals on one link keep their FIFO order, and messages in flight
    together each pay only their own latency (a plain delay would queue them behind the
    previous arrival)."""
    t = sent.ideal_time + latency
    sleep_until(t)
    ideal_done(t)


class _Issuer:
    """Puts the DAG's nodes on streams (see module doc)."""

    def __init__(self, an: Any, time_unit: float, backend: str | None, t_start: float) -> None:
        g = an.graph
        self.g, self.unit, self.t_start = g, time_unit, t_start
        s = g.schedule
        self.sets = [StreamSet("cpu", name=f"rank{r}", backend=backend) for r in range(s.num_ranks)]
        self.make = type(self.sets[0].compute)
        self.extra: dict[Any, Any] = {}
        self.owner: dict[int, tuple[int, int]] = {}     # node -> (rank, action index) of its first action
        self.link_of: dict[int, tuple[int, int]] = {}
        for r, nodes in enumerate(g.node_of):
            for i, n in enumerate(nodes):
                if n >= 0 and n not in self.owner:
                    self.owner[n] = (r, i)
        self.group_of: dict[int, tuple[int, ...]] = {}
        for r, acts in enumerate(s.actions):
            for i, a in enumerate(acts):
                n = g.node_of[r][i]
                if n >= 0 and g.kind[n] == K_TRANSFER and a.op.value == "SEND":
                    self.link_of[n] = (r, a.peer)
                elif n >= 0 and g.kind[n] == K_COLLECTIVE:
                    self.group_of[n] = tuple(sorted(a.group))
        self.end0: dict[int, Any] = {}
        self.end1: dict[int, Any] = {}
        self.start: dict[int, Any] = {}

    def stream(self, key: Any) -> Any:
        st = self.extra.get(key)
        if st is None:
            st = self.extra[key] = self.make(str(key), -1)
            st.enqueue_delay_until(self.t_start)
        return st

    def issue(self, order: list[int], preds: list[list[int]]) -> None:
        g, unit = self.g, self.unit
        for ss in self.sets:
            for st in ss.streams:
                st.enqueue_delay_until(self.t_start)
        for n in order:
            kind = g.kind[n]
            if kind == K_COMPUTE:
                st = self.sets[self.owner[n][0]].compute
            elif kind == K_TRANSFER:
                st = self.stream(("link",) + self.link_of[n])
            else:
                st = self.stream(("group",) + self.group_of[n])
            for x in preds[n]:
                p, use_end1 = x >> 1, x & 1
                st.wait(self.end1[p] if use_end1 else self.end0[p])
            self.start[n] = st.record()
            if g.dur[n] > 0:
                st.enqueue_delay(g.dur[n] * unit)
            self.end0[n] = st.record()
            if kind == K_TRANSFER and g.lat[n] > 0:
                arrive = self.stream(("arrive",) + self.link_of[n])
                arrive.wait(self.end0[n])
                arrive.enqueue(functools.partial(_arrive, self.end0[n], g.lat[n] * unit))
                self.end1[n] = arrive.record()
            else:
                self.end1[n] = self.end0[n]

    def synchronize(self) -> None:
        for ss in self.sets:
            ss.synchronize()
        for st in self.extra.values():
            st.synchronize()

    def close(self) -> None:
        for st in self.extra.values():
            st.close()
        for ss in self.sets:
            ss.close()


_DISPATCH_TRIES = 3
"""Runs of one emulation, each with a start delay twice the last dispatch time, before giving up."""


def _run(an: Any, time_unit: float, backend: str | None, order: list[int], preds: list[list[int]],
         delay: float) -> tuple[float, list, float | None] | float:
    """One timed run issued ``delay`` seconds ahead: (makespan, events, ideal makespan), or the
    dispatch time when dispatch outlasted the delay (the run's times are then not the schedule's)."""
    g, schedule = an.graph, an.graph.schedule
    t_start = clock() + delay
    iss = _Issuer(an, time_unit, backend, t_start)
    try:
        iss.issue(order, preds)
        issued = clock()
        iss.synchronize()
        if issued > t_start:
            return issued - t_start + delay
        t = lambda ev: (ev.time - t_start) / time_unit  # noqa: E731
        events = []
        for r, nodes in enumerate(g.node_of):
            acts, qs = schedule.actions[r], g.queues[r]
            for i, n in enumerate(nodes):
                if n < 0:
                    continue
                a = acts[i]
                end = iss.end1[n] if a.op.value == "RECV" else iss.end0[n]
                events.append((r, qs[i], a, t(iss.start[n]), t(end)))
        makespan = max((t(ev) for ev in iss.end1.values()), default=0.0)
        ideals = [ev.ideal_time for ev in iss.end1.values()]
        ideal = None if any(x is None for x in ideals) else max(((x - t_start) / time_unit for x in ideals),
                                                                 default=0.0)
    finally:
        iss.close()
    return makespan, events, ideal


def emulate(schedule: Program | Schedule, cost: Any, links: Any = None, *, time_unit: float = 1e-3,
            backend: str | None = None, start_delay: float | None = None) -> EmulationResult:
    """Run a Program (``pipert.compile``) or, when planning, a Schedule with calibrated compute and
    delayed links; measured vs simulated (the same engine, under the program's rules).

    ``time_unit``: seconds per time unit of ``cost``/``links`` (uniform costs are unitless).
    """
    an = analyze(schedule, cost, links, transport=rules_of(schedule))
    if an.errors:
        raise an.errors[0]
    g = an.graph
    from ..sim.timing import run_timing
    times, order, _ = run_timing(g)
    preds: list[list[int]] = [[] for _ in range(g.num_nodes)]
    for p, outs in enumerate(g.succ):
        for x in outs:
            preds[x >> 1].append(p << 1 | (x & 1))
    delay = start_delay if start_delay is not None else 0.2 + 50e-6 * g.num_nodes
    for attempt in range(_DISPATCH_TRIES):
        out = _run(an, time_unit, backend, order, preds, delay)
        if isinstance(out, tuple):
            break
        # dispatch (host work) outlasted the start delay, so the streams did not all start on
        # time: run again with room for it, unless the caller fixed the delay
        if start_delay is not None or attempt == _DISPATCH_TRIES - 1:
            raise RuntimeError(f"dispatch took {out:.3f} s, longer than the start delay {delay:.3f} s"
                               + ("; pass a larger start_delay" if start_delay is not None else
                                  f" after {_DISPATCH_TRIES} runs with growing delays (is the host overloaded?)"))
        delay = 2.0 * out + 0.2
    makespan, events, ideal = out
    return EmulationResult(schedule, makespan, times.makespan, time_unit, sorted(events, key=lambda e: (e[0], e[3])),
                           ideal)


