"""Program: what every rank runs, as ``pipert.compile`` made it.

A Program is a lowered schedule frozen after validation: per-rank action tuples, placement, a
read-only meta, the options it was compiled with, the communication rules it was validated under
("gloo" or "nccl", ``pipert.comm.nccl``), the passes that made it (in order) and two digests:

- ``digest``: of what it holds now (shape, placement, every action, the meta the executor reads,
  the rules); every rank of a job compares it (``pipert.binding.check_same_program``);
- ``validated``: the digest of the schedule ``validate()`` accepted (None: compiled with
  ``check=False``, a test hook).

Invariant: ``validated == digest`` for every Program ``compile`` returns with checking on; the
executor refuses one where they differ (``verify``), so what runs is what was validated.
A Program reads like a Schedule (``ScheduleQueries``); ``to_schedule()`` gives a mutable copy to
transform, which must be compiled again to run.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Iterator, Mapping

from .action import Action
from .schedule import Placement, Schedule, ScheduleQueries

__all__ = ["Program", "CompileOptions", "ProgramError", "schedule_digest", "rules_of", "RULES", "DIGEST_META"]

RULES = ("gloo", "nccl")
"""Communication rules a program is validated under: gloo's (also the local hub's) or NCCL's."""

DIGEST_META = ("update_every", "loss_in_backward")
"""Meta entries the executor reads, and so part of a program's digest (generator statistics such as
solve times are not)."""


def rules_of(schedule: ScheduleQueries, transport: str | None = None) -> str:
    """The rules to check or time ``schedule`` under: ``transport`` if given, else a Program's own
    rules, else gloo's (a Schedule being planned)."""
    return transport or getattr(schedule, "rules", "gloo")


class ProgramError(ValueError):
    """A Program that may not run: not validated, or changed since it was."""


def schedule_digest(schedule: ScheduleQueries, rules: str) -> str:
    """The digest of what ``schedule`` makes every rank run under ``rules`` (module doc)."""
    d = schedule.to_dict()
    d = {k: d[k] for k in ("num_ranks", "num_units", "num_microbatches", "placement", "actions")}
    d["meta"] = {k: schedule.meta.get(k) for k in DIGEST_META}
    d["rules"] = rules
    import hashlib   # here: importing its OpenSSL binding is a cost to commands that digest nothing (simulate)
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()


class _ReadOnlyMeta(Mapping[str, Any]):
    """A program's meta: readable like a dict, never changed (it is part of the digest)."""

    def __init__(self, items: Mapping[str, Any]) -> None:
        self._d = dict(items)

    def __getitem__(self, key: str) -> Any:
        return self._d[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)

    def __repr__(self) -> str:
        return repr(self._d)


@dataclass(frozen=True)
class CompileOptions:
    """The options a Program was compiled with (``pipert.compile``'s keyword arguments)."""

    stages: int | None = None
    """P of a named schedule (None: the caller's default, e.g. one stage per unit)."""
    microbatches: int | None = None
    """Micro-batches of the whole step, over every data-parallel replica."""
    chunks: int | None = None
    """V of a named schedule (None: the family's default)."""
    schedule_options: tuple[tuple[str, Any], ...] = ()
    """Extra generator options of a named schedule, as sorted (name, value) pairs."""
    passes: tuple[str, ...] = ()
    """Schedule passes by name (``pipert.ir.passes.PASSES``), applied in order before replication."""
    dp: int = 1
    """Data-parallel replicas."""
    zero: Any = 0
    """ZeRO stage(s) as given (resolved per unit and parameter in the program's placement)."""
    zero3_buffers: int = 1
    """Gathered copies of ZeRO-3 weights: 1, or 2 (forward and backward apart)."""
    replication: str = "auto"
    """Replication policy (``pipert.schedules.data_parallel.POLICIES``; auto: the family's)."""
    rules: str = "gloo"
    """Communication rules the program is validated under (:data:`RULES`)."""
    check: bool = True
    """Whether the program was validated (False only through the instrumentation hook)."""


@dataclass(frozen=True, eq=False)
class Program(ScheduleQueries):
    """A compiled, validated, immutable program (module doc). Built by ``pipert.compile``."""

    name: str
    num_ranks: int
    num_units: int
    num_microbatches: int
    placement: Placement
    actions: tuple[tuple[Action, ...], ...]
    meta: Mapping[str, Any]
    options: CompileOptions = field(default_factory=CompileOptions)
    """The options it was compiled with."""
    rules: str = "gloo"
    """The communication rules it was validated under (and runs under: "nccl" on gloo or the local
    hub means NCCL's rules emulated by ``pipert.comm.ncclsim``)."""
    passes: tuple[str, ...] = ()
    """What made it, in order: the build, each pass, replication, the executor's lowering."""
    validated: str | None = None
    """Digest of the schedule the validator accepted (None: not validated)."""

    def __post_init__(self) -> None:
        if self.rules not in RULES:
            raise ProgramError(f"rules {self.rules!r} unknown; allowed: {', '.join(RULES)}")
        object.__setattr__(self, "actions", tuple(tuple(a) for a in self.actions))
        object.__setattr__(self, "meta", _ReadOnlyMeta(self.meta))
        if len(self.actions) != self.num_ranks or len(self.placement.weight_owner) != self.num_units:
            raise ProgramError(f"program {self.name!r}: {len(self.actions)} action lists for {self.num_ranks} ranks, "
                               f"{len(self.placement.weight_owner)} weight owners for {self.num_units} units")

    @staticmethod
    def of(schedule: Schedule, *, options: CompileOptions, rules: str, passes: tuple[str, ...],
           validated: str | None) -> "Program":
        """The Program holding ``schedule``'s actions (copied into tuples)."""
        return Program(schedule.name, schedule.num_ranks, schedule.num_units, schedule.num_microbatches,
                       schedule.placement, schedule.actions, schedule.meta, options, rules, passes, validated)

    @cached_property
    def digest(self) -> str:
        """The digest of what this program makes every rank run (module doc)."""
        return schedule_digest(self, self.rules)

    def verify(self, unchecked: bool = False) -> None:
        """Raise ProgramError unless this program is what the validator accepted (``unchecked``:
        also accept one compiled without validation, a test hook)."""
        if self.validated is None:
            if unchecked:
                return
            raise ProgramError(f"program {self.name!r} was not validated; compile it with pipert.compile "
                               f"(checking on)")
        if self.validated != self.digest:
            raise ProgramError(f"program {self.name!r} differs from what the validator accepted (digest "
                               f"{self.digest[:12]}, validated {self.validated[:12]}); compile it again")

    def to_schedule(self) -> Schedule:
        """A mutable copy as a Schedule (to transform, print or save; compile it again to run)."""
        return self.with_actions(self.actions)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.pop("digest", None)   # recomputed from the content after unpickling
        state["meta"] = dict(self.meta)
        return state

    def __setstate__(self, state: dict) -> None:
        state["meta"] = _ReadOnlyMeta(state["meta"])
        self.__dict__.update(state)
