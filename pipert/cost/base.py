"""The interfaces every consumer of costs uses: Topology, LinkModel, CostModel.

Times are in one unit throughout a run (seconds for analytic/profiled models, the user's
unit in uniform mode); sizes are bytes (abstract units in uniform mode).
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

from ..ir.action import Action, Payload

__all__ = ["LinkClass", "Topology", "LinkModel", "CostModel", "VALUE_KINDS"]

# Link classes, slowest last.
LinkClass = str  # "local" | "intra_node" | "inter_node" | "inter_dc"
LINK_CLASSES = ("local", "intra_node", "inter_node", "inter_dc")

# Kinds of per-rank memory a CostModel sizes (see docs/semantics.md, "Memory").
VALUE_KINDS = ("stash", "stash_w", "act", "grad", "weight", "wgrad", "kept")


@runtime_checkable
class Topology(Protocol):
    """Ranks grouped into nodes, nodes into datacenters."""

    num_ranks: int

    def node_of(self, rank: int) -> int: ...

    def dc_of(self, rank: int) -> int: ...

    def link_class(self, src: int, dst: int) -> LinkClass: ...


@runtime_checkable
class LinkModel(Protocol):
    """Cost of one message on a directed link: (occupancy, latency).

    The link is busy for ``occupancy`` (FIFO per directed pair, full duplex); the message
    arrives ``latency`` after its occupancy ends.
    """

    def transfer(self, src: int, dst: int, nbytes: float) -> tuple[float, float]: ...

    def collective(self, op: str, group: tuple[int, ...], nbytes: float) -> float: ...


@runtime_checkable
class CostModel(Protocol):
    """Durations of compute actions and sizes of values and messages."""

    def compute_time(self, action: Action, rank: int) -> float:
        """Duration of one (op, unit, micro-batch) of a compute (F/B/D/W/OPT/RECOMPUTE), whole: the
        engine prices a fold as the sum over its micro-batches and a sub-block ``sI/N`` as 1/N of the
        whole (``pipert.ir.semantics.action_time``); memory and communication actions take 0."""
        ...

    def message_bytes(self, payload: Payload, unit: int, num_mbs: int = 1) -> float:
        """Bytes of a message carrying ``payload`` of ``unit`` for ``num_mbs`` micro-batches."""
        ...

    def memory(self, kind: str, unit: int) -> float:
        """Bytes that one value of ``kind`` (one of VALUE_KINDS) of ``unit`` holds, per micro-batch."""
        ...
