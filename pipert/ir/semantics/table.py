"""The op table: every op's fields, queue, and the values it reads, writes and frees, relative to
the action (the rules that make them concrete: :mod:`.rules`; the prose: docs/semantics.md)."""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, IntEnum

from ..ops import Op, Payload

__all__ = ["Value", "Queue", "Role", "Ref", "Fields", "OpSpec", "TABLE", "PAYLOAD_VALUE", "MEMORY_KIND", "PER_UNIT",
           "PAYLOAD", "F_RECOMPUTED"]


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
    """One value an op reads, writes or frees, relative to the action."""

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
    own: bool = False
    """A held unit's own model state: for a ZeRO class of stage >= 1, its shard (OPT steps it)."""
    stages: frozenset[int] | None = None
    """Only the unit's ZeRO classes of these stages on a rank that holds the unit (None: every
    class). W reads ``{3}``: its stash refers to the parameters of a ZeRO-3 class, whose storage is
    the gathered copy; of other classes it keeps what it saved."""


@dataclass(frozen=True)
class Fields:
    """The fields an op's actions set (checked when an Action is made)."""

    needs: tuple[str, ...] = ()
    """Fields that must be set, in the order an error names them."""
    allows: frozenset[str] = frozenset()
    """Further fields it may set (``tag`` is allowed everywhere)."""
    payloads: frozenset[Payload] = frozenset()
    """Payloads it may carry."""
    noun: str = ""
    """How errors name the op's kind ("compute actions")."""


@dataclass(frozen=True)
class OpSpec:
    """What one op means."""

    queue: Queue
    fields: Fields
    reads: tuple[Ref, ...] = ()
    writes: tuple[Ref, ...] = ()
    frees: tuple[Ref, ...] = ()
    """Values it ends without reading them (OPT: the whole weights of a ZeRO-1/2 class are stale)."""
    timed: bool = False
    """Takes time from the cost model (``compute_time``; collectives: the link model)."""
    side: str | None = None
    """The gathered copy of ZeRO-3 weights its weight reads use when copies are kept apart."""
    pieces: bool = False
    """Its sub-blocks run as pieces in the executor (others are merged: ``merge_sub_blocks``)."""
    doc: str = ""


_COMM = frozenset({Payload.ACT, Payload.GRAD, Payload.WEIGHT, Payload.WGRAD})
_UNIT_COMPUTE = Fields(("unit", "mb"), frozenset({"sub"}), noun="compute actions")
_P2P = Fields(("payload", "unit", "peer"), frozenset({"mb", "zclass"}), _COMM, "point-to-point actions")
_MEMORY = Fields(("payload", "unit"), frozenset({"mb", "zclass"}), _COMM | {Payload.STASH}, "memory actions")


def _group(payloads: frozenset[Payload], root: bool = False, side: bool = False) -> Fields:
    allows = {"mb", "zclass"} | ({"side"} if side else set())
    return Fields(("payload", "unit", "group") + (("root",) if root else ()), frozenset(allows), payloads,
                  "collectives")


_W = Ref(Value.WEIGHT)
TABLE: dict[Op, OpSpec] = {
    Op.F: OpSpec(Queue.COMPUTE, _UNIT_COMPUTE, (_W, Ref(Value.ACT, -1, "prev", release=True)),
                 (Ref(Value.ACT, 0, "next"), Ref(Value.STASH)), timed=True, side="fwd",
                 doc="forward of unit u for each micro-batch"),
    Op.RECOMPUTE: OpSpec(Queue.COMPUTE, _UNIT_COMPUTE, (_W, Ref(Value.KEPT, release=True)), (Ref(Value.STASH),),
                         timed=True, side="bwd", doc="forward again from the kept input, rebuilding the stash"),
    Op.B: OpSpec(Queue.COMPUTE, _UNIT_COMPUTE,
                 (_W, Ref(Value.STASH, release=True), Ref(Value.GRAD, 0, "next", release=True)),
                 (Ref(Value.GRAD, -1, "prev"), Ref(Value.WGRAD)), timed=True, side="bwd",
                 doc="full backward: input gradient and weight-gradient contribution"),
    Op.D: OpSpec(Queue.COMPUTE, _UNIT_COMPUTE,
                 (_W, Ref(Value.STASH, release=True), Ref(Value.GRAD, 0, "next", release=True)),
                 (Ref(Value.GRAD, -1, "prev"), Ref(Value.STASH_W)), timed=True, side="bwd",
                 doc="input-gradient backward; keeps what W needs"),
    Op.W: OpSpec(Queue.COMPUTE, _UNIT_COMPUTE,
                 (Ref(Value.STASH_W, release=True), Ref(Value.WEIGHT, stages=frozenset({3}))), (Ref(Value.WGRAD),),
                 timed=True, side="bwd", pieces=True,
                 doc="weight-gradient backward of one micro-batch (reads gathered ZeRO-3 weights)"),
    Op.OPT: OpSpec(Queue.COMPUTE, Fields((), frozenset({"unit"})),
                   (Ref(Value.WGRAD, release=True, own=True), Ref(Value.WEIGHT, own=True)),
                   (Ref(Value.WEIGHT, own=True),), (Ref(Value.WEIGHT, stages=frozenset({1, 2})),), timed=True,
                   doc="optimizer step: the update's weight gradient in, new weights (a ZeRO class: its shard) out"),
    Op.SEND: OpSpec(Queue.SEND, _P2P, (Ref(PAYLOAD, release=True),),
                    doc="hand the value to the directed link (weights stay: see releases_on_send)"),
    Op.RECV: OpSpec(Queue.RECV, _P2P, (), (Ref(PAYLOAD),), doc="the value arrives from the directed link"),
    Op.WAIT: OpSpec(Queue.COMPUTE, Fields(("payload", "unit", "peer", "waits"), frozenset({"mb", "zclass"}), _COMM),
                    doc="the program waits here for an earlier SEND or RECV"),
    Op.ALLREDUCE: OpSpec(Queue.GROUP, _group(_COMM), (Ref(PAYLOAD, release=True),), (Ref(PAYLOAD),), timed=True,
                         doc="sum over the group; every member ends with the sum"),
    Op.REDUCESCATTER: OpSpec(Queue.GROUP, _group(frozenset({Payload.WEIGHT, Payload.WGRAD})),
                             (Ref(PAYLOAD, release=True),), (Ref(PAYLOAD, shard=True),), timed=True,
                             doc="sum over the group; member k ends with share k of the sum"),
    Op.ALLGATHER: OpSpec(Queue.GROUP, _group(frozenset({Payload.WEIGHT}), side=True), (Ref(PAYLOAD, shard=True),),
                         (Ref(PAYLOAD),), timed=True,
                         doc="every member ends with the whole value, gathered from the members' shares"),
    Op.BROADCAST: OpSpec(Queue.GROUP, _group(_COMM, root=True), (Ref(PAYLOAD, role=Role.ROOT),),
                         (Ref(PAYLOAD, role=Role.OTHERS),), timed=True, doc="the root's value to every other member"),
    Op.REDUCE: OpSpec(Queue.GROUP, _group(_COMM, root=True), (Ref(PAYLOAD, release=True),),
                      (Ref(PAYLOAD, role=Role.ROOT),), timed=True, doc="sum over the group to the root"),
    Op.FREE: OpSpec(Queue.COMPUTE, Fields(_MEMORY.needs, _MEMORY.allows | {"side"}, _MEMORY.payloads, _MEMORY.noun),
                    (Ref(PAYLOAD, release=True),), doc="drop the value"),
    Op.OFFLOAD: OpSpec(Queue.COMPUTE, _MEMORY, (Ref(PAYLOAD, release=True),), (Ref(PAYLOAD, host=True),), timed=True,
                       doc="move the value to host memory (it stops counting; PREFETCH before reading it)"),
    Op.PREFETCH: OpSpec(Queue.COMPUTE, _MEMORY, (Ref(PAYLOAD, host=True, release=True),), (Ref(PAYLOAD),),
                        timed=True, doc="bring an offloaded value back"),
}
"""The meaning of every op."""

F_RECOMPUTED = (Ref(Value.ACT, 0, "next"), Ref(Value.KEPT))
"""What an F writes when a RECOMPUTE of the same (unit, micro-batch) follows on its rank."""
