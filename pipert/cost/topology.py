"""Topology (ranks -> nodes -> datacenters) and the alpha-beta link model built on it.

A message of ``b`` bytes on a directed link with spec ``(latency, bandwidth, per_message)``
occupies the link for ``per_message + b / bandwidth`` and arrives ``latency`` after the
occupancy ends (docs/semantics.md, "The three queues and time"). ``bandwidth = inf`` makes
the size free; ``per_message`` is a fixed occupancy paid by every message (uniform CLI mode).

Collectives use the ring algorithm over the group in the order given. One ring step moves
a chunk over every ring link at once, so a step takes the time of the slowest ring link:
``step(c) = max over ring links of (latency + per_message + c / bandwidth)``. With ``n``
distinct members and ``b`` bytes (the full buffer on one member):

- ``allreduce``:                   ``2(n-1) * step(b/n)``  = 2(n-1)/n * b/bw + 2(n-1) * lat
- ``allgather``, ``reducescatter``: ``(n-1) * step(b/n)``  =  (n-1)/n * b/bw +  (n-1) * lat
- ``broadcast``, ``reduce``:       pipelined chain, ``(n-1) * max(lat + per_message) + max(b/bw)``
- a group of one member costs 0.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

from .base import LINK_CLASSES, LinkClass

__all__ = ["Topology", "LinkSpec", "Links", "default_link_specs", "LINK_CLASSES", "collective_time", "ring_links"]


@dataclass(frozen=True)
class Topology:
    """Ranks in consecutive blocks per node, nodes in consecutive blocks per datacenter."""

    num_ranks: int
    """Number of ranks (pipeline devices)."""
    ranks_per_node: int | None = None
    """Ranks per node; ``None`` puts all ranks of a datacenter on one node."""
    num_dcs: int = 1
    """Number of datacenters; ranks split into ``num_dcs`` equal consecutive blocks."""

    def __post_init__(self) -> None:
        if self.num_ranks < 1:
            raise ValueError(f"topology needs at least one rank, got num_ranks={self.num_ranks}")
        if self.num_dcs < 1:
            raise ValueError(f"num_dcs must be >= 1, got {self.num_dcs}")
        if self.num_ranks % self.num_dcs:
            raise ValueError(f"{self.num_ranks} ranks cannot be split evenly into {self.num_dcs} datacenters "
                             f"(num_ranks % num_dcs must be 0)")
        per_dc = self.num_ranks // self.num_dcs
        rpn = self.ranks_per_node
        if rpn is not None and (rpn < 1 or per_dc % rpn):
            raise ValueError(f"ranks_per_node={rpn} must be >= 1 and divide the {per_dc} ranks of each "
                             f"datacenter, so that no node spans two datacenters")

    @property
    def ranks_per_dc(self) -> int:
        return self.num_ranks // self.num_dcs

    def node_of(self, rank: int) -> int:
        self._check(rank)
        return rank // (self.ranks_per_node or self.ranks_per_dc)

    def dc_of(self, rank: int) -> int:
        self._check(rank)
        return rank // self.ranks_per_dc

    def link_class(self, src: int, dst: int) -> LinkClass:
        """One of "local", "intra_node", "inter_node", "inter_dc"."""
        if src == dst:
            self._check(src)
            return "local"
        if self.node_of(src) == self.node_of(dst):
            return "intra_node"
        if self.dc_of(src) == self.dc_of(dst):
            return "inter_node"
        return "inter_dc"

    def _check(self, rank: int) -> None:
        if not 0 <= rank < self.num_ranks:
            raise ValueError(f"rank {rank} out of range for a topology of {self.num_ranks} ranks")


@dataclass(frozen=True)
class LinkSpec:
    """Cost of one directed link: occupancy ``per_message + bytes / bandwidth``, then ``latency``."""

    latency: float = 0.0
    """Time from the end of a message's occupancy to its arrival."""
    bandwidth: float = math.inf
    """Bytes per time unit; ``inf`` makes message size free."""
    per_message: float = 0.0
    """Fixed occupancy every message pays, whatever its size."""

    def __post_init__(self) -> None:
        if self.latency < 0 or self.per_message < 0:
            raise ValueError(f"link latency and per-message time must be >= 0, got {self}")
        if not self.bandwidth > 0:
            raise ValueError(f"link bandwidth must be > 0 (inf allowed), got {self.bandwidth}")

    def occupancy(self, nbytes: float) -> float:
        return self.per_message + (nbytes / self.bandwidth if self.bandwidth != math.inf else 0.0)


def default_link_specs() -> dict[LinkClass, LinkSpec]:
    """Typical hardware, in seconds and bytes: NVLink-class inside a node, 200 Gb/s
    InfiniBand between nodes, a ~10 Gb/s, 1 ms path between datacenters."""
    return {
        "local": LinkSpec(0.0, math.inf),
        "intra_node": LinkSpec(5e-6, 200e9),
        "inter_node": LinkSpec(10e-6, 25e9),
        "inter_dc": LinkSpec(1e-3, 1.25e9),
    }


@dataclass
class Links:
    """LinkModel over a Topology: a spec per link class, overridable per directed pair."""

    topology: Topology
    """Where each rank sits; decides the class of every link."""
    specs: dict[LinkClass, LinkSpec] = field(default_factory=default_link_specs)
    """Spec per link class; a class missing here is free."""
    overrides: dict[tuple[int, int], LinkSpec] = field(default_factory=dict)
    """Spec per directed pair (src, dst), taking precedence over the class spec."""

    def __post_init__(self) -> None:
        bad = sorted(set(self.specs) - set(LINK_CLASSES))
        if bad:
            raise ValueError(f"unknown link class(es) {bad}; allowed: {', '.join(LINK_CLASSES)}")
        self._free = LinkSpec()
        self._cache: dict[tuple[int, int], LinkSpec] = {}

    def spec(self, src: int, dst: int) -> LinkSpec:
        key = (src, dst)
        s = self._cache.get(key)
        if s is None:
            s = self.overrides.get(key) or self.specs.get(self.topology.link_class(src, dst), self._free)
            self._cache[key] = s
        return s

    def transfer(self, src: int, dst: int, nbytes: float) -> tuple[float, float]:
        """(occupancy, latency) of one message of ``nbytes`` from ``src`` to ``dst``."""
        s = self.spec(src, dst)
        return s.occupancy(nbytes), s.latency

    def collective(self, op: str, group: tuple[int, ...], nbytes: float) -> float:
        """Ring-algorithm time of collective ``op`` over ``group`` (:func:`collective_time`)."""
        return collective_time(op, group, nbytes, self.spec)

    @staticmethod
    def preset(topology: Topology) -> "Links":
        """Links with ``default_link_specs()``."""
        return Links(topology, default_link_specs())

    @staticmethod
    def free(topology: Topology) -> "Links":
        """Every message costs nothing."""
        return Links(topology, {})

    @staticmethod
    def uniform_dc(topology: Topology, dc_latency: float, dc_transfer: float) -> "Links":
        """Uniform CLI mode: a message crossing a datacenter boundary occupies its link for
        ``dc_transfer`` (per message, whatever its size) and arrives ``dc_latency`` later;
        every other message is free."""
        if dc_latency < 0:
            raise ValueError(f"--dc-latency must be >= 0, got {dc_latency}")
        if dc_transfer < 0:
            raise ValueError(f"--dc-transfer must be >= 0, got {dc_transfer}")
        return Links(topology, {"inter_dc": LinkSpec(dc_latency, math.inf, dc_transfer)})


def ring_links(group: Sequence[int]) -> list[tuple[int, int]]:
    """The directed links of the ring over ``group`` in the order given (members once each,
    first occurrence kept); none for a group of one member."""
    ring = list(dict.fromkeys(group))
    n = len(ring)
    return [] if n <= 1 else [(ring[j], ring[(j + 1) % n]) for j in range(n)]


def collective_time(op: str, group: Sequence[int], nbytes: float, spec: Callable[[int, int], LinkSpec]) -> float:
    """Time of collective ``op`` over ``group`` moving ``nbytes`` (the full buffer on one member)
    on the links ``spec(src, dst)`` gives, by the ring algorithm (formulas in the module doc).
    The one price of a collective: the simulator (:meth:`Links.collective`) and the link
    emulator (``pipert.comm.collectivelinks``) both call this."""
    links = ring_links(group)
    n = len(links)
    if n == 0:
        return 0.0
    specs = [spec(s, d) for s, d in links]
    op = op.lower()

    def step(chunk: float) -> float:
        return max(s.latency + s.occupancy(chunk) for s in specs)

    if op == "allreduce":
        return 2 * (n - 1) * step(nbytes / n)
    if op in ("allgather", "reducescatter"):
        return (n - 1) * step(nbytes / n)
    if op in ("broadcast", "reduce"):
        chain = specs[:-1]  # the pipelined chain does not close the ring
        return (n - 1) * max(s.latency + s.per_message for s in chain) + \
            max(s.occupancy(nbytes) - s.per_message for s in chain)
    raise ValueError(f"unknown collective {op!r}; allowed: allreduce, allgather, reducescatter, "
                     f"broadcast, reduce")
