"""What a generator that plans around the links (CrossPipe's) is told of a run with real units
(``pipert train``, ``pipert emulate --real``): the links of the link flags in seconds and bytes
per second, their topology, and the units' costs measured on this machine for one micro-batch
(``pipert.tools.profile``), so it weighs the latency the run emulates against computes in the
same unit. ``simulate``, ``compare``, ``export`` and timed ``emulate`` tell it their scenario's
costs and links instead (:meth:`pipert.scenario.Scenario.options_for`), which share one unit
already: the unit of ``--tf`` with uniform costs, seconds with ``--model``.
"""
from __future__ import annotations

from typing import Any, Sequence

__all__ = ["plans_links", "link_plan"]


def plans_links(name: str) -> bool:
    """Whether the registered family ``name`` takes the links as a generator option."""
    from .schedules import family
    accepted = family(name).options()
    return accepted is not None and "links" in accepted


def link_plan(units: Sequence[Any], x: Any, y: Any, links: Any) -> dict:
    """Generator options ``cost``, ``links``, ``topology`` for ``units`` run on micro-batch
    (``x``, ``y``) under ``links`` (a :class:`pipert.cost.Links` in seconds and bytes per second).
    Each unit is timed with one intra-op thread, as every rank of a run on this host is."""
    import torch
    from .cost.profiled import ProfiledCost
    from .tools.profile import profile_units
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        profile_units(units, x, y)  # warm-up: first calls allocate
        profiles = profile_units(units, x, y, repeats=5)
    finally:
        torch.set_num_threads(threads)
    return {"cost": ProfiledCost(profiles), "links": links, "topology": getattr(links, "topology", None)}
