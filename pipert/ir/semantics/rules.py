"""The rules that make the op table concrete for one program: :class:`Semantics` turns an action
on a rank into the values it reads, writes and frees (:class:`Plan`), and says what a rank holds
at the start, which values count as memory, which queue each op runs on, and which ZeRO class
and side fields the placement allows. The validator/simulator engine, the executor and the
lowering passes take every such answer from here."""
from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter
from typing import TYPE_CHECKING, Any, Callable, Iterable, NamedTuple

from ..ops import Op, Payload
from .opsets import HOST_OPS, SIDED_OPS
from .table import F_RECOMPUTED, MEMORY_KIND, PAYLOAD_VALUE, PER_UNIT, TABLE, Queue, Ref, Role, Value

if TYPE_CHECKING:
    from ..action import Action
    from ..schedule import Placement

__all__ = ["Semantics", "Effect", "Plan", "ValueKey", "BWD", "slot", "slot_class", "describe", "releases_on_send",
           "recomputed", "action_time"]

BWD = 8
"""Slot offset of the ``bwd`` copy of gathered ZeRO-3 weights (:func:`slot`)."""

ValueKey = tuple[Value, int, int]
"""(kind, unit, index): the index is the micro-batch of a per-micro-batch kind, the slot
(:func:`slot`) of a per-unit kind."""


def slot(zclass: int | None, side: str | None = None) -> int:
    """The slot of a per-unit value: 0 for the whole unit, k+1 for ZeRO class k; the ``bwd`` copy
    of gathered ZeRO-3 weights BWD higher."""
    return (0 if zclass is None else zclass + 1) + (BWD if side == "bwd" else 0)


def slot_class(s: int) -> int | None:
    """The ZeRO class of slot ``s`` (None: the whole unit)."""
    s %= BWD
    return None if s == 0 else s - 1


def describe(key: ValueKey) -> str:
    kind, u, m = key
    name = MEMORY_KIND[kind]
    if kind in PER_UNIT:
        zc = slot_class(m)
        return f"{name} u{u}" + ("" if zc is None else f" z{zc}") + (" bwd" if m >= BWD else "")
    return f"{name} u{u} m{m}"


def releases_on_send(payload: Payload) -> bool:
    """A SEND hands its value over, except a unit's weights: the sender keeps them (FREE drops)."""
    return payload is not Payload.WEIGHT


def applies(ref: Ref, rank: int, root: int | None) -> bool:
    """Whether ``ref`` of an action rooted at ``root`` (None: no root) concerns member ``rank``."""
    return ref.role is Role.ALL or ref.role is not Role.NONE and (ref.role is Role.ROOT) == (rank == root)


def sends_payload(a: "Action", rank: int) -> bool:
    """Whether communication ``a`` reads its whole payload on ``rank`` (a SEND, an ALLREDUCE, the
    root of a BROADCAST; not ALLGATHER, which reads a share, nor a RECV)."""
    return TABLE[a.op].queue in (Queue.SEND, Queue.GROUP) and any(
        ref.value is None and not ref.shard and not ref.host and applies(ref, rank, a.root)
        for ref in TABLE[a.op].reads)


@dataclass(frozen=True, slots=True)
class Effect:
    """One value (or one per micro-batch, or one per class slot) an action reads, writes or frees."""

    kind: Value
    unit: int
    slots: tuple[int, ...] | None
    """None: one value per micro-batch of the action; else the per-unit value's slots."""
    release: bool = False
    """Reading it ends its life on the rank."""
    shard: bool = False
    """A holder's 1/n share of the value."""
    host: bool = False
    """The value's copy in host memory."""

    def keys(self, mb: tuple[int, ...]) -> list[ValueKey]:
        """The concrete values, for an action over micro-batches ``mb``."""
        return [(self.kind, self.unit, m) for m in (mb if self.slots is None else self.slots)]


class Plan(NamedTuple):
    """What one action does on one rank, every rule applied (reads happen first, then writes,
    then frees; a split compute reads at its first piece and writes at its last)."""

    reads: tuple[Effect, ...]
    writes: tuple[Effect, ...]
    frees: tuple[Effect, ...] = ()


@dataclass(frozen=True)
class _Unit:
    holders: tuple[int, ...]
    mixed: bool
    slots: tuple[int, ...]
    """Its value slots: (0,) for one ZeRO stage, one per class (k+1) for several."""
    stage: dict[int, int]
    """ZeRO stage per slot (the bwd slots included)."""
    fraction: dict[int, tuple[int, int]]
    """Share of the unit's elements per slot as (numerator, denominator)."""


class Semantics:
    """The meaning of the actions of one program: its unit count and placement (module doc)."""

    def __init__(self, num_units: int, placement: "Placement") -> None:
        self.num_units = num_units
        self.placement = placement
        self.split = placement.zero3_buffers == 2
        self.collective_queue: Queue = getattr(placement, "collective_queue", Queue.GROUP)
        blocking = self.collective_queue is Queue.COMPUTE
        self._queue = {op: Queue.COMPUTE if blocking and s.queue is Queue.GROUP else s.queue
                       for op, s in TABLE.items()}
        self.units = [self._unit(u) for u in range(num_units)]
        self._plans: dict[tuple, Plan] = {}   # plan_key -> plan (cached_plan)

    @classmethod
    def of(cls, schedule: Any) -> "Semantics":
        return cls(schedule.num_units, schedule.placement)

    def _unit(self, u: int) -> _Unit:
        pl = self.placement
        mixed = pl.mixed(u)
        slots = (0,) if not mixed else tuple(k + 1 for k in pl.zero_classes(u))
        stage = {s: (pl.zero_classes(u)[0] if s == 0 else s - 1) for s in slots}
        fraction = {s: pl.class_fraction(u, slot_class(s)) for s in slots}
        for s in slots:
            stage[s + BWD], fraction[s + BWD] = stage[s], fraction[s]
        return _Unit(pl.holders(u), mixed, slots, stage, fraction)

    # --- queues, holdings, memory ------------------------------------------------------------
    def queue(self, op: Op) -> Queue:
        """The queue ``op`` runs on (collectives: the placement's ``collective_queue``)."""
        return self._queue[op]

    def holds(self, rank: int, unit: int) -> bool:
        return rank in self.units[unit].holders

    def held_units(self, rank: int) -> list[int]:
        return [u for u, info in enumerate(self.units) if rank in info.holders]

    def initial(self, rank: int) -> list[tuple[int, int, bool]]:
        """The weights ``rank`` holds at the start of a step, as (unit, slot, shard): of each class
        of a held unit the whole weights (ZeRO 0-2) and the shard (ZeRO 1-3)."""
        out = []
        for u in self.held_units(rank):
            info = self.units[u]
            for s in info.slots:
                z = info.stage[s]
                if z <= 2:
                    out.append((u, s, False))
                if z >= 1:
                    out.append((u, s, True))
        return out

    def counted(self, kind: Value, unit: int, rank: int, shard: bool = False, slot_: int = 0,
                host: bool = False) -> bool:
        """Whether a present value counts in the running memory: everything but host copies and a
        holder's model state (the whole weights of ZeRO 0-2, the whole gradient of ZeRO 0-1, shards)."""
        if host:
            return False
        info = self.units[unit]
        if rank not in info.holders:
            return True
        if kind is Value.WEIGHT:
            return not (shard or info.stage[slot_] <= 2)
        if kind is Value.WGRAD:
            return not (shard or info.stage[slot_] <= 1)
        return True

    # --- plans ---------------------------------------------------------------------------------
    def plan(self, a: "Action", rank: int, keeps: bool = False) -> Plan:
        """What ``a`` reads, writes and frees on ``rank``; ``keeps``: an F followed on its rank by a
        RECOMPUTE of the same (unit, micro-batch), which keeps its input instead of the stash."""
        spec = TABLE[a.op]
        units = None
        if a.op is Op.OPT:   # OPT without a unit steps every unit the rank holds
            units = [a.unit] if a.unit is not None else self.held_units(rank)
        writes = F_RECOMPUTED if keeps and a.op is Op.F else spec.writes
        return Plan(self._apply(a, rank, spec.reads, units), self._apply(a, rank, writes, units),
                    self._apply(a, rank, spec.frees, units) if spec.frees else ())

    def plan_key(self, a: "Action", rank: int, keeps: bool = False) -> tuple:
        """Everything ``plan(a, rank, keeps)`` and :meth:`counted` of its effects depend on: equal keys
        give equal plans, so one plan serves every rank (and action) with the key. ``rank`` enters
        only through whether it is the action's root and whether it holds the action's unit (the
        unit's weights and gradient, :meth:`_own`; an OPT without a unit: the units it holds);
        per-micro-batch values are counted on every rank alike."""
        u = a.unit
        if u is None:
            held: Any = tuple(self.held_units(rank)) if a.op is Op.OPT else None
        else:
            held = 0 <= u < self.num_units and rank in self.units[u].holders
        return (a.op, a.payload, u, rank == a.root, keeps, a.zclass, a.side, held)

    def cached_plan(self, a: "Action", rank: int, keeps: bool = False) -> Plan:
        """``plan(a, rank, keeps)``, computed once per :meth:`plan_key` (a Plan is immutable)."""
        key = self.plan_key(a, rank, keeps)
        got = self._plans.get(key)
        if got is None:
            got = self._plans[key] = self.plan(a, rank, keeps)
        return got

    def reads(self, a: "Action", rank: int) -> list[ValueKey]:
        return [k for e in self.cached_plan(a, rank).reads for k in e.keys(a.mb)]

    def writes(self, a: "Action", rank: int, keeps: bool = False) -> list[ValueKey]:
        return [k for e in self.cached_plan(a, rank, keeps).writes for k in e.keys(a.mb)]

    def _apply(self, a: "Action", rank: int, refs: tuple[Ref, ...], units: list[int] | None) -> tuple[Effect, ...]:
        """The refs that apply to ``a`` on ``rank``: roles, edges, the payload's kind, class and side,
        release-on-send, and a compute's (or OPT's) weights and gradient per class slot."""
        u, out = a.unit, []
        side = TABLE[a.op].side
        for ref in refs:
            if not applies(ref, rank, a.root):
                continue
            if ref.edge == "prev" and u == 0 or ref.edge == "next" and u == self.num_units - 1:
                continue
            if ref.value is None:   # the payload: the action's unit, class and (gathered copies) side
                kind = PAYLOAD_VALUE[a.payload]
                release = ref.release and not (a.op is Op.SEND and not releases_on_send(a.payload))
                slots = (slot(a.zclass, None if ref.shard else a.side),) if kind in PER_UNIT else None
                out.append(Effect(kind, u, slots, release, ref.shard, ref.host))
            elif ref.value not in PER_UNIT:
                out.append(Effect(ref.value, u + ref.du, None, ref.release, ref.shard, ref.host))
            else:
                for uu in (units if units is not None else (u + ref.du,)):
                    out.extend(self._own(ref, uu, rank, side))
        return tuple(out)

    def _own(self, ref: Ref, u: int, rank: int, side: str | None) -> Iterable[Effect]:
        """A compute's or OPT's weights or gradient of unit u: every class slot (``ref.stages``:
        those of a held unit with these stages); weights a ``bwd`` reader reads from the bwd copy
        of a held ZeRO-3 class kept apart; OPT (``ref.own``) the shard of a class of stage >= 1."""
        info = self.units[u]
        held = rank in info.holders
        whole, shards = [], []
        for s in info.slots:
            z = info.stage[s] if held else None
            if ref.stages is not None and z not in ref.stages:
                continue
            if ref.own and z is not None and z >= 1:
                shards.append(s)
            elif ref.value is Value.WEIGHT and side == "bwd" and self.split and z == 3:
                whole.append(s + BWD)
            else:
                whole.append(s)
        if whole:
            yield Effect(ref.value, u, tuple(whole), ref.release)
        if shards:
            yield Effect(ref.value, u, tuple(shards), ref.release, shard=True)

    # --- fields the placement decides ----------------------------------------------------------
    def field_error(self, a: "Action") -> str | None:
        """Why ``a``'s ZeRO class or side does not fit the placement (None: it fits): a class names
        one of a unit with several stages, and such a unit's weight or gradient messages,
        collectives and memory ops name one; a side names a gathered copy of ZeRO-3 weights kept
        apart (``zero3_buffers=2``), and their ALLGATHER and FREE name one; those two copies are not
        moved to host memory (OFFLOAD and PREFETCH name no side)."""
        u, z = a.unit, a.zclass
        if z is None and a.side is None and a.payload is not Payload.WEIGHT and a.payload is not Payload.WGRAD:
            return None   # names neither: only the weights or gradient of a unit are split into classes
        info = self.units[u]
        classes = [s - 1 for s in info.slots] if info.mixed else []
        stage = info.stage.get(slot(z))
        gathered = self.split and stage == 3 and a.payload is Payload.WEIGHT and a.op in SIDED_OPS
        if z is None and info.mixed:
            return f"unit {u} has ZeRO classes {classes}: name one (z{classes[0]}..)"
        if z is not None and z not in classes:
            return (f"unit {u} has ZeRO classes {classes}" if classes else
                    f"unit {u} has one ZeRO stage ({info.stage[0]}): its actions name no class") + f", not z{z}"
        if gathered and a.side is None:
            return ("the schedule keeps separate forward and backward copies of gathered ZeRO-3 weights "
                    "(placement zero3_buffers=2): name one (fwd or bwd)")
        if self.split and stage == 3 and a.payload is Payload.WEIGHT and a.op in HOST_OPS:
            return (f"{a.op.value} of gathered ZeRO-3 weights kept apart (placement zero3_buffers=2): the fwd "
                    f"and bwd copies are FREEd, not moved to host memory")
        if a.side is not None and not gathered:
            return (f"side {a.side} names a copy of gathered ZeRO-3 weights, which this schedule does not keep "
                    f"apart (placement zero3_buffers={2 if self.split else 1}, stage {stage})")
        return None


_OP = attrgetter("op")


def recomputed(actions: list["Action"]) -> set[tuple[int, int]]:
    """(unit, micro-batch) pairs that a RECOMPUTE of this rank's list rebuilds (the F of each
    keeps its input instead of the stash)."""
    rec = Op.RECOMPUTE
    if rec not in map(_OP, actions):   # the common case, scanned without a Python-level loop
        return set()
    return {(a.unit, m) for a in actions if a.op is rec for m in a.mb}


def action_time(price: Callable[["Action", int], float], a: "Action", rank: int) -> float:
    """Duration of compute ``a`` on ``rank``: a cost model prices one (op, unit, micro-batch)
    (``price``: its ``compute_time``); a fold takes the sum over its micro-batches, a sub-block
    ``sI/N`` 1/N of the whole, unless ``price`` prices sub-blocks itself (its ``prices_pieces``
    attribute is true: a cost model that measured each piece, ``pipert.cost.profiled``)."""
    if a.sub is None and len(a.mb) <= 1:
        return price(a, rank)
    from dataclasses import replace
    sub = a.sub if getattr(price, "prices_pieces", False) else None
    t = sum(price(replace(a, mb=(m,), sub=sub), rank) for m in a.mb) if a.mb else price(replace(a, sub=sub), rank)
    return t / a.sub[1] if a.sub is not None and sub is None else t
