"""Link settings of a real run: ``--dcs 2 --dc-latency 20ms --dc-bandwidth 10Gbps``.

Durations take ``h``, ``min``, ``s``, ``ms``, ``us`` (or ``µs``) and ``ns``; bandwidths take bits
per second (``bps``, ``Kbps``, ``Mbps``, ``Gbps``, ``Tbps``) or bytes per second (``B/s``, ``KB/s``,
``MB/s``, ``GB/s``, ``TB/s``, powers of 1000; ``KiB/s``... powers of 1024); ``inf`` (or nothing) is
an unlimited link. Text without a unit is refused (the simulator's ``--dc-latency 2`` is in the
time unit of its costs, not seconds), except ``0`` and where the caller names the unit a bare
number means (``--timeout 30``: seconds). Python numbers are seconds and bytes per second, the
units of :class:`pipert.cost.LinkSpec`.

:class:`LinkOptions` turns the flags into the :class:`pipert.cost.Links` the simulator reads
and the :class:`pipert.comm.links.LinkEmulator` a run applies: ranks split into ``dcs``
equal consecutive datacenters (and nodes of ``ranks_per_node``); a message between datacenters
pays the dc link, one between nodes of a datacenter the node link, any other is free.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

__all__ = ["parse_duration", "parse_bandwidth", "format_duration", "format_bandwidth", "LinkOptions",
           "TIME_UNITS", "RATE_UNITS", "duration_arg"]

_TIME = {"h": 3600.0, "min": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
_RATE = {"bps": 1 / 8, "kbps": 1e3 / 8, "mbps": 1e6 / 8, "gbps": 1e9 / 8, "tbps": 1e12 / 8,
         "b/s": 1.0, "kb/s": 1e3, "mb/s": 1e6, "gb/s": 1e9, "tb/s": 1e12,
         "kib/s": 2.0 ** 10, "mib/s": 2.0 ** 20, "gib/s": 2.0 ** 30, "tib/s": 2.0 ** 40}
_NUMBER = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([^\s0-9].*)?$")
TIME_UNITS = "h, min, s, ms, us, ns"
RATE_UNITS = "bps, Kbps, Mbps, Gbps, Tbps, B/s, KB/s, MB/s, GB/s, TB/s, KiB/s, MiB/s, GiB/s, TiB/s"


def _split(text: str, flag: str, allowed: str) -> tuple[float, str]:
    m = _NUMBER.match(str(text))
    if m is None:
        raise ValueError(f"{flag} {text!r} is not a number with a unit; allowed units: {allowed}")
    return float(m.group(1)), (m.group(2) or "").strip()


def parse_duration(text: str | float, flag: str = "duration", bare: str | None = None) -> float:
    """Seconds of ``text`` ("20ms", "150us", "0.5s", "2min"); >= 0. A Python number is seconds;
    text without a unit means ``bare`` (a unit of :data:`TIME_UNITS`), and without ``bare`` it is
    refused unless it is 0."""
    if isinstance(text, (int, float)):
        value, unit = float(text), "s"
    else:
        value, unit = _split(text, flag, TIME_UNITS)
        if not unit and bare is None and value != 0:
            raise ValueError(f"{flag} {text!r} has no unit; give one, e.g. {text.strip()}ms or {text.strip()}s "
                             f"(allowed units: {TIME_UNITS})")
        unit = unit or bare or "s"
    if unit not in _TIME:
        raise ValueError(f"{flag} {text!r}: unknown time unit {unit!r}; allowed: {TIME_UNITS}")
    return value * _TIME[unit]


def parse_bandwidth(text: str | float, flag: str = "bandwidth") -> float:
    """Bytes per second of ``text`` ("10Gbps", "400MB/s", "inf"); > 0. A Python number is bytes
    per second; text without a unit is refused."""
    if isinstance(text, (int, float)):
        value = float(text)
    elif str(text).strip().lower() in ("", "inf"):
        return math.inf
    else:
        value, unit = _split(text, flag, RATE_UNITS)
        if not unit:
            raise ValueError(f"{flag} {text!r} has no unit; give one, e.g. {text.strip()}Gbps or "
                             f"{text.strip()}MB/s (allowed units: {RATE_UNITS}, or inf)")
        if unit.lower() not in _RATE:
            raise ValueError(f"{flag} {text!r}: unknown bandwidth unit {unit!r}; allowed: {RATE_UNITS}")
        value *= _RATE[unit.lower()]
    if not value > 0:
        raise ValueError(f"{flag} {text!r} must be > 0 (or 'inf')")
    return value


def format_duration(seconds: float) -> str:
    """``0.02`` -> ``"20 ms"``."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.4g} {unit}"
    return "0 s" if seconds == 0 else f"{seconds / 1e-9:.4g} ns"


def format_bandwidth(bytes_per_s: float) -> str:
    """``1.25e9`` -> ``"10 Gbit/s"``."""
    if bytes_per_s == math.inf:
        return "unlimited"
    bits = bytes_per_s * 8
    for unit, scale in (("Tbit/s", 1e12), ("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bits >= scale:
            return f"{bits / scale:.4g} {unit}"
    return f"{bits:.4g} bit/s"


@dataclass(frozen=True)
class LinkOptions:
    """Datacenters and nodes of a run, with the latency and bandwidth of the links between them."""

    dcs: int = 1
    """Datacenters; the ranks split into equal consecutive blocks."""
    dc_latency: float = 0.0
    """Seconds a message between datacenters takes after its occupancy."""
    dc_bandwidth: float = math.inf
    """Bytes per second of a link between datacenters."""
    ranks_per_node: int | None = None
    """Ranks per node (None: one node per datacenter)."""
    node_latency: float = 0.0
    """Seconds a message between nodes of one datacenter takes after its occupancy."""
    node_bandwidth: float = math.inf
    """Bytes per second of a link between nodes of one datacenter."""

    @classmethod
    def parse(cls, dcs: int = 1, dc_latency: str | float = 0.0, dc_bandwidth: str | float = "inf",
              ranks_per_node: int | None = None, node_latency: str | float = 0.0,
              node_bandwidth: str | float = "inf") -> "LinkOptions":
        """From flag values (strings with units, see the module doc)."""
        if isinstance(dcs, bool) or not isinstance(dcs, int) or dcs < 1:
            raise ValueError(f"--dcs must be an integer >= 1, got {dcs!r}")
        # a link flag given without the split it describes is refused, whatever its value (as in simulate)
        for name, raw, unset, needs, missing in (
                ("--dc-latency", dc_latency, 0.0, "--dcs >= 2", dcs == 1),
                ("--dc-bandwidth", dc_bandwidth, "inf", "--dcs >= 2", dcs == 1),
                ("--node-latency", node_latency, 0.0, "--ranks-per-node", ranks_per_node is None),
                ("--node-bandwidth", node_bandwidth, "inf", "--ranks-per-node", ranks_per_node is None)):
            if missing and raw not in ("", None, unset):
                between = "datacenters" if name.startswith("--dc") else "nodes of a datacenter"
                raise ValueError(f"{name} {raw} describes the link between {between}: give {needs} as well")
        out = cls(dcs, parse_duration(dc_latency or 0.0, "--dc-latency"),
                  parse_bandwidth(dc_bandwidth, "--dc-bandwidth"), ranks_per_node,
                  parse_duration(node_latency or 0.0, "--node-latency"),
                  parse_bandwidth(node_bandwidth, "--node-bandwidth"))
        return out

    @property
    def active(self) -> bool:
        """Whether any message is delayed."""
        dc = self.dcs > 1 and (self.dc_latency > 0 or self.dc_bandwidth != math.inf)
        node = self.ranks_per_node is not None and (self.node_latency > 0 or self.node_bandwidth != math.inf)
        return dc or node

    def links(self, num_ranks: int) -> Any:
        """The :class:`pipert.cost.Links` of ``num_ranks`` ranks (rejects a split that does not fit)."""
        from .cost.topology import Links, LinkSpec, Topology
        if num_ranks % self.dcs:
            raise ValueError(f"--dcs {self.dcs} does not divide the {num_ranks} ranks into equal datacenters")
        per_dc, rpn = num_ranks // self.dcs, self.ranks_per_node
        if rpn is not None and (rpn < 1 or per_dc % rpn):
            raise ValueError(f"--ranks-per-node {rpn} does not divide the {per_dc} ranks of each datacenter; "
                             f"allowed: a divisor of {per_dc}")
        topo = Topology(num_ranks, self.ranks_per_node, self.dcs)
        specs = {"inter_dc": LinkSpec(self.dc_latency, self.dc_bandwidth)}
        if self.ranks_per_node is not None:
            specs["inter_node"] = LinkSpec(self.node_latency, self.node_bandwidth)
        return Links(topo, specs)

    def emulator(self, num_ranks: int, backend: str | None = None) -> Any:
        """A :class:`pipert.comm.links.LinkEmulator` applying :meth:`links` to real messages."""
        from .comm.links import LinkEmulator
        return LinkEmulator.from_links(self.links(num_ranks), backend=backend)

    def describe(self) -> str:
        """One line in human units, e.g. ``"2 DCs: 20 ms, 10 Gbit/s between them"``."""
        parts = []
        if self.dcs > 1:
            parts.append(f"{self.dcs} DCs: {format_duration(self.dc_latency)}, "
                         f"{format_bandwidth(self.dc_bandwidth)} between them")
        if self.ranks_per_node is not None:
            parts.append(f"{self.ranks_per_node} ranks/node: {format_duration(self.node_latency)}, "
                         f"{format_bandwidth(self.node_bandwidth)} between nodes")
        return "; ".join(parts) or "no emulated links"

    def as_dict(self) -> dict:
        """JSON-ready: seconds and bytes per second (None: unlimited)."""
        bw = lambda b: None if b == math.inf else b  # noqa: E731
        return {"dcs": self.dcs, "dc_latency_s": self.dc_latency, "dc_bandwidth_Bps": bw(self.dc_bandwidth),
                "ranks_per_node": self.ranks_per_node, "node_latency_s": self.node_latency,
                "node_bandwidth_Bps": bw(self.node_bandwidth), "text": self.describe()}


def duration_arg(bare: str) -> Any:
    """An argparse ``type`` for a time flag whose bare number means ``bare`` (documented in its
    help): "30" and "30s" are both 30 seconds for ``bare="s"``."""
    import argparse

    def duration(text: str) -> float:
        try:
            return parse_duration(text, "value", bare)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return duration
