"""validate(): check a schedule against every rule of docs/semantics.md."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, overload

from ..ir.program import Program, rules_of
from ..ir.schedule import Schedule
from .engine import analyze
from .errors import ScheduleError

__all__ = ["Report", "validate", "ScheduleError"]


@dataclass
class Report:
    """What validating a schedule found (it broke no rule)."""

    name: str
    """Schedule name."""
    num_actions: int
    """Actions over all ranks."""
    num_transfers: int
    """Matched SEND/RECV pairs."""
    num_collectives: int
    """Joint collectives (each counted once for its whole group)."""
    peak_memory: list[float]
    """Per rank, peak running memory in cost-model units (docs/semantics.md, "Memory")."""
    makespan: float
    """Makespan under the cost model (and links, if given; free links otherwise)."""


@overload
def validate(schedule: Program | Schedule, cost: Any = ..., memory_limit: Any = ..., *,
             all_errors: Literal[False] = ..., links: Any = ..., transport: str | None = ...,
             warmup: bool = ...) -> Report: ...


@overload
def validate(schedule: Program | Schedule, cost: Any = ..., memory_limit: Any = ..., *,
             all_errors: Literal[True], links: Any = ..., transport: str | None = ...,
             warmup: bool = ...) -> list[ScheduleError]: ...


def validate(schedule: Program | Schedule, cost: Any = None, memory_limit: Any = None, *, all_errors: bool = False,
             links: Any = None, transport: str | None = None, warmup: bool = True) -> Report | list[ScheduleError]:
    """Check a program (``pipert.compile``'s Program: what the ranks run) or, when planning, a
    Schedule as a generator or pass left it (before replication and the executor's lowering, which
    ``compile`` adds); raise the first ScheduleError (by rank, then action index).

    ``cost`` sizes memory (default: uniform, one stash = 1); ``memory_limit`` is None, one
    number for all ranks, or one per rank. With ``all_errors=True`` return every error
    found instead (empty list: valid). Deadlock and weight-grad set checks need a complete
    graph, so they are skipped while messages or collectives are unmatched.

    ``transport``: the communication rules; default a Program's own (``Program.rules``), gloo's
    for a Schedule. ``transport="nccl"`` adds NCCL's rules (``pipert.sim.nccl``): each communicator's operations
    in posting order and, with ``warmup=False`` (communicators created at their first use, as
    NCCL does unless pipert warms them up), the start-up deadlocks that creation causes.
    """
    an = analyze(schedule, cost, links, memory_limit, rules_of(schedule, transport), warmup)
    if all_errors:
        return an.errors
    if an.errors:
        raise an.errors[0]
    g = an.graph
    return Report(schedule.name, schedule.num_actions(), g.kind.count(1),
                  len(g.collectives), list(g.peak_memory), an.times.makespan)
