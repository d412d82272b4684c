"""A lower bound on when each rank's last compute ends, read off a built schedule without
simulating it (the planner skips a layout it proves slower than the top ones found).

The engine (``pipert.sim``, module doc of ``pipert.sim.comm``; the queues of
``pipert.ir.semantics.table.Queue``):

- the k-th message of a directed link starts after the (k-1)-th frees the link, each occupying it
  ``bytes / bandwidth``, and arrives one latency after it leaves; all start at time >= 0, so the
  k-th arrives no earlier than the sum of the first k occupancies plus its latency;
- the k-th collective of a group starts after the (k-1)-th ends and takes the link model's
  collective time, so it ends no earlier than the sum of the first k;
- a rank's compute queue runs its actions in list order, one at a time, each for the cost
  model's duration (``action_time``), and a unit compute (F, B, D, W, RECOMPUTE) waits for every
  value it reads
  (``pipert.ir.semantics``: what each op reads and writes) whose last writer on its rank, in list
  order, is a RECV or a collective (other compute-queue actions are taken to wait for none).

So each compute ends no earlier than ``max(end of the one before, arrival of what it reads) +
its duration``; rank d's bound is that of its last non-OPT compute-queue action. Messages of a
ZeRO class count 0 bytes, and collectives on the compute queue (a blocking transport) are left
out of the chain (a smaller sum is still a bound).
"""
from __future__ import annotations

from typing import Any

from ..ir.action import Op
from ..ir.semantics import COLLECTIVE_OPS, TIMED_OPS, UNIT_COMPUTE_OPS, Semantics, action_time
from ..ir.semantics.table import Queue

__all__ = ["finish_bounds", "placement_busy"]


def finish_bounds(schedule: Any, cost: Any, links: Any) -> list[float]:
    """Per rank, a time its last non-OPT compute cannot end before (module doc)."""
    sem = Semantics.of(schedule)
    arrive = _message_arrivals(schedule, cost, links)
    ends = _collective_ends(schedule, cost, links)
    compute = {op for op in Op if sem.queue(op) is Queue.COMPUTE and op not in COLLECTIVE_OPS}
    price = cost.compute_time
    out = []
    for d, acts in enumerate(schedule.actions):
        received: dict[int, int] = {}     # peer -> RECVs from it so far
        posted: dict[tuple, int] = {}     # group -> its collectives so far
        writer: dict[Any, float] = {}     # value -> when it is here, if it came from elsewhere
        plans: dict[tuple, tuple] = {}    # what the semantics' plan depends on -> (reads, writes)
        end = finish = 0.0
        for a in acts:
            key = (a.op, a.payload, a.unit, d == a.root, a.zclass, a.side)
            plan = plans.get(key)
            if plan is None:
                p = sem.plan(a, d)
                plan = plans[key] = (p.reads, p.writes)
            reads, writes = plan
            if a.op is Op.RECV:
                k = received.get(a.peer, 0)
                received[a.peer] = k + 1
                got = arrive.get((a.peer, d), ())
                _written(writer, writes, a.mb, got[k] if k < len(got) else 0.0)
            elif a.op in COLLECTIVE_OPS:
                g = tuple(sorted(a.group))
                k = posted.get(g, 0)
                posted[g] = k + 1
                got = ends.get(g, ())
                _written(writer, writes, a.mb, got[k] if k < len(got) else 0.0)
            elif a.op in compute:
                ready = end
                for e in reads if a.op in UNIT_COMPUTE_OPS else ():
                    for v in e.keys(a.mb):
                        t = writer.get(v, 0.0)
                        if t > ready:
                            ready = t
                end = ready + (action_time(price, a, d) if a.op in TIMED_OPS else 0.0)
                if a.op is not Op.OPT:
                    finish = end
                _written(writer, writes, a.mb, 0.0)
            else:
                _written(writer, writes, a.mb, 0.0)
        out.append(finish)
    return out


def _written(writer: dict, writes: tuple, mb: tuple, when: float) -> None:
    """Record the values ``writes`` puts on the rank as there from ``when`` (0: made here, the
    compute chain already orders them)."""
    for e in writes:
        for v in e.keys(mb):
            writer[v] = when


def _message_arrivals(schedule: Any, cost: Any, links: Any) -> dict[tuple[int, int], list[float]]:
    """(src, dst) -> per message in link order, the earliest time it can arrive."""
    busy: dict[tuple[int, int], float] = {}
    out: dict[tuple[int, int], list[float]] = {}
    sizes: dict[tuple, float] = {}
    for s, acts in enumerate(schedule.actions):
        for a in acts:
            if a.op is Op.SEND:
                what = (a.payload, a.unit, len(a.mb) or 1)
                nbytes = sizes.get(what)
                if nbytes is None:
                    nbytes = sizes[what] = cost.message_bytes(*what)
                occupancy, latency = links.transfer(s, a.peer, nbytes if a.zclass is None else 0.0)
                link = (s, a.peer)
                busy[link] = busy.get(link, 0.0) + occupancy
                out.setdefault(link, []).append(busy[link] + latency)
    return out


def _collective_ends(schedule: Any, cost: Any, links: Any) -> dict[tuple, list[float]]:
    """Group -> per collective in the group's order, the earliest time it can end (read off the
    group's lowest rank, which posts every one of them)."""
    out: dict[tuple, list[float]] = {}
    for r, acts in enumerate(schedule.actions):
        for a in acts:
            if a.op in COLLECTIVE_OPS and r == min(a.group):
                nbytes = cost.message_bytes(a.payload, a.unit, len(a.mb) or 1) if a.zclass is None else 0.0
                took = links.collective(a.op.value.lower(), a.group, nbytes) if links is not None else 0.0
                ends = out.setdefault(tuple(sorted(a.group)), [])
                ends.append((ends[-1] if ends else 0.0) + took)
    return out


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
