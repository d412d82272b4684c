"""Shared NICs: the ranks of a node reach other nodes through one network interface.

The link model (``pipert.cost.topology.Links``) gives every directed pair of ranks its own link,
so G ranks of a node sending across nodes at once each get the full inter-node bandwidth. Here
each node has one NIC per direction of bandwidth ``nic_bandwidth``: every inter-node transfer
occupies its sender's outgoing NIC and its receiver's incoming NIC, and k transfers active on a
NIC share it (processor sharing, ``pipert.sim.shared.shared_times``): each progresses at
``min(1, c / k)`` of its link's speed, c = ``nic_bandwidth`` / the inter-node link bandwidth,
and at the least rate of its two NICs. The DAG, its durations and its edges are the engine's;
with one inter-node transfer at a time per NIC (and c >= 1) the times equal the engine's.
Inter-datacenter links and collectives keep their own model.
"""
from __future__ import annotations

import math

from ..cost.topology import Links
from ..ir.ops import Op
from .graph import Graph
from .shared import shared_times
from .timing import Times

__all__ = ["nic_resources", "nic_times"]


def nic_resources(g: Graph, links: Links) -> list[tuple[int, ...]]:
    """Per node of ``g``: (outgoing NIC of the sender's node, D + incoming NIC of the receiver's
    node) for an inter-node transfer, () for every other node (D = number of nodes)."""
    topo = links.topology
    nodes = topo.node_of(topo.num_ranks - 1) + 1
    out: list[tuple[int, ...]] = [()] * len(g.kind)
    for r, acts in enumerate(g.schedule.actions):
        for i, a in enumerate(acts):
            n = g.node_of[r][i]
            if a.op is Op.SEND and n >= 0 and topo.link_class(r, a.peer) == "inter_node":
                out[n] = (topo.node_of(r), nodes + topo.node_of(a.peer))
    return out


def nic_times(g: Graph, links: Links, nic_bandwidth: float) -> Times:
    """Node times of ``g`` with every node's inter-node transfers through its shared NICs of
    ``nic_bandwidth`` bytes per time unit each way (see the module doc)."""
    if not nic_bandwidth > 0:
        raise ValueError(f"nic_bandwidth must be > 0, got {nic_bandwidth}")
    spec = links.specs.get("inter_node")
    link_bw = spec.bandwidth if spec is not None else math.inf
    resources = nic_resources(g, links)
    nodes = links.topology.node_of(links.topology.num_ranks - 1) + 1
    capacity = [nic_bandwidth / link_bw if link_bw != math.inf else math.inf] * (2 * nodes)
    return shared_times(g, resources, capacity)
