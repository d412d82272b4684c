"""Metrics derived from a timed graph: exposed communication, bytes per link class, events."""
from __future__ import annotations

from itertools import compress
from operator import gt, itemgetter
from typing import Any

from ..cost.base import LINK_CLASSES
from ..ir.action import Action, Op
from ..ir.semantics import ROOTED_OPS
from .graph import Graph
from .keys import K_TRANSFER
from .timing import Times

__all__ = ["exposed_comm", "comm_bytes", "events", "Event"]

Event = tuple[int, str, Action, float, float]  # (rank, queue, action, start, end)
_FIRST = itemgetter(0)


def exposed_comm(g: Graph, t: Times) -> list[float]:
    """Per rank: time its compute queue sat idle waiting for communicated data, beyond when
    that data's producer had finished. At zero link cost this is 0 unless a rendezvous or a
    queue stalled a transfer; waiting for upstream compute counts as bubble, not here.
    A transfer's data is due when its producer ends; a collective's when it starts."""
    start, end0, end1 = t.start, t.end0, t.end1
    late = [_late(nodes, start, end0) for nodes in g.compute_nodes]
    waiting = {n for rank in late for n, _, _ in rank}
    # the communicated inputs of the nodes that started after their queue was free (C-level selection)
    comm_of: dict[int, list[int]] = {}
    for n, c in compress(g.comm_in, map(waiting.__contains__, map(_FIRST, g.comm_in))):
        comm_of.setdefault(n, []).append(c)
    out = []
    for rank in late:
        total = 0.0
        for n, s, due in rank:
            for c in comm_of.get(n, ()):
                if g.kind[c] == K_TRANSFER:
                    p = g.tx_prod.get(c)
                    f = end1[p] if p is not None else 0.0
                else:
                    f = start[c]
                if f > due:
                    due = f
            if s > due:
                total += s - due
        out.append(total)
    return out


def _late(nodes: list[int], start: list[float], end0: list[float]) -> list[tuple[int, float, float]]:
    """(node, start, when the queue was free) of each of a rank's compute-queue ``nodes`` (in queue
    order) that started after the queue was free, in order; selected without a Python-level loop."""
    starts = list(map(start.__getitem__, nodes))
    frees = [0.0]
    frees += map(end0.__getitem__, nodes[:-1])
    return list(compress(zip(nodes, starts, frees), map(gt, starts, frees)))


def comm_bytes(g: Graph, topology: Any) -> dict[str, float]:
    """Bytes moved per link class. A collective counts the bytes its ring algorithm puts on
    each ring link: allreduce 2(n-1)/n·b, allgather/reducescatter (n-1)/n·b per link,
    broadcast/reduce b on each of the n-1 links of the chain."""
    out = {c: 0.0 for c in LINK_CLASSES}
    for (s, d), b in g.link_bytes.items():
        out[topology.link_class(s, d)] += b
    for _, a, b in g.collectives:
        ring = list(dict.fromkeys(a.group))
        n = len(ring)
        if n < 2:
            continue
        if a.op in ROOTED_OPS:
            links, per = [(ring[j], ring[j + 1]) for j in range(n - 1)], b
        else:
            links = [(ring[j], ring[(j + 1) % n]) for j in range(n)]
            per = (2 if a.op is Op.ALLREDUCE else 1) * (n - 1) / n * b
        for s, d in links:
            out[topology.link_class(s, d)] += per
    return out


def events(g: Graph, t: Times) -> list[Event]:
    """One (rank, queue, action, start, end) per action, in rank then list order.
    A RECV ends when its data arrives; a SEND when the link is free again."""
    out: list[Event] = []
    start, end0, end1 = t.start, t.end0, t.end1
    for r, nodes in enumerate(g.node_of):
        acts = g.schedule.actions[r]
        qs = g.queues[r]
        for i, n in enumerate(nodes):
            if n < 0:
                continue
            a = acts[i]
            end = end1[n] if a.op is Op.RECV else end0[n]
            out.append((r, qs[i], a, start[n], end))
    return out
