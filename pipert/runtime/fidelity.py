"""Predicted beside measured: the simulator fed with what a running job measured.

A traced step (``Pipeline(trace=True)``) records the time of every compute of every rank on its
own (``StepResult.op_times``: the unit's work, waits for received values excluded). The median
per (op, unit) over the step's micro-batches, the message sizes of the units' boundaries and
weights, and the same link model the run emulates (``pipert.cost.Links``) make a
:class:`pipert.cost.profiled.ProfiledCost`; the simulator's makespan of the program the ranks
ran is the predicted step time. Only times are measured here: memory sizes are left 0 (the
makespan does not depend on them).
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Iterable

from .profile import UnitProfile

__all__ = ["StepProfile", "local_measurements", "profile_from_measurements", "predict_step"]

_MEMORY_KINDS = ("stash", "stash_w", "kept")


@dataclass
class StepProfile:
    """What one step measured, ready for the simulator."""

    profiles: list[UnitProfile]
    """Per unit: median seconds of each op that ran, message sizes of its boundary and weights."""
    t_opt: float
    """Median seconds of one rank's optimizer step."""
    busy: float = 0.0
    """Seconds of every compute of every rank in the step, added up."""

    @property
    def max_forward(self) -> float:
        """The longest unit forward (median seconds): CrossPipe's T_F, the yardstick of link delays."""
        return max((p.times.get("F", 0.0) for p in self.profiles), default=0.0)


def local_measurements(pipe: Any) -> dict:
    """This process's share of the last step of a traced ``Pipeline``: compute times of its ranks,
    boundary bytes of every unit and weight bytes of the units it holds (plain data, to gather)."""
    times = [t for r in pipe.last_results.values() for t in r.op_times]
    U = pipe.schedule.num_units
    act = {u: b.numel() * b.dtype.itemsize for u in range(U) if (b := pipe._boundary.get((u, 0))) is not None}
    weight = {u: sum(p.numel() * p.element_size() for p in mod.parameters())
              for mods in pipe.modules.values() for u, mod in mods.items()}
    return {"times": times, "act": act, "weight": weight}


def profile_from_measurements(parts: Iterable[dict], num_units: int) -> StepProfile:
    """One :class:`StepProfile` from the :func:`local_measurements` of every process."""
    samples: dict[tuple[str, int | None], list[float]] = {}
    act: dict[int, int] = {}
    weight: dict[int, int] = {}
    for part in parts:
        for op, u, s in part["times"]:
            samples.setdefault((op, u), []).append(s)
        act.update({int(k): v for k, v in part["act"].items()})
        weight.update({int(k): v for k, v in part["weight"].items()})
    profiles = []
    for u in range(num_units):
        times = {op: statistics.median(v) for (op, unit), v in samples.items() if unit == u and op != "OPT"}
        sizes = {"act": act.get(u, 0), "grad": act.get(u, 0), "weight": weight.get(u, 0), "wgrad": weight.get(u, 0)}
        sizes.update({k: 0 for k in _MEMORY_KINDS})
        profiles.append(UnitProfile(times, sizes))
    opt = [s for (op, _), v in samples.items() if op == "OPT" for s in v]
    busy = sum(s for v in samples.values() for s in v)
    return StepProfile(profiles, statistics.median(opt) if opt else 0.0, busy)


def predict_step(program: Any, profile: StepProfile, links: Any = None) -> float:
    """The simulator's step time of ``program`` with the measured costs and ``links``
    (a ``pipert.cost.Links``; None: messages are free)."""
    from ..cost.profiled import ProfiledCost
    from ..sim import simulate
    return simulate(program, ProfiledCost(profile.profiles, profile.t_opt), links=links).makespan
