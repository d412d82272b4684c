"""What every op means: the one table that the validator/simulator, the emulator, the executor
and the lowering passes read (docs/semantics.md explains it in prose).

A rank holds *values*. A value is named by its kind, a unit and, for per-micro-batch kinds, a
micro-batch:

====================  ===========================================================================
``ACT u m``           output activation of unit u (what unit u+1 reads)
``GRAD u m``          gradient w.r.t. ``ACT u m`` (what backward of unit u reads)
``STASH u m``         what the backward of (u, m) needs, left by F (or rebuilt by RECOMPUTE)
``STASH_W u m``       what W of (u, m) needs, left by D
``KEPT u m``          the input F keeps when a RECOMPUTE of (u, m) follows on the same rank
``WEIGHT u``          the parameters of unit u
``WGRAD u``           the accumulated weight gradient of unit u: a set of micro-batch contributions
====================  ===========================================================================

Each op *reads* values and *writes* values (:data:`TABLE`). A read marked ``release`` ends the
value's life on the rank (its memory is freed); a write makes the value present (and, if it is
counted, adds its memory). Sizes come from the cost model: ``memory(MEMORY_KIND[kind], unit)``.

Rules that hold for every op (the consumers apply them; nothing else decides):

- *Units and edges.* A ref with ``edge="prev"`` exists only for units with a predecessor
  (u > 0: unit 0 reads the batch, its backward produces no input gradient); ``edge="next"``
  only for units with a successor (the last unit's F produces the loss, not an activation, and
  its backward is seeded by the loss).
- *Folds.* An action naming several micro-batches (``F u m0,1``) reads and writes each per-
  micro-batch value once per micro-batch; per-unit values once.
- *Sub-blocks.* A compute split into pieces ``sI/N`` reads at its first piece and writes at its
  last piece; every piece takes ``1/N`` of the time.
- *Recomputation.* An F of (u, m) that is followed on its rank by ``RECOMPUTE u m`` writes
  ``KEPT u m`` instead of ``STASH u m``; the RECOMPUTE turns it into the stash.
- *Payload.* SEND, RECV, collectives and memory ops act on the value their payload names
  (:data:`PAYLOAD_VALUE`): the value of the action's unit and micro-batches.
- *OPT without a unit* steps every unit whose weights the rank holds.
- *ZeRO classes.* A unit whose parameters have several ZeRO stages (``Placement.mixed``) has one
  ``WEIGHT`` and one ``WGRAD`` value per stage present, its *classes*, each with its share of the
  unit's bytes (``Placement.class_share``) and the rules of its stage. An action whose payload is
  the weights or gradient of such a unit names one class (``zclass``, text ``z3``) and acts on that
  class alone; a compute or OPT of the unit reads and writes every class. Keys of class values:
  :func:`class_mb`.
- *Separate ZeRO-3 buffers.* With ``Placement.zero3_buffers == 2`` the gathered weights of a
  ZeRO-3 unit (or class) are two values: the ``fwd`` copy, which F reads, and the ``bwd`` copy,
  which B, D and RECOMPUTE read; an ALLGATHER or FREE of them names one (``side``). Each is
  counted while present, so a forward and a backward run of one chunk that overlap hold both.
- *Counted memory.* Every value is counted while present, except the weights a rank holds from
  the start (its own units: static memory, not part of the running sum). OFFLOAD moves a value
  off the device (it stops counting, and reading it is an error until PREFETCH brings it back).

Queues: each op belongs to one of the rank's queues (:class:`Queue`); the timing rules of each
queue are in docs/semantics.md ("The three queues and time").
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, IntEnum
from operator import attrgetter
from typing import Iterator

from .action import Action, Op, Payload

__all__ = ["Value", "Queue", "Role", "Ref", "OpSpec", "TABLE", "PAYLOAD_VALUE", "MEMORY_KIND", "PER_UNIT",
           "spec", "op_queue", "queue_of", "expand_refs", "reads", "writes", "recomputed", "held_weights", "ValueKey",
           "describe", "releases_on_send", "class_mb", "class_of", "BWD_COPY_READERS"]


class Value(IntEnum):
    """Kinds of per-rank values (the numbers are stable: the engine packs them into keys)."""

    ACT = 0
    STASH = 1
    STASH_W = 2
    GRAD = 3
    WEIGHT = 4
    KEPT = 5
    WGRAD = 6


class Queue(str, Enum):
    """Where an op runs on its rank."""

    COMPUTE = "compute"   # in order, one at a time; the rank's program waits here for inputs
    SEND = "send"         # posted at its list position; moves on its directed link in FIFO order
    RECV = "recv"         # posted at its list position; matched in FIFO order per directed link
    GROUP = "group"       # a collective: posted at its list position, joint over its group, FIFO per group


class Role(str, Enum):
    """Which members of a collective read or write its value."""

    ALL = "all"
    ROOT = "root"
    OTHERS = "others"
    NONE = "none"


PAYLOAD_VALUE: dict[Payload, Value] = {Payload.ACT: Value.ACT, Payload.GRAD: Value.GRAD,
                                       Payload.WEIGHT: Value.WEIGHT, Payload.WGRAD: Value.WGRAD,
                                       Payload.STASH: Value.STASH}
"""The value a SEND/RECV/collective/memory op acts on."""

MEMORY_KIND: dict[Value, str] = {Value.ACT: "act", Value.STASH: "stash", Value.STASH_W: "stash_w",
                                 Value.GRAD: "grad", Value.WEIGHT: "weight", Value.KEPT: "kept",
                                 Value.WGRAD: "wgrad"}
"""Cost-model memory kind of each value (``CostModel.memory(kind, unit)``, per micro-batch)."""

PER_UNIT = frozenset({Value.WEIGHT, Value.WGRAD})
"""Kinds with one value per unit; every other kind has one value per (unit, micro-batch)."""

PAYLOAD = None
"""Marks a ref whose kind is the action's payload."""


@dataclass(frozen=True)
class Ref:
    """One value an op reads or writes, relative to the action."""

    value: Value | None
    """Kind of the value; None = the action's payload."""
    du: int = 0
    """Unit offset: the value belongs to unit ``action.unit + du``."""
    edge: str | None = None
    """"prev": exists only if the action's unit has a predecessor; "next": only if it has a successor."""
    release: bool = False
    """Reading it ends the value's life on this rank."""
    role: Role = Role.ALL
    """For collectives: which members read or write it."""
    shard: bool = False
    """The value is one member's 1/n share (REDUCESCATTER writes one; ALLGATHER reads one)."""
    host: bool = False
    """The value's copy in host memory (OFFLOAD writes it, PREFETCH reads it; never counted)."""


@dataclass(frozen=True)
class OpSpec:
    """What one op means."""

    queue: Queue
    reads: tuple[Ref, ...] = ()
    writes: tuple[Ref, ...] = ()
    timed: bool = False
    """Takes time from the cost model (``compute_time``; collectives: the link model)."""
    doc: str = ""


_W = Ref(Value.WEIGHT)
TABLE: dict[Op, OpSpec] = {
    Op.F: OpSpec(Queue.COMPUTE, (_W, Ref(Value.ACT, -1, "prev", release=True)),
                 (Ref(Value.ACT, 0, "next"), Ref(Value.STASH)), True,
                 "forward of unit u for each micro-batch"),
    Op.RECOMPUTE: OpSpec(Queue.COMPUTE, (_W, Ref(Value.KEPT, release=True)), (Ref(Value.STASH),), True,
                         "forward again from the kept input, rebuilding the stash"),
    Op.B: OpSpec(Queue.COMPUTE, (_W, Ref(Value.STASH, release=True), Ref(Value.GRAD, 0, "next", release=True)),
                 (Ref(Value.GRAD, -1, "prev"), Ref(Value.WGRAD)), True,
                 "full backward: input gradient and weight-gradient contribution"),
    Op.D: OpSpec(Queue.COMPUTE, (_W, Ref(Value.STASH, release=True), Ref(Value.GRAD, 0, "next", release=True)),
                 (Ref(Value.GRAD, -1, "prev"), Ref(Value.STASH_W)), True,
                 "input-gradient backward; keeps what W needs"),
    Op.W: OpSpec(Queue.COMPUTE, (Ref(Value.STASH_W, release=True),), (Ref(Value.WGRAD),), True,
                 "weight-gradient backward of one micro-batch"),
    Op.OPT: OpSpec(Queue.COMPUTE, (Ref(Value.WGRAD, release=True), _W), (_W,), True,
                   "optimizer step: the update's weight gradient in, new weights out"),
    Op.SEND: OpSpec(Queue.SEND, (Ref(PAYLOAD, release=True),), (), False,
                    "hand the value to the directed link (weights stay: see releases_on_send)"),
    Op.RECV: OpSpec(Queue.RECV, (), (Ref(PAYLOAD),), False, "the value arrives from the directed link"),
    Op.WAIT: OpSpec(Queue.COMPUTE, (), (), False, "the program waits here for an earlier SEND or RECV"),
    Op.ALLREDUCE: OpSpec(Queue.GROUP, (Ref(PAYLOAD, release=True),), (Ref(PAYLOAD),), True,
                         "sum over the group; every member ends with the sum"),
    Op.REDUCESCATTER: OpSpec(Queue.GROUP, (Ref(PAYLOAD, release=True),), (Ref(PAYLOAD, shard=True),), True,
                             "sum over the group; member k ends with share k of the sum"),
    Op.ALLGATHER: OpSpec(Queue.GROUP, (Ref(PAYLOAD, shard=True),), (Ref(PAYLOAD),), True,
                         "every member ends with the whole value, gathered from the members' shares"),
    Op.BROADCAST: OpSpec(Queue.GROUP, (Ref(PAYLOAD, role=Role.ROOT),), (Ref(PAYLOAD, role=Role.OTHERS),), True,
                         "the root's value to every other member"),
    Op.REDUCE: OpSpec(Queue.GROUP, (Ref(PAYLOAD, release=True),), (Ref(PAYLOAD, role=Role.ROOT),), True,
                      "sum over the group to the root"),
    Op.FREE: OpSpec(Queue.COMPUTE, (Ref(PAYLOAD, release=True),), (), False, "drop the value"),
    Op.OFFLOAD: OpSpec(Queue.COMPUTE, (Ref(PAYLOAD, release=True),), (Ref(PAYLOAD, host=True),), True,
                       "move the value to host memory (it stops counting; PREFETCH before reading it)"),
    Op.PREFETCH: OpSpec(Queue.COMPUTE, (Ref(PAYLOAD, host=True, release=True),), (Ref(PAYLOAD),), True,
                        "bring an offloaded value back"),
}
"""The meaning of every op."""

BWD_COPY_READERS = frozenset({Op.B, Op.D, Op.RECOMPUTE})
"""Computes that read the ``bwd`` copy of gathered ZeRO-3 weights when copies are kept apart (F
reads the ``fwd`` copy; see the module doc, "Separate ZeRO-3 buffers")."""

_F_RECOMPUTED = (Ref(Value.ACT, 0, "next"), Ref(Value.KEPT))
"""What an F writes when a RECOMPUTE of the same (unit, micro-batch) follows on its rank."""


def spec(op: Op) -> OpSpec:
    return TABLE[op]


def op_queue(op: Op, collective_queue: str = "group") -> Queue:
    """The queue of ``op``. ``collective_queue="compute"`` (``meta["collective_queue"]``) makes
    collectives block the program like a compute."""
    q = TABLE[op].queue
    if q is Queue.GROUP and collective_queue == "compute":
        return Queue.COMPUTE
    return q


def queue_of(a: Action, collective_queue: str = "group") -> Queue:
    """The queue of action ``a`` (see :func:`op_queue`)."""
    return op_queue(a.op, collective_queue)


def releases_on_send(payload: Payload) -> bool:
    """A SEND hands its value over, except a unit's weights: the sender keeps them (FREE drops)."""
    return payload is not Payload.WEIGHT


ValueKey = tuple[Value, int, int]
"""(kind, unit, micro-batch); for per-unit kinds the micro-batch slot is :func:`class_mb`."""


def class_mb(zclass: int | None, side: str | None = None) -> int:
    """Micro-batch slot of a per-unit value's key: -1 for the whole unit, -2-k for ZeRO class k;
    the ``bwd`` copy of gathered ZeRO-3 weights 5 lower."""
    return (-1 if zclass is None else -2 - zclass) - (5 if side == "bwd" else 0)


def class_of(slot: int) -> int | None:
    """The ZeRO class of a slot of :func:`class_mb` (None: the whole unit)."""
    slot = slot + 5 if slot <= -6 else slot
    return None if slot == -1 else -2 - slot


def describe(key: ValueKey) -> str:
    kind, u, m = key
    name = MEMORY_KIND[kind]
    if kind in PER_UNIT:
        zc = class_of(m)
        return f"{name} u{u}" + ("" if zc is None else f" z{zc}") + (" bwd" if m <= -6 else "")
    return f"{name} u{u} m{m}"


def expand_refs(a: Action, refs: tuple[Ref, ...], num_units: int, rank: int | None = None
                ) -> Iterator[tuple[ValueKey, Ref]]:
    """The concrete values ``refs`` name for action ``a`` (edges, folds, payload, roles applied)."""
    u = a.unit
    for ref in refs:
        if ref.role is not Role.ALL and rank is not None:
            is_root = rank == a.root
            if (ref.role is Role.ROOT) != is_root or ref.role is Role.NONE:
                continue
        if ref.edge == "prev" and u == 0 or ref.edge == "next" and u == num_units - 1:
            continue
        kind = PAYLOAD_VALUE[a.payload] if ref.value is None else ref.value
        if ref.value is None and a.op is Op.SEND and not releases_on_send(a.payload):
            ref = Ref(kind, ref.du, ref.edge, False, ref.role, ref.shard, ref.host)
        uu = u + ref.du
        if kind in PER_UNIT:
            side = None if ref.shard else a.side   # one shard per class; the side names a gathered copy
            yield (kind, uu, class_mb(a.zclass, side) if ref.value is None else -1), ref
        else:
            for m in a.mb:
                yield (kind, uu, m), ref


def reads(a: Action, num_units: int, rank: int | None = None) -> list[tuple[ValueKey, Ref]]:
    """Values ``a`` reads (OPT without a unit: see :func:`held_weights`; here none)."""
    if a.op is Op.OPT and a.unit is None:
        return []
    return list(expand_refs(a, TABLE[a.op].reads, num_units, rank))


def writes(a: Action, num_units: int, rank: int | None = None, recompute: bool = False
           ) -> list[tuple[ValueKey, Ref]]:
    """Values ``a`` writes; ``recompute``: a RECOMPUTE of the same (unit, micro-batch) follows."""
    if a.op is Op.OPT and a.unit is None:
        return []
    refs = _F_RECOMPUTED if recompute and a.op is Op.F else TABLE[a.op].writes
    return list(expand_refs(a, refs, num_units, rank))


_OP = attrgetter("op")


def recomputed(actions: list[Action]) -> set[tuple[int, int]]:
    """(unit, micro-batch) pairs that a RECOMPUTE of this rank's list rebuilds."""
    rec = Op.RECOMPUTE
    if rec not in map(_OP, actions):   # the common case, scanned without a Python-level loop
        return set()
    return {(a.unit, m) for a in actions if a.op is rec for m in a.mb}


def held_weights(weight_owner: tuple[int, ...], replicas: tuple[tuple[int, ...], ...] | None, rank: int,
                 sharded: frozenset[int] = frozenset()) -> list[int]:
    """Units whose whole weights ``rank`` holds at the start of a step: the units it owns (or
    holds a replica of), except ZeRO-3 units, of which it holds only a shard."""
    out = []
    for u, owner in enumerate(weight_owner):
        holders = replicas[u] if replicas is not None else (owner,)
        if rank in holders and u not in sharded:
            out.append(u)
    return out
