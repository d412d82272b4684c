"""One action of a schedule, and its text form.

Text grammar (tokens separated by spaces, in this order, optional ones omitted)::

    OP [PAYLOAD] [uU] [zK] [fwd|bwd] [mM[,M...]] [sI/N] [->PEER | <-PEER] [@R,R,...] [^ROOT] [#TAG]
    WAIT <text of the SEND or RECV it completes>

Examples: ``F u3 m2``, ``B u0 m0,1``, ``SEND act u3 m2 ->1``, ``RECV grad u3 m2 <-2``,
``BROADCAST weight u5 @3,4,5 ^4``, ``OPT u2``, ``WAIT RECV act u3 m2 <-0``,
``ALLGATHER weight u2 z3 @0,2`` (the ZeRO-3 class of unit 2's parameters), ``FREE weight u2 z3 bwd``
(its gathered copy for backward computes).
``parse(str(a)) == a`` holds for every valid action.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields

from .. import native
from .ops import Op, Payload
from .semantics.fields import fields_error
from .semantics.opsets import (BACKWARD_OPS, COLLECTIVE_OPS, COMPUTE_OPS, MEMORY_OPS, P2P_OPS, ROOTED_OPS,
                               UNIT_COMPUTE_OPS)

__all__ = [
    "Op", "Payload", "Action", "parse_action", "ScheduleFormatError",
    "COMPUTE_OPS", "P2P_OPS", "COLLECTIVE_OPS", "MEMORY_OPS", "BACKWARD_OPS",
]


class ScheduleFormatError(ValueError):
    """A schedule, action text or schedule file that does not follow the format."""


@dataclass(frozen=True, slots=True, init=False)
class Action:
    """One step of one rank's program.

    Invariants (checked in ``__init__``): compute ops other than OPT name a unit and
    at least one micro-batch; SEND/RECV name a payload and a peer; collectives name a
    payload and a group; WAIT names the op it completes in ``waits``; ``zclass`` (0..3) names
    the parameters of the unit with that ZeRO stage and is only for weight or weight-gradient
    payloads of messages, collectives and memory ops (docs/semantics.md, "ZeRO classes"); ``side``
    ("fwd" or "bwd") names one of the two gathered copies of ZeRO-3 weights (ALLGATHER and FREE of
    weights only; docs/semantics.md, "Separate ZeRO-3 buffers").
    """

    op: Op
    unit: int | None = None
    mb: tuple[int, ...] = ()
    payload: Payload | None = None
    peer: int | None = None
    group: tuple[int, ...] = ()
    root: int | None = None
    tag: int = 0
    sub: tuple[int, int] | None = None
    waits: Op | None = None
    zclass: int | None = None
    side: str | None = None
    _h: int = field(default=0, init=False, repr=False, compare=False)

    def __init__(self, op: Op, unit: int | None = None, mb: tuple[int, ...] = (), payload: Payload | None = None,
                 peer: int | None = None, group: tuple[int, ...] = (), root: int | None = None, tag: int = 0,
                 sub: tuple[int, int] | None = None, waits: Op | None = None, zclass: int | None = None,
                 side: str | None = None) -> None:
        # the dataclass __init__ of a frozen class sets each field through object.__setattr__;
        # the slots' own setters do the same a few times faster (schedules hold 1e5+ actions)
        if type(mb) is int:
            mb = (mb,)
        _set_op(self, op)
        _set_unit(self, unit)
        _set_mb(self, mb)
        _set_payload(self, payload)
        _set_peer(self, peer)
        _set_group(self, group)
        _set_root(self, root)
        _set_tag(self, tag)
        _set_sub(self, sub)
        _set_waits(self, waits)
        _set_zclass(self, zclass)
        _set_side(self, side)
        _set_h(self, 0)
        if zclass is None and side is None and type(op) is Op and type(mb) is tuple and type(group) is tuple \
                and (payload is None or type(payload) is Payload) \
                and _plain(op, unit, mb, payload, peer, group, root, sub, waits):
            return
        self._normalise()
        if self.zclass is not None or self.side is not None or not _plain(self.op, self.unit, self.mb, self.payload, self.peer, self.group,
                                                 self.root, self.sub, self.waits):
            self._check()

    def _normalise(self) -> None:
        if not isinstance(self.op, Op):
            object.__setattr__(self, "op", Op(self.op))
        if self.payload is not None and not isinstance(self.payload, Payload):
            object.__setattr__(self, "payload", Payload(self.payload))
        if isinstance(self.mb, int):
            object.__setattr__(self, "mb", (self.mb,))
        elif not isinstance(self.mb, tuple):
            object.__setattr__(self, "mb", tuple(self.mb))
        if not isinstance(self.group, tuple):
            object.__setattr__(self, "group", tuple(self.group))
        if self.waits is not None and not isinstance(self.waits, Op):
            object.__setattr__(self, "waits", Op(self.waits))
        if self.sub is not None:
            object.__setattr__(self, "sub", tuple(self.sub))

    def __hash__(self) -> int:
        # computed at the first use (most actions are never hashed); 0 means "not yet"
        h = self._h
        if not h:
            h = hash((self.op, self.unit, self.mb, self.payload, self.peer, self.group, self.root, self.tag,
                      self.sub, self.waits, self.zclass, self.side))
            _set_h(self, h)
        return h

    def __reduce__(self) -> tuple:
        # rebuilt through __init__: the cached hash depends on the process's string-hash seed,
        # so an unpickled copy (e.g. a program sent to spawned ranks) must compute its own
        return (Action, (self.op, self.unit, self.mb, self.payload, self.peer, self.group, self.root, self.tag,
                         self.sub, self.waits, self.zclass, self.side))

    def _check(self) -> None:
        error = fields_error(self)   # each op's fields: pipert.ir.semantics (TABLE[op].fields)
        if error is not None:
            raise ScheduleFormatError(f"action {self.op.value}: {error}")

    # --- derived views -------------------------------------------------------------
    @property
    def is_compute(self) -> bool:
        return self.op in COMPUTE_OPS

    @property
    def is_comm(self) -> bool:
        return self.op in P2P_OPS or self.op in COLLECTIVE_OPS

    @property
    def key(self) -> tuple:
        """What a SEND and its RECV must agree on."""
        return (self.payload, self.unit, self.mb, self.tag)

    def __str__(self) -> str:
        parts = [self.op.value]
        if self.op is Op.WAIT:
            parts.append(self.waits.value)
        if self.payload is not None:
            parts.append(self.payload.value)
        if self.unit is not None:
            parts.append(f"u{self.unit}")
        if self.zclass is not None:
            parts.append(f"z{self.zclass}")
        if self.side is not None:
            parts.append(self.side)
        if self.mb:
            parts.append("m" + ",".join(map(str, self.mb)))
        if self.sub is not None:
            parts.append(f"s{self.sub[0]}/{self.sub[1]}")
        if self.peer is not None:
            send_like = self.op is Op.SEND or self.waits is Op.SEND
            parts.append(("->" if send_like else "<-") + str(self.peer))
        if self.group:
            parts.append("@" + ",".join(map(str, self.group)))
        if self.root is not None:
            parts.append(f"^{self.root}")
        if self.tag:
            parts.append(f"#{self.tag}")
        return " ".join(parts)



def _plain(op: Op, unit: int | None, mb: tuple, payload: Payload | None, peer: int | None, group: tuple,
           root: int | None, sub: tuple | None, waits: Op | None) -> bool:
    """The common valid shapes, accepted without the full check (fields as _check requires, and
    zclass and side unset: the caller's condition): a compute of a unit's micro-batches; a SEND or
    RECV of an activation or gradient (with micro-batches) or of a unit's weights or weight
    gradient; a WAIT for a SEND or RECV of those; a BROADCAST or REDUCE of weights or weight
    gradients with its root in its group; a FREE of weights or weight gradients."""
    if sub is not None or unit is None or unit < 0 or (mb and min(mb) < 0):
        return False
    if waits is not None:
        return op is _WAIT and type(waits) is Op and waits in P2P_OPS and peer is not None and not group and \
            root is None and payload in _COMM_PAYLOADS
    if group:
        return op in ROOTED_OPS and root is not None and root in group and peer is None and payload in _UNIT_PAYLOADS
    if root is not None:
        return False
    if op in UNIT_COMPUTE_OPS:
        return bool(mb) and payload is None and peer is None
    if op in P2P_OPS:
        return peer is not None and (payload in _UNIT_PAYLOADS or bool(mb) and payload in _COMM_PAYLOADS)
    return op is _FREE and peer is None and payload in _UNIT_PAYLOADS


_WAIT, _FREE = Op.WAIT, Op.FREE
_UNIT_PAYLOADS = frozenset({Payload.WEIGHT, Payload.WGRAD})
_COMM_PAYLOADS = frozenset({Payload.ACT, Payload.GRAD, Payload.WEIGHT, Payload.WGRAD})


(_set_op, _set_unit, _set_mb, _set_payload, _set_peer, _set_group, _set_root, _set_tag, _set_sub, _set_waits,
 _set_zclass, _set_side, _set_h) = (Action.__dict__[f.name].__set__ for f in fields(Action))


class _Draft:
    """An Action being built: Action's slots, in its order, without the frozen class's guard."""

    __slots__ = Action.__slots__


def message_action(op: Op, unit: int, mb: tuple[int, ...], payload: Payload | None, peer: int | None) -> Action:
    """``Action(op, unit, mb, payload, peer)`` without the checks, for lowering, whose inputs
    already form a valid SEND/RECV (op in P2P_OPS, a unit, a compute's micro-batch tuple, a
    Payload, a peer), three times faster (schedules hold 1e5+ messages): every field is set as an
    attribute of a _Draft, which then becomes the Action by class assignment, which CPython allows
    between classes of the same slots (the same memory layout)."""
    a = _Draft()
    a.op = op
    a.unit = unit
    a.mb = mb
    a.payload = payload
    a.peer = peer
    a.group = ()
    a.root = None
    a.tag = 0
    a.sub = None
    a.waits = None
    a.zclass = None
    a.side = None
    a._h = 0
    a.__class__ = Action
    return a


_message_action_py = message_action
if native.SIMC is not None:   # the same Action, built in C
    native.SIMC.bind_action(Action, tuple(f.name for f in fields(Action)))
    message_action = native.SIMC.message_action  # noqa: F811


def compute_action(op: Op, unit: int, mb: tuple[int, ...]) -> Action:
    """``Action(op, unit, mb)`` without the checks, for generators whose inputs already form a
    valid compute (op in F, B, D, W, RECOMPUTE, a unit >= 0, a tuple of micro-batches >= 0); built
    as message_action builds, without a payload or peer."""
    return message_action(op, unit, mb, None, None)


if native.SIMC is not None:   # message_action in C with three arguments: payload and peer None
    compute_action = native.SIMC.message_action  # noqa: F811


def _ints(text: str, token: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise ScheduleFormatError(f"bad number list in token {token!r}") from None


def parse_action(text: str) -> Action:
    """Parse the text form of an action; raises ScheduleFormatError naming the bad token."""
    tokens = text.split()
    if not tokens:
        raise ScheduleFormatError("empty action text")
    try:
        op = Op(tokens[0])
    except ValueError:
        allowed = ", ".join(o.value for o in Op)
        raise ScheduleFormatError(f"unknown op {tokens[0]!r} in {text!r}; allowed: {allowed}") from None
    kw: dict = {"op": op}
    rest = tokens[1:]
    if op is Op.WAIT:
        if not rest or rest[0] not in ("SEND", "RECV"):
            raise ScheduleFormatError(f"WAIT must be followed by SEND or RECV in {text!r}")
        kw["waits"] = Op(rest[0])
        rest = rest[1:]
    for tok in rest:
        try:
            if tok in ("fwd", "bwd"):
                kw["side"] = tok
            elif tok in Payload._value2member_map_:
                kw["payload"] = Payload(tok)
            elif tok[0] == "u":
                kw["unit"] = int(tok[1:])
            elif tok[0] == "z":
                kw["zclass"] = int(tok[1:])
            elif tok[0] == "m":
                kw["mb"] = _ints(tok[1:], tok)
            elif tok[0] == "s" and "/" in tok:
                i, n = tok[1:].split("/")
                kw["sub"] = (int(i), int(n))
            elif tok.startswith("->") or tok.startswith("<-"):
                send_like = op is Op.SEND or kw.get("waits") is Op.SEND
                if (tok[0] == "-") != send_like:
                    raise ScheduleFormatError(f"arrow {tok!r} in {text!r}: use ->PEER for SEND, <-PEER for RECV")
                kw["peer"] = int(tok[2:])
            elif tok[0] == "@":
                kw["group"] = _ints(tok[1:], tok)
            elif tok[0] == "^":
                kw["root"] = int(tok[1:])
            elif tok[0] == "#":
                kw["tag"] = int(tok[1:])
            else:
                raise ScheduleFormatError(f"unknown token {tok!r} in {text!r}")
        except (ValueError, IndexError) as e:
            if isinstance(e, ScheduleFormatError):
                raise
            raise ScheduleFormatError(f"bad token {tok!r} in {text!r}") from None
    return Action(**kw)
