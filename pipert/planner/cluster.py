"""The cluster ``pipert plan --auto`` plans for: GPUs per node, nodes, datacenters, one device
preset with its memory, and the alpha-beta link of each level (inside a node, between nodes of a
datacenter, between datacenters).

Process ranks follow ``pipert train``'s layout (``pipert.schedules.data_parallel``): rank
``d * P + p`` is stage ``p`` of replica ``d``; with tensor parallelism every rank is ``T``
consecutive devices of one node (TP innermost). Ranks fill nodes in order and nodes fill
datacenters in order, so a pipeline replica holds consecutive devices.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from ..cost.devices import DEVICE_PRESETS, DeviceSpec
from ..cost.topology import Links, LinkSpec, Topology, default_link_specs

__all__ = ["Cluster", "parse_size", "SIZE_UNITS"]

_SIZES = {"b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
          "kib": 2 ** 10, "mib": 2 ** 20, "gib": 2 ** 30, "tib": 2 ** 40}
SIZE_UNITS = "B, KB, MB, GB, TB, KiB, MiB, GiB, TiB"
_NUMBER = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([A-Za-z]*)\s*$")


def parse_size(text: str, flag: str) -> float:
    """Bytes of ``text`` ("80GiB", "40 GB"); > 0. Text without a unit is refused."""
    m = _NUMBER.match(str(text))
    if m is None:
        raise ValueError(f"{flag} {text!r} is not a number with a unit; allowed units: {SIZE_UNITS}")
    value, unit = float(m.group(1)), m.group(2).lower()
    if not unit:
        raise ValueError(f"{flag} {text!r} has no unit; give one, e.g. {text.strip()}GiB (allowed units: "
                         f"{SIZE_UNITS})")
    if unit not in _SIZES:
        raise ValueError(f"{flag} {text!r}: unknown size unit {m.group(2)!r}; allowed: {SIZE_UNITS}")
    if not 0 < value < math.inf:
        raise ValueError(f"{flag} {text!r} must be > 0")
    return value * _SIZES[unit]


@dataclass(frozen=True)
class Cluster:
    """Devices and links of the machine a plan is for."""

    gpus_per_node: int
    """Devices per node; a tensor-parallel group lies inside one node."""
    nodes: int
    """Nodes in all (every datacenter holds nodes / dcs of them)."""
    dcs: int = 1
    """Datacenters."""
    device: DeviceSpec = field(default_factory=lambda: DEVICE_PRESETS["h100"])
    """Every device (its ``memory`` is the per-device budget)."""
    links: dict = field(default_factory=default_link_specs)
    """LinkSpec per class: intra_node, inter_node, inter_dc (seconds, bytes per second)."""

    def __post_init__(self) -> None:
        for name in ("gpus_per_node", "nodes", "dcs"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be an integer >= 1, got {v!r}")
        if self.nodes % self.dcs:
            allowed = ", ".join(str(d) for d in range(1, self.nodes + 1) if self.nodes % d == 0)
            raise ValueError(f"--dcs {self.dcs}: the {self.nodes} nodes do not split into {self.dcs} equal "
                             f"datacenters; allowed --dcs: {allowed}")

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * self.nodes

    def rank_topology(self, tp: int) -> Topology:
        """Ranks of ``tp`` devices each over the whole cluster (``tp`` divides ``gpus_per_node``)."""
        return Topology(self.gpus // tp, self.gpus_per_node // tp, self.dcs)

    def rank_links(self, tp: int) -> Links:
        """The links between ranks of ``tp`` devices (for data-parallel collectives)."""
        return Links(self.rank_topology(tp), dict(self.links))

    def describe(self) -> str:
        from ..linkflags import format_bandwidth, format_duration
        parts = [f"{self.nodes} node(s) x {self.gpus_per_node} {self.device.name} "
                 f"({self.device.memory / 2 ** 30:g} GiB)"]
        if self.dcs > 1:
            parts.append(f"{self.dcs} DCs")
        for cls, label in (("intra_node", "in node"), ("inter_node", "between nodes"), ("inter_dc", "between DCs")):
            if cls == "inter_node" and self.nodes == 1 or cls == "inter_dc" and self.dcs == 1:
                continue
            s = self.links.get(cls, LinkSpec())
            parts.append(f"{label} {format_duration(s.latency)}, {format_bandwidth(s.bandwidth)}")
        return "; ".join(parts)
