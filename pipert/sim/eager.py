"""Transfers as the executor's emulated links run them: no rendezvous.

The engine's rule (docs/semantics.md, "rendezvous") starts a transfer when its SEND and its RECV
are both posted. The executor's emulated links (``pipert.comm.links``: the timer path and the
stream path alike) start a message on its link when the SEND is posted, its value is ready and
the link is free; the reader waits only for what is left, so a RECV posted after the message
arrived does not delay it. :func:`eager_graph` is the engine's DAG without the RECV's posting
edges. The reader keeps its edge from the transfer and its place in its rank's compute queue,
after the RECV, so it still starts no earlier than the RECV's post. A prediction of a run on
emulated links (``pipert.tools.fidelity``) times this graph; the simulator, the validator and the
planner keep the engine's rule.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..ir.ops import Op
from .graph import Graph

__all__ = ["eager_graph", "eager_analysis"]


def eager_graph(g: Graph) -> Graph:
    """``g`` without the edges that hold a transfer until its RECV is posted: the edge from the
    receiver's compute-queue node before the RECV (a node also on the sender's queue keeps it)."""
    queues_of: dict[int, set[int]] = {}
    for r, nodes in enumerate(g.compute_nodes):
        for n in nodes:
            queues_of.setdefault(n, set()).add(r)
    receiver: dict[int, tuple[int, int]] = {}
    for r, acts in enumerate(g.schedule.actions):
        for a, n in zip(acts, g.node_of[r]):
            if a.op is Op.RECV and n >= 0:
                receiver[n] = (r, a.peer)
    succ: list[list[int]] = []
    indeg = [0] * len(g.kind)
    for p, out in enumerate(g.succ):
        mine = queues_of.get(p, ())
        kept = [x for x in out if x & 1 or (x >> 1) not in receiver or
                receiver[x >> 1][0] not in mine or receiver[x >> 1][1] in mine]
        for x in kept:
            indeg[x >> 1] += 1
        succ.append(kept)
    return replace(g, succ=succ, indeg=indeg)


def eager_analysis(program: Any, cost: Any, links: Any = None) -> Graph:
    """:func:`eager_graph` of the engine's DAG of ``program`` under its own rules; raises the first
    error of a program the engine rejects."""
    from ..ir.program import rules_of
    from .engine import analyze
    an = analyze(program, cost, links, transport=rules_of(program))
    if an.errors:
        raise an.errors[0]
    return eager_graph(an.graph)
