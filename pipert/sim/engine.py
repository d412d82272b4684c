"""The one engine behind validate() and simulate(): pass 1 (graph.py) then pass 2 (timing.py)."""
from __future__ import annotations

import gc
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

from ..ir.schedule import Schedule
from .errors import ScheduleError
from .graph import Graph, build_graph
from .timing import Times, run_timing

__all__ = ["Analysis", "analyze", "default_cost", "paused_gc"]


@dataclass
class Analysis:
    """Everything the engine learned about one schedule."""

    graph: Graph
    """The action DAG and pass-1 facts."""
    times: Times | None
    """Node times; None when the graph is too broken to time (unmatched messages etc.)."""
    errors: list[ScheduleError]
    """All rule violations, sorted by (rank, action index)."""


@contextmanager
def paused_gc() -> Iterator[None]:
    """The engine allocates many small objects and frees none of them cyclically: pausing
    the cyclic garbage collector saves its repeated full scans (a fifth of the time). On resume
    what the pause allocated joins the oldest generation (``freeze`` + ``unfreeze`` move lists,
    they scan nothing), so the next young collection does not scan it all either; skipped when
    someone else keeps objects frozen."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            if not gc.get_freeze_count():
                gc.freeze()
                gc.unfreeze()
            gc.enable()


def default_cost() -> Any:
    """Uniform cost with tf=1, tb=2: what validate() sizes memory with when given no cost."""
    from ..cost.uniform import UniformCost
    return UniformCost(tf=1.0, tb=2.0)


def analyze(schedule: Schedule, cost: Any = None, links: Any = None, memory_limit: Any = None,
            transport: str = "gloo", warmup: bool = True) -> Analysis:
    """Build and time the DAG of ``schedule``; never raises for a broken schedule.

    ``transport``: the rules of "gloo" (and the local transport) or of "nccl" (pipert.sim.nccl);
    ``warmup``: under NCCL, whether every communicator is created before the program runs."""
    from .nccl import TRANSPORTS
    if transport not in TRANSPORTS:
        raise ValueError(f"transport {transport!r} unknown; allowed: {', '.join(TRANSPORTS)}")
    with paused_gc():
        g = build_graph(schedule, cost if cost is not None else default_cost(), links, memory_limit)
        errors = list(g.errors)
        times = None
        if not g.structural_errors:
            if transport == "nccl":
                from .nccl import apply_nccl_rules
                errors.extend(apply_nccl_rules(g, warmup))
            times, _, more = run_timing(g)
            errors.extend(more)
    errors.sort(key=lambda e: e.sort_key)
    return Analysis(g, times, errors)
