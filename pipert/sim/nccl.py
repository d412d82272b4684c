"""NCCL's rules on the action graph (``validate``/``simulate`` with ``transport="nccl"``).

The rules themselves are :mod:`pipert.comm.nccl`'s. On the graph: the operations of one
communicator on one rank run in posting order, each after the previous one completed (an edge
from each to the next; with pipert's communicators, one per direction of a pair and one per
collective group, these coincide with the link and group order every transport keeps); and,
without warm-up, a start-up that blocks some host forever is a deadlock.
"""
from __future__ import annotations

from ..ir.action import COLLECTIVE_OPS, P2P_OPS
from .errors import ScheduleError
from .graph import Graph

__all__ = ["apply_nccl_rules", "TRANSPORTS"]

TRANSPORTS = ("gloo", "nccl")
"""The rules a program is checked under: gloo (and the local transport), or NCCL's."""


def apply_nccl_rules(g: Graph, warmup: bool) -> list[ScheduleError]:
    """Add each communicator's stream order to ``g``; the start-up deadlock, if any and
    ``warmup`` is off (communicators created at first use)."""
    # here, not at the top: analyze() imports this module for TRANSPORTS under every transport
    from ..comm.nccl import comm_of, describe_hang, startup_hang
    comm_ops = P2P_OPS | COLLECTIVE_OPS
    succ, indeg = g.succ, g.indeg
    for r, acts in enumerate(g.schedule.actions):
        last: dict = {}   # communicator (pipert.comm.nccl.Comm) -> its last node
        nodes = g.node_of[r]
        for i, a in enumerate(acts):
            if a.op not in comm_ops or nodes[i] < 0:
                continue
            c = comm_of(a, r)
            if c is None:
                continue
            n, p = nodes[i], last.get(c)
            if p is not None and p != n:
                succ[p].append(n << 1)
                indeg[n] += 1
            last[c] = n
    if warmup:
        return []
    blocked = startup_hang(g.schedule)
    if not blocked:
        return []
    r, (i, _) = min(blocked.items())
    return [ScheduleError(r, i, g.schedule.actions[r][i], "deadlock",
                          "start-up deadlock under NCCL (each communicator created at its first use, blocking the "
                          "host until its members arrive): " + describe_hang(g.schedule, blocked))]
