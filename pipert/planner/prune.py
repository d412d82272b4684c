"""A lower bound on when each rank's last compute ends, read off a built schedule without
simulating it (the planner skips a layout it proves slower than the top ones found).

The bound keeps a subset of the engine's edges (``pipert.sim``: module docs of ``pipert.sim.graph``
and ``pipert.sim.comm``; the queues of ``pipert.ir.semantics.table.Queue``) with the engine's
durations, and takes the longest path over them, so no time it gives is later than the engine's:

- a rank's compute queue runs its actions in list order, one at a time, each for the cost model's
  duration (``action_time``; untimed ops take 0); a unit compute (F, B, D, W, RECOMPUTE) also waits
  for every value it reads (``pipert.ir.semantics``: what each op reads and writes) that arrived
  by a RECV or a collective (other compute-queue actions wait for their predecessor only);
- a SEND's transfer starts once the rank's compute queue is past everything before it in the list
  (posting), the value it sends is there, and the previous transfer of its directed link has left
  it; it occupies the link ``bytes / bandwidth`` and arrives one latency later (the k-th SEND of
  s to d is the k-th RECV of d from s; the receiving side's posting is left out);
- the k-th collective of a group starts once every member posted it with the values it reads
  there and the (k-1)-th ended, and takes the link model's collective time; on the compute queue
  (a blocking transport) the rank's next action waits for its end.

Ranks are walked together: a rank stops at a value whose message or collective is not timed yet
and goes on once it is. Rank d's bound is when its last non-OPT compute-queue action ends; a
schedule whose walk cannot finish (it would deadlock) gets 0 everywhere (no bound).
"""
from __future__ import annotations

from typing import Any

from ..ir.action import Op
from ..ir.semantics import COLLECTIVE_OPS, TIMED_OPS, UNIT_COMPUTE_OPS, Semantics, action_time
from ..ir.semantics.table import Queue
from ..sim.comm import message_bytes

__all__ = ["finish_bounds", "placement_busy"]

_SEND, _RECV, _OPT = Op.SEND, Op.RECV, Op.OPT   # module constants: each ``Op.X`` is a lookup on 3.11


def finish_bounds(schedule: Any, cost: Any, links: Any) -> list[float]:
    """Per rank, a time its last non-OPT compute cannot end before (module doc)."""
    return _ChainBound(schedule, cost, links).run()


class _ChainBound:
    """The walk of :func:`finish_bounds`. A value's time is a float, or the token of the message
    (``("t", src, dst, k)``) or collective (``("c", group, k)``) that brings it, timed in ``known``
    once its sender or last member is walked."""

    def __init__(self, schedule: Any, cost: Any, links: Any) -> None:
        self.s, self.cost, self.links = schedule, cost, links
        self.sem = Semantics.of(schedule)
        self.queue = {op: self.sem.queue(op) for op in Op}
        P = self.P = schedule.num_ranks
        self.pos, self.host, self.finish = [0] * P, [0.0] * P, [0.0] * P
        self.writer: list[dict] = [{} for _ in range(P)]
        self.recvs: list[dict[int, int]] = [{} for _ in range(P)]   # peer -> RECVs from it so far
        self.sends: list[dict[int, int]] = [{} for _ in range(P)]   # peer -> SENDs to it so far
        self.posted: list[dict[tuple, int]] = [{} for _ in range(P)]   # group -> its collectives so far
        self.held: list[Any] = [None] * P          # a blocking collective posted, its end awaited
        self.link_free: dict[tuple[int, int], float] = {}
        self.group_end: dict[tuple, float] = {}
        self.gathering: dict[tuple, list] = {}     # (group, k) -> [members posted, latest ready]
        self.known: dict[tuple, float] = {}
        self.waiting: dict[tuple, list[int]] = {}
        self.mine: list[dict] = [{} for _ in range(P)]   # per rank: the action's fields -> (reads, writes)
        self.nbytes: dict[tuple, float] = {}
        self.transfers: dict[tuple, tuple[float, float]] = {}
        self.collectives: dict[tuple, float] = {}

    def run(self) -> list[float]:
        todo = list(range(self.P))
        queued = [True] * self.P
        while todo:
            d = todo.pop()
            queued[d] = False
            for token in self._advance(d):
                for w in self.waiting.pop(token, ()):
                    if not queued[w]:
                        queued[w] = True
                        todo.append(w)
        if any(self.pos[d] < len(acts) for d, acts in enumerate(self.s.actions)):
            return [0.0] * self.P     # a rank never got past a value: the engine finds a deadlock
        return self.finish

    def _ready(self, d: int, reads: tuple, mb: tuple, t: float) -> float | None:
        """The latest of ``t`` and the times of the values ``reads`` names on rank d (None: one
        is not timed yet; the rank then waits for its token)."""
        writer, known = self.writer[d], self.known
        for kind, u, slots in reads:
            for m in mb if slots is None else slots:
                v = (kind, u, m)
                w = writer.get(v, 0.0)
                if type(w) is tuple:
                    got = known.get(w)
                    if got is None:
                        self.waiting.setdefault(w, []).append(d)
                        return None
                    w = writer[v] = got
                if w > t:
                    t = w
        return t

    def _advance(self, d: int) -> list[tuple]:
        """Walk rank d until it waits or ends; returns the tokens it timed."""
        acts, mine, timed = self.s.actions[d], self.mine[d], []
        writer, price, known, queue = self.writer[d], self.cost.compute_time, self.known, self.queue
        i, host = self.pos[d], self.host[d]
        while True:
            held = self.held[d]
            if held is not None:                # a blocking collective: the queue waits for its end
                end = known.get(held)
                if end is None:
                    self.waiting.setdefault(held, []).append(d)
                    break
                self.held[d] = None
                host = self.finish[d] = max(host, end)
                i += 1
            if i >= len(acts):
                break
            a = acts[i]
            op, mb = a.op, a.mb
            key = (op, a.payload, a.unit, d == a.root, a.zclass, a.side)
            plan = mine.get(key)
            if plan is None:
                p = self.sem.cached_plan(a, d)
                plan = mine[key] = (_flat(p.reads), _flat(p.writes))
            reads, writes = plan
            if op is _RECV:
                k = self.recvs[d].get(a.peer, 0)
                self.recvs[d][a.peer] = k + 1
                token: tuple = ("t", a.peer, d, k)
                for kind, u, slots in writes:
                    for m in mb if slots is None else slots:
                        writer[(kind, u, m)] = token
            elif op is _SEND:
                ready = self._ready(d, reads, mb, host) if reads else host
                if ready is None:
                    break
                k = self.sends[d].get(a.peer, 0)
                self.sends[d][a.peer] = k + 1
                link = (d, a.peer)
                occupancy, latency = self._transfer(d, a)
                start = max(ready, self.link_free.get(link, 0.0))
                self.link_free[link] = start + occupancy
                token = ("t", d, a.peer, k)
                known[token] = start + occupancy + latency
                timed.append(token)
            elif op in COLLECTIVE_OPS:
                ready = self._ready(d, reads, mb, host) if reads else host
                if ready is None:
                    break
                g = tuple(sorted(a.group))
                k = self.posted[d].get(g, 0)
                self.posted[d][g] = k + 1
                token = ("c", g, k)
                got = self.gathering.setdefault(token, [0, 0.0])
                got[0] += 1
                got[1] = max(got[1], ready)
                if got[0] == len(g):            # its last member: the collective is timed
                    known[token] = self.group_end[g] = max(got[1], self.group_end.get(g, 0.0)) + \
                        self._collective(a)
                    del self.gathering[token]
                    timed.append(token)
                for kind, u, slots in writes:
                    for m in mb if slots is None else slots:
                        writer[(kind, u, m)] = token
                if queue[op] is Queue.COMPUTE:
                    self.held[d] = token
                    continue
            elif queue[op] is Queue.COMPUTE:
                start = host
                if reads and op in UNIT_COMPUTE_OPS:
                    start = self._ready(d, reads, mb, host)
                    if start is None:
                        break
                if op in TIMED_OPS:   # as the engine prices it (Builder.run)
                    host = start + (price(a, d) if a.sub is None and len(mb) < 2 else action_time(price, a, d))
                else:
                    host = start
                if op is not _OPT:
                    self.finish[d] = host
                for kind, u, slots in writes:
                    for m in mb if slots is None else slots:
                        writer[(kind, u, m)] = host
            i += 1
        self.pos[d], self.host[d] = i, host
        return timed

    def _bytes(self, a: Any) -> float:
        """Bytes of message or collective ``a`` (CommState.message_bytes), once per kind."""
        key = (a.payload, a.unit, len(a.mb) or 1, a.zclass)
        got = self.nbytes.get(key)
        if got is None:
            got = self.nbytes[key] = message_bytes(self.cost, self.s.placement, a)
        return got

    def _transfer(self, d: int, a: Any) -> tuple[float, float]:
        """(occupancy, latency) of SEND ``a`` of rank d, once per link and kind."""
        key = (d, a.peer, a.payload, a.unit, len(a.mb) or 1, a.zclass)
        got = self.transfers.get(key)
        if got is None:
            got = self.transfers[key] = self.links.transfer(d, a.peer, self._bytes(a)) \
                if self.links is not None else (0.0, 0.0)
        return got

    def _collective(self, a: Any) -> float:
        """Seconds of collective ``a`` (Links.collective), once per op, group and kind."""
        key = (a.op, a.group, a.payload, a.unit, len(a.mb) or 1, a.zclass)
        got = self.collectives.get(key)
        if got is None:
            got = self.collectives[key] = self.links.collective(a.op.value.lower(), a.group, self._bytes(a)) \
                if self.links is not None else 0.0
        return got


def _flat(effects: tuple) -> tuple[tuple[int, int, tuple | None], ...]:
    """(kind as an int, unit, slots) of each Effect: a value is (kind, unit, micro-batch or slot)
    (``Effect.keys`` with an int kind, hashed without a Python-level call)."""
    return tuple((int(e.kind), e.unit, e.slots) for e in effects)


def placement_busy(placement: Any, cost: Any, ranks: int) -> list[float]:
    """Per rank, the seconds of the F and the full backward B of every (unit, micro-batch) a table
    placement puts on it: a bound on when its last non-OPT compute ends (computes run one at a
    time from 0) for a schedule that runs each pair once forward and once as one B where it is
    placed (HelixPipe), whatever the order."""
    busy = [0.0] * ranks
    for u, row in enumerate(placement.ranks):
        work = cost.unit_time(u, "F") + cost.unit_time(u, "B")
        for r in row:
            busy[r] += work
    return busy
