"""The emulator: every rank of a schedule in one process, on per-rank streams.

Each rank gets a StreamSet (compute, send, recv). Compute actions become calibrated waits
of the cost model's duration (a timed wait on a CPU, a spin kernel on a GPU); messages go
through a LinkEmulator (latency + bandwidth per directed link, FIFO, rendezvous), and
collectives are joint waits over their group. Dependencies are stream events, exactly the
three-queue model the simulator predicts (docs/semantics.md), so the measured makespan can
be set beside the prediction.

Dispatch: the host issues every queue in its order, but an item is issued only once the
events it waits on exist (a stream waiting on a never-recorded event would not wait). The
host walks the three queues of all ranks until everything is issued; for a schedule that
validates this always finishes. All streams start together at a common deadline after the
host is done, so dispatch time is not measured.
"""
from __future__ import annotations

import bisect
import time
from dataclasses import dataclass, field
from typing import Any

from ..ir import Action, Op, Payload, Schedule
from ..sim import simulate, validate
from ..runtime.links import LinkEmulator, LinkSpec
from ..runtime.streams import StreamSet, clock

__all__ = ["EmulationResult", "emulate", "scaled_link_emulator"]

_COLLECTIVES = (Op.ALLGATHER, Op.REDUCESCATTER, Op.ALLREDUCE, Op.BROADCAST, Op.REDUCE)


@dataclass
class EmulationResult:
    """Measured and predicted makespans, in the cost model's time unit."""

    schedule: Schedule
    makespan: float
    predicted: float
    time_unit: float
    """Seconds per time unit of the cost model."""
    events: list[tuple[int, str, Action, float, float]] = field(default_factory=list)
    """(rank, queue, action, start, end) in time units from the common start: the same
    shape as SimResult.events, so pipert.sim.export writes traces and charts of it."""

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


def _inputs(a: Action, last: int) -> list[tuple]:
    """Values a compute action waits for (produced by another queue or rank)."""
    u = a.unit
    if a.op is Op.F:
        keys = [(Payload.ACT, u - 1, m) for m in a.mb] if u > 0 else []
        return keys + [(Payload.WEIGHT, u, -1)]
    if a.op in (Op.B, Op.D):
        keys = [(Payload.GRAD, u, m) for m in a.mb] if u < last else []
        return keys + [(Payload.WEIGHT, u, -1)]
    if a.op is Op.OPT:
        return [(Payload.WGRAD, u, -1), (Payload.WEIGHT, u, -1)] if u is not None else []
    return []  # W needs only its own stash: gradient contributions add in any order


def _outputs(a: Action, last: int) -> list[tuple]:
    u = a.unit
    if a.op is Op.F:
        return [(Payload.ACT, u, m) for m in a.mb] if u < last else []
    if a.op in (Op.B, Op.D):
        out = [(Payload.GRAD, u - 1, m) for m in a.mb] if u > 0 else []
        return out + ([(Payload.WGRAD, u, -1)] if a.op is Op.B else [])
    if a.op is Op.W:
        return [(Payload.WGRAD, u, -1)]
    if a.op is Op.OPT and u is not None:
        return [(Payload.WEIGHT, u, -1)]
    return []


def _key(a: Action) -> tuple:
    if a.payload in (Payload.WEIGHT, Payload.WGRAD):
        return (a.payload, a.unit, -1)
    return (a.payload, a.unit, a.mb[0])


class _Dispatcher:
    def __init__(self, s: Schedule, cost: Any, links: LinkEmulator, time_unit: float, sets: list[StreamSet],
                 links_model: Any) -> None:
        self.s, self.cost, self.links, self.unit, self.sets = s, cost, links, time_unit, sets
        self.links_model = links_model
        self.last = s.num_units - 1
        self.queues = []
        for acts in s.actions:
            q = {"compute": [], "send": [], "recv": []}
            for i, a in enumerate(acts):
                if a.op is Op.SEND or a.op in _COLLECTIVES:
                    q["send"].append((i, a))
                elif a.op is Op.RECV:
                    q["recv"].append((i, a))
                else:
                    q["compute"].append((i, a))
            self.queues.append(q)
        self.pos = [{"compute": 0, "send": 0, "recv": 0} for _ in s.actions]
        # key -> [(list index, event)], sorted: a consumer at index i uses the latest producer
        # before i (a unit's weights are received several times; transfers issue early).
        self.values: list[dict[tuple, list]] = [dict() for _ in s.actions]
        self.transfers: dict[tuple[int, int], dict[int, Any]] = {}           # (rank, index) -> Transfer
        self.timed: list[tuple[int, str, Action, Any, Any]] = []
        self.link_streams: dict[tuple[int, int], Any] = {}
        self.t_start = 0.0
        self.arrivals: list[Any] = []

    def _link_stream(self, s: int, d: int) -> Any:
        st = self.link_streams.get((s, d))
        if st is None:
            st = self.link_streams[(s, d)] = type(self.sets[d].recv)(f"link{s}->{d}", -1)
            st.enqueue_delay_until(self.t_start)
        return st

    def _ready(self, r: int, keys: list[tuple], before: int) -> list | None:
        """Events to wait for, or None if a producer earlier than action ``before`` has not
        been issued yet (a value with no earlier producer is present from the start)."""
        out = []
        for k in keys:
            if self._pending_producer(r, k, before):
                return None
            if k[0] is Payload.WGRAD:  # a sum: wait for every contribution made before
                out.extend(ev for idx, ev in self.values[r].get(k, ()) if idx < before)
                continue
            ev = self._latest(r, k, before)
            if ev is not None:
                out.append(ev)
        return out

    def _latest(self, r: int, key: tuple, before: int) -> Any:
        entries = self.values[r].get(key, ())
        k = bisect.bisect_left(entries, (before, -1), key=lambda e: (e[0], -1)) - 1
        return entries[k][1] if k >= 0 else None

    def _produce(self, r: int, key: tuple, index: int, event: Any) -> None:
        bisect.insort(self.values[r].setdefault(key, []), (index, event), key=lambda e: e[0])

    def _pending_producer(self, r: int, key: tuple, before: int) -> bool:
        """Whether an action before ``before`` not yet issued on rank r produces ``key``."""
        for q in ("recv", "compute", "send"):
            for i, a in self.queues[r][q][self.pos[r][q]:]:
                if i >= before:
                    break
                if a.op is Op.RECV and _key(a) == key:
                    return True
                if a.is_compute and key in _outputs(a, self.last):
                    return True
                if a.op in _COLLECTIVES and _key(a) == key:
                    return True
        return False

    def _compute(self, r: int) -> bool:
        q, progressed = self.queues[r]["compute"], False
        ss = self.sets[r]
        while self.pos[r]["compute"] < len(q):
            i, a = q[self.pos[r]["compute"]]
            if a.op is Op.WAIT:
                tr = self.transfers.get((r, self._wait_target(r, i, a)))
                if tr is None:
                    return progressed
                ss.compute.wait(tr.arrived if a.waits is Op.RECV else tr.sent)
            elif a.is_compute:
                last_piece = a.sub is None or a.sub[0] == a.sub[1] - 1
                first_piece = a.sub is None or a.sub[0] == 0
                waits = self._ready(r, _inputs(a, self.last), i) if first_piece else []
                if waits is None:
                    return progressed
                for ev in waits:
                    ss.compute.wait(ev)
                start = ss.compute.record()
                seconds = self.cost.compute_time(a, r) * self.unit
                if seconds > 0:
                    ss.compute.enqueue_delay(seconds)
                end = ss.compute.record()
                self.timed.append((r, "compute", a, start, end))
                if last_piece:
                    for k in _outputs(a, self.last):
                        self._produce(r, k, i, end)
            self.pos[r]["compute"] += 1
            progressed = True
        return progressed

    def _wait_target(self, r: int, i: int, a: Action) -> int:
        want = Action(a.waits, unit=a.unit, mb=a.mb, payload=a.payload, peer=a.peer, tag=a.tag)
        return max(j for j, b in enumerate(self.s.actions[r][:i]) if b == want)

    def _transfers(self, r: int) -> bool:
        """Issue the send at the head of rank r's send queue if its receive is at the head of
        the peer's receive queue (FIFO per link), or a collective whose members are all ready."""
        q = self.queues[r]["send"]
        if self.pos[r]["send"] >= len(q):
            return False
        i, a = q[self.pos[r]["send"]]
        if a.op in _COLLECTIVES:
            return self._collective(r, i, a)
        d = a.peer
        rq = self.queues[d]["recv"]
        if self.pos[d]["recv"] >= len(rq):
            return False
        j, b = rq[self.pos[d]["recv"]]
        if b.peer != r:
            return False
        waits = self._ready(r, [_key(a)], i)
        if waits is None:
            return False
        src, dst = self.sets[r], self.sets[d]
        for ev in waits:
            src.send.wait(ev)
        # Rendezvous with the receiver's queue; the receive queue is busy for the link
        # occupancy and the data lands one latency later on the link's own stream
        # (arrivals on one link are FIFO), as the simulator models it.
        src.send.wait(dst.recv.record())
        nbytes = self.cost.message_bytes(a.payload, a.unit, max(1, len(a.mb)))
        tr = self.links.enqueue_transfer(r, d, nbytes, src.send, self._link_stream(r, d), rendezvous=False)
        dst.recv.wait(tr.sent)
        self.transfers[(r, i)] = tr
        self.transfers[(d, j)] = tr
        self._produce(d, _key(b), j, tr.arrived)
        self.arrivals.append(tr.arrived)
        self.timed.append((r, "send", a, None, tr.sent))
        self.pos[r]["send"] += 1
        self.pos[d]["recv"] += 1
        return True

    def _collective(self, r: int, i: int, a: Action) -> bool:
        members = sorted(set(a.group))
        heads = []
        for m in members:
            q = self.queues[m]["send"]
            if self.pos[m]["send"] >= len(q):
                return False
            j, b = q[self.pos[m]["send"]]
            if b.op is not a.op or b.unit != a.unit or tuple(sorted(b.group)) != tuple(members):
                return False
            waits = self._ready(m, [_key(b)], j)
            if waits is None:
                return False
            heads.append((m, j, b, waits))
        arrived = []
        for m, j, b, waits in heads:
            st = self.sets[m].send
            for ev in waits:
                st.wait(ev)
            arrived.append(st.record())
        nbytes = self.cost.message_bytes(a.payload, a.unit, 1)
        seconds = self.links_model.collective(a.op.value, tuple(members), nbytes) * self.unit \
            if self.links_model is not None else 0.0
        for (m, j, b, _), _ in zip(heads, arrived):
            st = self.sets[m].send
            for ev in arrived:
                st.wait(ev)
            start = st.record()
            if seconds > 0:
                st.enqueue_delay(seconds)
            done = st.record()
            self._produce(m, _key(b), j, done)
            self.timed.append((m, "send", b, start, done))
            self.pos[m]["send"] += 1
        return True

    def run(self) -> None:
        P = self.s.num_ranks
        while True:
            progressed = False
            for r in range(P):
                progressed |= self._compute(r)
                progressed |= self._transfers(r)
            if all(self.pos[r][q] >= len(self.queues[r][q]) for r in range(P) for q in ("compute", "send", "recv")):
                return
            if not progressed:
                stuck = [(r, q, self.queues[r][q][self.pos[r][q]]) for r in range(P) for q in ("compute", "send", "recv")
                         if self.pos[r][q] < len(self.queues[r][q])]
                r, q, (i, a) = stuck[0]
                raise RuntimeError(f"emulator dispatch stuck: rank {r} {q} queue at action {i} ({a}); "
                                   f"was the schedule validated?")


def emulate(schedule: Schedule, cost: Any, links: Any = None, *, time_unit: float = 1e-3,
            backend: str | None = None, start_delay: float | None = None) -> EmulationResult:
    """Run ``schedule`` with calibrated compute and delayed links; measured vs simulated.

    ``time_unit``: seconds per time unit of ``cost``/``links`` (uniform costs are unitless).
    """
    validate(schedule, cost=cost)
    predicted = simulate(schedule, cost, links=links).makespan
    P = schedule.num_ranks
    sets = [StreamSet("cpu", name=f"rank{r}", backend=backend) for r in range(P)]
    try:
        em = scaled_link_emulator(links, P, time_unit)
        # All streams wait for a common start, after the host has issued everything.
        delay = start_delay if start_delay is not None else 0.2 + 50e-6 * schedule.num_actions()
        t_start = clock() + delay
        for ss in sets:
            for st in ss.streams:
                st.enqueue_delay_until(t_start)
        d = _Dispatcher(schedule, cost, em, time_unit, sets, links)
        d.t_start = t_start
        try:
            d.run()
            issued = clock()
            for ss in sets:
                ss.synchronize()
            for st in d.link_streams.values():
                st.synchronize()
        finally:
            for st in d.link_streams.values():
                st.close()
        if issued > t_start:
            raise RuntimeError(f"dispatch took {issued - t_start + delay:.3f} s, longer than the start delay "
                               f"{delay:.3f} s; pass a larger start_delay")
        events = []
        ends = []
        for r, q, a, start, end in d.timed:
            e = end.time
            ends.append(e)
            s0 = start.time if start is not None else e
            events.append((r, q, a, (s0 - t_start) / time_unit, (e - t_start) / time_unit))
        ends += [ev.time for ev in d.arrivals]
        makespan = (max(ends) - t_start) / time_unit
    finally:
        for ss in sets:
            ss.close()
    return EmulationResult(schedule, makespan, predicted, time_unit, sorted(events, key=lambda e: (e[0], e[3])))
