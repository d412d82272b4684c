"""Schedule and Placement: per-rank action lists plus where work and weights live."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from .action import Action, Op, ScheduleFormatError, parse_action
from .semantics import Queue

__all__ = ["Placement", "Schedule", "ScheduleQueries", "FORMAT_NAME", "FORMAT_VERSION"]

FORMAT_NAME = "pipert.schedule"
FORMAT_VERSION = 1
_KINDS = ("unit", "microbatch", "table")


@dataclass(frozen=True)
class Placement:
    """Where each (unit, micro-batch) computes and which ranks hold each unit's weights.

    kind "unit": ``ranks[u]`` (activation passing: 1F1B, ZB, interleaved, CrossPipe);
    kind "microbatch": ``ranks[m]`` (weight passing: WeiPipe, TawPipe);
    kind "table": ``ranks[u][m]`` (anything else, e.g. HelixPipe attention units, data-parallel
    replicas).
    ``weight_owner[u]`` is the rank that keeps unit u's master weights and optimizer state;
    ``replicas[u]`` (default ``(weight_owner[u],)``) are all ranks that hold them (data-parallel
    replicas; each steps its own optimizer); ``zero[u]`` (default 0) is the ZeRO stage of unit u
    over its replicas: 0 whole weights and gradients everywhere, 1/2 gradients reduce-scattered
    and the optimizer on shards (the whole weights are stale after OPT until an ALLGATHER),
    3 weights too are held as shards (an ALLGATHER before every use). ``zero[u]`` may instead be a
    tuple with one stage per parameter of the unit (its module's ``named_parameters()`` order), with
    ``zero_numel[u]`` the parameters' element counts: the unit's parameters then form one *ZeRO
    class* per stage present, each sharded and communicated on its own (actions name it, ``z3``);
    a tuple whose stages are all equal is stored as that one stage. ``zero3_buffers`` is 1 (forward
    and backward computes read one gathered copy of ZeRO-3 weights) or 2 (separate copies, named
    ``fwd``/``bwd`` on their ALLGATHER and FREE). ``collective_queue`` is the queue collectives run
    on: ``Queue.GROUP`` (posted where they stand, joint over their group) or ``Queue.COMPUTE`` (the
    rank's program blocks on each, like a compute); schedule files of version 1 may give it as
    ``meta["collective_queue"]``.
    """

    kind: str
    ranks: tuple
    weight_owner: tuple[int, ...]
    replicas: tuple[tuple[int, ...], ...] | None = None
    zero: tuple | None = None
    zero_numel: tuple | None = None
    zero3_buffers: int = 1
    collective_queue: Queue = Queue.GROUP

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ScheduleFormatError(f"placement kind {self.kind!r} unknown; allowed: {', '.join(_KINDS)}")
        object.__setattr__(self, "ranks", tuple(tuple(r) if isinstance(r, (list, tuple)) else r
                                                for r in self.ranks))
        object.__setattr__(self, "weight_owner", tuple(self.weight_owner))
        n = len(self.weight_owner)
        if self.replicas is not None:
            reps = tuple(tuple(g) for g in self.replicas)
            if len(reps) != n or any(o not in g for o, g in zip(self.weight_owner, reps)):
                raise ScheduleFormatError("placement replicas: one group per unit, each containing the unit's "
                                          "weight_owner")
            object.__setattr__(self, "replicas", reps)
        if self.zero is not None:
            self._set_zero(n)
        elif self.zero_numel is not None:
            raise ScheduleFormatError("placement zero_numel needs per-parameter stages in 'zero'")
        if self.zero3_buffers not in (1, 2):
            raise ScheduleFormatError(f"placement zero3_buffers must be 1 (one gathered copy of ZeRO-3 weights) "
                                      f"or 2 (forward and backward copies), got {self.zero3_buffers!r}")
        cq = self.collective_queue
        if cq not in (Queue.GROUP, Queue.COMPUTE, "group", "compute"):
            raise ScheduleFormatError(f"placement collective_queue must be 'group' or 'compute', got {cq!r}")
        object.__setattr__(self, "collective_queue", Queue(cq))

    def _set_zero(self, n: int) -> None:
        zero, numel = list(self.zero), list(self.zero_numel or [None] * n)
        if len(zero) != n or len(numel) != n:
            raise ScheduleFormatError(f"placement zero: one entry per unit ({n}), each a ZeRO stage 0..3 or a list "
                                      f"of stages per parameter; got {zero!r}")
        for u, z in enumerate(zero):
            if isinstance(z, (list, tuple)):
                z = tuple(int(x) for x in z)
                sizes = numel[u]
                if any(x not in (0, 1, 2, 3) for x in z) or not z or sizes is None or len(sizes) != len(z):
                    raise ScheduleFormatError(f"placement zero of unit {u}: per-parameter stages must be 0..3, one "
                                              f"per parameter, with zero_numel[{u}] giving each parameter's element "
                                              f"count; got stages {list(z)}, zero_numel {sizes!r}")
                if len(set(z)) == 1:
                    z, numel[u] = z[0], None
                else:
                    numel[u] = tuple(int(x) for x in sizes)
            elif int(z) not in (0, 1, 2, 3):
                raise ScheduleFormatError(f"placement zero of unit {u}: ZeRO stage must be 0..3, got {z!r}")
            else:
                z, numel[u] = int(z), None
            zero[u] = z
        object.__setattr__(self, "zero", tuple(zero))
        object.__setattr__(self, "zero_numel", tuple(numel) if any(x is not None for x in numel) else None)

    @staticmethod
    def by_unit(unit_ranks: list[int] | tuple[int, ...]) -> "Placement":
        """Activation passing: unit u always runs on ``unit_ranks[u]``, which owns its weights."""
        return Placement("unit", tuple(unit_ranks), tuple(unit_ranks))

    @staticmethod
    def by_microbatch(mb_ranks: list[int] | tuple[int, ...], weight_owner: list[int] | tuple[int, ...]) -> "Placement":
        """Weight passing: micro-batch m runs all its units on ``mb_ranks[m]``."""
        return Placement("microbatch", tuple(mb_ranks), tuple(weight_owner))

    def rank(self, unit: int, mb: int) -> int:
        if self.kind == "unit":
            return self.ranks[unit]
        if self.kind == "microbatch":
            return self.ranks[mb]
        return self.ranks[unit][mb]

    def holders(self, unit: int) -> tuple[int, ...]:
        """Ranks that hold unit's master weights (its replicas)."""
        return self.replicas[unit] if self.replicas is not None else (self.weight_owner[unit],)

    def zero_stage(self, unit: int) -> int:
        """The ZeRO stage of a unit with one stage (see :meth:`zero_classes` for mixed units)."""
        z = self.zero[unit] if self.zero is not None else 0
        if isinstance(z, tuple):
            raise ValueError(f"unit {unit} has per-parameter ZeRO stages {list(z)}; use zero_classes/param_zero")
        return z

    def mixed(self, unit: int) -> bool:
        """Whether the unit's parameters have several ZeRO stages (one class per stage)."""
        return self.zero is not None and isinstance(self.zero[unit], tuple)

    def zero_classes(self, unit: int) -> tuple[int, ...]:
        """The ZeRO stages of the unit's parameters, ascending (one for a unit with one stage)."""
        z = self.zero[unit] if self.zero is not None else 0
        return tuple(sorted(set(z))) if isinstance(z, tuple) else (z,)

    def zero_parts(self, unit: int) -> list[tuple[int | None, int]]:
        """The unit's ZeRO parts as (class its actions name, stage): ``[(None, stage)]`` for a unit
        with one stage, one ``(k, k)`` per stage present for a unit with per-parameter stages."""
        if self.mixed(unit):
            return [(k, k) for k in self.zero_classes(unit)]
        return [(None, self.zero_classes(unit)[0])]

    def param_zero(self, unit: int, count: int) -> tuple[int, ...]:
        """The ZeRO stage of each of the unit's ``count`` parameters."""
        z = self.zero[unit] if self.zero is not None else 0
        if not isinstance(z, tuple):
            return (z,) * count
        if len(z) != count:
            raise ValueError(f"unit {unit}: placement gives ZeRO stages for {len(z)} parameters, the module has "
                             f"{count}")
        return z

    def class_share(self, unit: int, zclass: int | None) -> float:
        """The fraction of the unit's parameter elements in ZeRO class ``zclass`` (None: all)."""
        num, den = self.class_fraction(unit, zclass)
        return num / den

    def class_fraction(self, unit: int, zclass: int | None) -> tuple[int, int]:
        """``class_share`` as (elements of the class, elements of the unit): sizes scaled by
        ``size * num / den`` stay exact integers where the class's bytes are, so the parts of a
        unit add up to it exactly."""
        if zclass is None or not self.mixed(unit):
            return 1, 1
        z, sizes = self.zero[unit], self.zero_numel[unit]
        total = sum(sizes)
        return (sum(n for s, n in zip(z, sizes) if s == zclass), total) if total else (0, 1)

    def to_dict(self) -> dict:
        d = {"kind": self.kind, "ranks": [list(r) if isinstance(r, tuple) else r for r in self.ranks],
             "weight_owner": list(self.weight_owner)}
        if self.replicas is not None:
            d["replicas"] = [list(g) for g in self.replicas]
        if self.zero is not None:
            d["zero"] = [list(z) if isinstance(z, tuple) else z for z in self.zero]
        if self.zero_numel is not None:
            d["zero_numel"] = [list(n) if n is not None else None for n in self.zero_numel]
        if self.zero3_buffers != 1:
            d["zero3_buffers"] = self.zero3_buffers
        if self.collective_queue is not Queue.GROUP:
            d["collective_queue"] = self.collective_queue.value
        return d

    @staticmethod
    def from_dict(d: dict) -> "Placement":
        try:
            return Placement(d["kind"], tuple(d["ranks"]), tuple(d["weight_owner"]), d.get("replicas"),
                             d.get("zero"), d.get("zero_numel"), d.get("zero3_buffers", 1),
                             d.get("collective_queue", Queue.GROUP))
        except (KeyError, TypeError) as e:
            raise ScheduleFormatError(f"placement needs 'kind', 'ranks' and 'weight_owner': {e}") from None


class ScheduleQueries:
    """Read-only queries and forms shared by :class:`Schedule` and ``pipert.ir.program.Program``
    (both have ``name``, ``num_ranks``, ``num_units``, ``num_microbatches``, ``placement``,
    ``actions`` (per rank, in order) and ``meta``)."""

    name: str
    num_ranks: int
    num_units: int
    num_microbatches: int
    placement: Placement
    actions: Any
    meta: Any

    # --- queries ---------------------------------------------------------------
    def __iter__(self) -> Iterator[tuple[int, int, Action]]:
        for r, acts in enumerate(self.actions):
            for i, a in enumerate(acts):
                yield r, i, a

    def num_actions(self) -> int:
        return sum(len(a) for a in self.actions)

    def compute_actions(self, rank: int) -> list[Action]:
        return [a for a in self.actions[rank] if a.is_compute]

    def units_owned(self, rank: int) -> list[int]:
        """Units whose master weights ``rank`` holds (as owner or data-parallel replica)."""
        return [u for u in range(self.num_units) if rank in self.placement.holders(u)]

    # --- text and JSON forms -----------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "format": FORMAT_NAME, "version": FORMAT_VERSION, "name": self.name,
            "num_ranks": self.num_ranks, "num_units": self.num_units,
            "num_microbatches": self.num_microbatches, "placement": self.placement.to_dict(),
            "actions": [[str(a) for a in acts] for acts in self.actions], "meta": dict(self.meta),
        }

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def grid(self, compute_only: bool = True, width: int = 14) -> str:
        """Step x rank table: row k holds the k-th (compute) action of every rank."""
        cols = [[a for a in acts if a.is_compute or not compute_only] for acts in self.actions]
        rows = max((len(c) for c in cols), default=0)
        head = "step " + "".join(f"{'rank ' + str(r):<{width}}" for r in range(self.num_ranks))
        lines = [head.rstrip()]
        for k in range(rows):
            cells = "".join(f"{(str(c[k]) if k < len(c) else ''):<{width}}" for c in cols)
            lines.append(f"{k:<5}{cells}".rstrip())
        return "\n".join(lines)

    def with_actions(self, actions: list[list[Action]], name: str | None = None) -> "Schedule":
        """A new Schedule with these per-rank lists (and a copy of the meta)."""
        return Schedule(name or self.name, self.num_ranks, self.num_units, self.num_microbatches,
                        self.placement, [a if isinstance(a, list) else list(a) for a in actions], dict(self.meta))

    def count(self, op: Op) -> int:
        return sum(1 for _, _, a in self if a.op is op)


@dataclass
class Schedule(ScheduleQueries):
    """A complete pipeline program: ``actions[r]`` is rank r's ordered action list.

    Units ``0..num_units-1`` form one chain per micro-batch: unit u consumes the output
    activation of unit u-1 (unit 0 reads the batch, the last unit computes the loss).
    ``meta`` holds generator facts consumers may use (e.g. ``chunks``, ``stages``,
    ``update_every`` for schedules that step the optimizer more than once per batch).
    """

    name: str
    num_ranks: int
    num_units: int
    num_microbatches: int
    placement: Placement
    actions: list[list[Action]]
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.actions) != self.num_ranks:
            raise ScheduleFormatError(f"schedule {self.name!r}: {len(self.actions)} action lists for "
                                      f"{self.num_ranks} ranks")
        if len(self.placement.weight_owner) != self.num_units:
            raise ScheduleFormatError(f"schedule {self.name!r}: weight_owner has {len(self.placement.weight_owner)}"
                                      f" entries for {self.num_units} units")
        if "collective_queue" in self.meta:   # the key older files carry; the placement's field now
            import dataclasses
            cq = self.meta["collective_queue"]
            self.meta = {k: v for k, v in self.meta.items() if k != "collective_queue"}
            self.placement = dataclasses.replace(self.placement, collective_queue=cq)

    @staticmethod
    def from_dict(d: Any, source: str = "schedule") -> "Schedule":
        if not isinstance(d, dict):
            raise ScheduleFormatError(f"{source}: expected a JSON object, got {type(d).__name__}")
        if d.get("format") != FORMAT_NAME:
            raise ScheduleFormatError(f"{source}: 'format' must be {FORMAT_NAME!r}, got {d.get('format')!r}")
        if d.get("version") != FORMAT_VERSION:
            raise ScheduleFormatError(f"{source}: unsupported version {d.get('version')!r}; "
                                      f"this pipert reads version {FORMAT_VERSION}")
        missing = [k for k in ("name", "num_ranks", "num_units", "num_microbatches", "placement", "actions")
                   if k not in d]
        if missing:
            raise ScheduleFormatError(f"{source}: missing field(s) {', '.join(missing)}")
        if not isinstance(d["actions"], list) or not all(isinstance(x, list) for x in d["actions"]):
            raise ScheduleFormatError(f"{source}: 'actions' must be a list (one per rank) of lists of strings")
        actions = []
        for r, texts in enumerate(d["actions"]):
            acts = []
            for i, t in enumerate(texts):
                if not isinstance(t, str):
                    raise ScheduleFormatError(f"{source}: rank {r} action {i} is not a string: {t!r}")
                try:
                    acts.append(parse_action(t))
                except ScheduleFormatError as e:
                    raise ScheduleFormatError(f"{source}: rank {r} action {i}: {e}") from None
            actions.append(acts)
        return Schedule(str(d["name"]), int(d["num_ranks"]), int(d["num_units"]), int(d["num_microbatches"]),
                        Placement.from_dict(d["placement"]), actions, dict(d.get("meta") or {}))

    @staticmethod
    def from_json(text: str, source: str = "schedule") -> "Schedule":
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise ScheduleFormatError(f"{source}: not valid JSON ({e})") from None
        return Schedule.from_dict(d, source)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json(indent=1))

    @staticmethod
    def load(path: str | Path) -> "Schedule":
        p = Path(path)
        if not p.is_file():
            raise ScheduleFormatError(f"schedule file {str(p)!r} does not exist")
        return Schedule.from_json(p.read_text(), source=str(p))
