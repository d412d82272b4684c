"""Pass 1 of the engine: walk every rank's list once, build the action DAG, check list rules.

Nodes: one per compute-queue action (compute, WAIT, memory ops; collectives too when
the placement's ``collective_queue`` is the compute queue), one per matched SEND/RECV pair (a transfer), one per
collective (joint over its group). Node ``n`` has a duration ``dur[n]`` (a transfer: the link
occupancy) and a latency ``lat[n]`` (transfers only). Two times leave a node: ``end0 = start +
dur`` frees its queue and its link, ``end1 = end0 + lat`` is when its data is ready. An edge
``p -> n`` is stored in ``succ[p]`` as ``n << 1 | uses_end1``.

Edges (docs/semantics.md, "The three queues and time"): the compute queue in list order; a
SEND, RECV or collective is *posted* when its rank's compute queue has finished everything
before it in the list (an edge from that compute-queue node); a transfer also waits for the
value it sends and for the previous transfer of its directed link; a collective for its
members' values and the previous collective of its group; a compute for the values other
queues produce. A value that the posting node produced needs no edge of its own: the posting
edge carries the same time (compute-queue nodes have no latency). What each op reads and writes
comes from ``pipert.ir.semantics.TABLE`` (:mod:`.values` interprets it); memory is the running
sum in list order.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..ir.action import Action
from ..ir.schedule import Schedule
from .errors import STRUCTURAL, ScheduleError
from .keys import QUEUES, describe_key, vkey
from .values import Builder

__all__ = ["Graph", "build_graph", "QUEUES", "vkey", "describe_key"]


@dataclass
class Graph:
    """The action DAG of one schedule plus everything pass 1 learned (see module doc)."""

    schedule: Schedule
    """The schedule this graph was built from."""
    kind: list[int]
    """Node kind: 0 compute-queue action, 1 transfer, 2 collective. This and dur, lat, succ, indeg
    are lists, or where pipert._simc is loaded its C-owned arrays that read and grow alike
    (:func:`pipert.native.node_arrays`)."""
    dur: list[float]
    """Duration (compute, collective) or link occupancy (transfer) per node."""
    lat: list[float]
    """Latency after the occupancy, per node (0 except transfers)."""
    succ: list[list[int]]
    """Out-edges per node, encoded ``dst << 1 | uses_end1``."""
    indeg: list[int]
    """Number of in-edges per node."""
    node_of: list[list[int]]
    """``node_of[r][i]``: node of rank r's action i (-1: the action is broken)."""
    compute_nodes: list[list[int]]
    """Per rank, its compute-queue nodes in queue order."""
    comm_in: list[tuple[int, int]]
    """(compute-queue node, transfer/collective node whose data it consumes)."""
    tx_prod: dict[int, int]
    """Transfer node -> node that produced the value it sends (a dict, or where pipert._simc is
    loaded its IntMap, which reads alike and compares equal: :func:`pipert.native.int_map`)."""
    link_bytes: dict[tuple[int, int], float]
    """Bytes sent per directed link (src, dst)."""
    collectives: list[tuple[int, Action, float]]
    """(node, first member's action, bytes) per collective."""
    busy: list[float]
    """Per rank, total compute duration."""
    peak_memory: list[float]
    """Per rank, peak of the running memory sum (cost-model units)."""
    errors: list[ScheduleError]
    """Rule violations found by pass 1, in no particular order."""
    wg_parts: dict[int, list[tuple[list[int], list[int]]]] = field(default_factory=dict)
    """Weight-grad node -> parts (local micro-batches, source nodes) whose union it carries."""
    opt_checks: list[tuple] = field(default_factory=list)
    """(node, rank, index, action, unit, local mbs, source nodes, window) per OPT of a unit."""
    queues: list[list[str]] = field(default_factory=list)
    """``queues[r][i]``: the queue name (of QUEUES) rank r's action i runs in."""
    memory_trace: list[list[float]] = field(default_factory=list)
    """``memory_trace[r][i]``: rank r's running memory right after its action i."""

    @property
    def num_nodes(self) -> int:
        return len(self.kind)

    @property
    def structural_errors(self) -> bool:
        return any(e.reason in STRUCTURAL for e in self.errors)


def build_graph(schedule: Schedule, cost: Any, links: Any = None, memory_limit: Any = None) -> Graph:
    """Pass 1: the DAG of ``schedule`` plus the list-order rules (errors in ``Graph.errors``).

    ``memory_limit``: None, one number for every rank, or one per rank.
    """
    b = Builder(schedule, cost, links, memory_limit)
    b.run()
    link_bytes = {(lk // b.P, lk % b.P): ls[4] for lk, ls in b.link_state.items()}
    return Graph(schedule, b.kind, b.dur, b.lat, b.succ, b.indeg, b.node_of, b.compute_nodes, b.comm_in,
                 b.tx_prod, link_bytes, b.collectives, b.busy, b.peaks, b.errors, b.wg_parts, b.opt_checks,
                 b.queues, b.memory_trace)
