"""A lower bound on when each rank's last compute ends, read off a built schedule without
simulating it (the planner skips a layout it proves slower than the top ones found).

The engine (``pipert.sim``, module doc of ``pipert.sim.comm``): the k-th message of a directed
link starts after the (k-1)-th frees the link, each occupying it ``bytes / bandwidth``; all start
at time >= 0, so the k-th is on its way no earlier than the sum of the first k occupancies. A
unit compute (F, B, D, W, RECOMPUTE: not OPT) that reads a value whose last writer on its rank,
in list order, is a RECV waits for that message (``pipert.ir.semantics``: what each op reads and
writes). So rank d's last non-OPT compute ends no earlier than the largest such prefix sum over
the messages its computes read. Messages of a ZeRO class count 0 bytes (a smaller sum is still
a bound).
"""
from __future__ import annotations

from typing import Any

from ..ir.action import Op
from ..ir.semantics import UNIT_COMPUTE_OPS, Semantics

__all__ = ["finish_bounds"]


def finish_bounds(schedule: Any, cost: Any, links: Any) -> list[float]:
    """Per rank, a time its last non-OPT compute cannot end before (module doc)."""
    sem = Semantics.of(schedule)
    sent: dict[tuple[int, int], list[float]] = {}   # (src, dst) -> prefix sums of occupancies, in link order
    for s, acts in enumerate(schedule.actions):
        for a in acts:
            if a.op is Op.SEND:
                nbytes = cost.message_bytes(a.payload, a.unit, len(a.mb) or 1) if a.zclass is None else 0.0
                prefix = sent.setdefault((s, a.peer), [])
                prefix.append((prefix[-1] if prefix else 0.0) + links.transfer(s, a.peer, nbytes)[0])
    out = []
    for d, acts in enumerate(schedule.actions):
        received: dict[int, int] = {}     # peer -> RECVs from it so far
        writer: dict[Any, float] = {}     # value -> when its message is on its way (0: written here)
        best = 0.0
        for a in acts:
            if a.op is Op.RECV:
                k = received.get(a.peer, 0)
                received[a.peer] = k + 1
                prefix = sent.get((a.peer, d), ())
                on_way = prefix[k] if k < len(prefix) else 0.0
                for key in sem.writes(a, d):
                    writer[key] = on_way
                continue
            if a.op in UNIT_COMPUTE_OPS:
                for key in sem.reads(a, d):
                    best = max(best, writer.get(key, 0.0))
            for key in sem.writes(a, d):
                writer[key] = 0.0
        out.append(best)
    return out
