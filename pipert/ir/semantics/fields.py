"""Which fields an action of each op sets (:attr:`.table.OpSpec.fields`), checked when an
Action is made; the rules that depend on the placement (ZeRO classes and sides) are
:meth:`.rules.Semantics.field_error`'s."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..ops import Op, Payload
from .opsets import P2P_OPS
from .table import TABLE

if TYPE_CHECKING:
    from ..action import Action

__all__ = ["fields_error", "PER_MB_PAYLOADS"]

PER_MB_PAYLOADS = frozenset({Payload.ACT, Payload.GRAD, Payload.STASH})
"""Payloads with one value per micro-batch: their messages and memory ops name micro-batches."""

_NAMES = {"unit": "a unit", "mb": "a micro-batch", "payload": "a payload", "peer": "a peer", "group": "a group"}
_UNIT_PAYLOADS = frozenset({Payload.WEIGHT, Payload.WGRAD})


def _join(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def fields_error(a: "Action") -> str | None:
    """Why action ``a`` sets a field its op does not take or misses one it needs (None: fine)."""
    op = a.op
    f = TABLE[op].fields
    if op is Op.WAIT:
        if a.waits not in P2P_OPS:
            return f"WAIT must complete a SEND or RECV, got {a.waits}"
    elif a.waits is not None:
        return "only WAIT may name an op to wait for"
    needs = [n for n in f.needs if n in _NAMES]
    if any(getattr(a, n) in (None, ()) for n in needs):
        return f"{f.noun} need {_join([_NAMES[n] for n in needs])}"
    if ("root" in f.needs) != (a.root is not None):
        return "BROADCAST and REDUCE (only) take a root"
    if a.root is not None and a.root not in a.group:
        return f"root {a.root} is not in group {a.group}"
    if a.payload is not None and a.payload not in f.payloads:
        if a.payload is Payload.STASH:
            return "payload 'stash' is only for FREE, OFFLOAD and PREFETCH"
        allowed = ", ".join(p.value for p in Payload if p in f.payloads) or "none"
        return f"{op.value} carries no payload {a.payload.value}; allowed: {allowed}"
    if a.payload in PER_MB_PAYLOADS and op is not Op.WAIT and "mb" in f.allows and not a.mb:
        return f"payload {a.payload.value} names micro-batches (m...)"
    if a.peer is not None and "peer" not in f.needs:
        return "only SEND/RECV/WAIT take a peer"
    if a.group and "group" not in f.needs:
        return "only collectives take a group"
    for name in ("unit", "mb"):
        if getattr(a, name) not in (None, ()) and name not in f.needs and name not in f.allows:
            return f"{op.value} takes no {'micro-batches' if name == 'mb' else name}"
    if a.sub is not None:
        if "sub" not in f.allows:
            return "only computes of a unit take a sub-block"
        if not (len(a.sub) == 2 and 0 <= a.sub[0] < a.sub[1]):
            return "sub-block must be (index, count) with 0 <= index < count"
    if any(m < 0 for m in a.mb) or (a.unit is not None and a.unit < 0):
        return "unit and micro-batch indices must be >= 0"
    if a.zclass is not None:
        if a.zclass not in (0, 1, 2, 3):
            return f"ZeRO class z{a.zclass} unknown; allowed: z0, z1, z2, z3"
        if "zclass" not in f.allows or a.payload not in _UNIT_PAYLOADS:
            return (f"a ZeRO class (z{a.zclass}) names part of a unit's weights or weight gradient: only messages, "
                    f"collectives and memory ops of payload weight or wgrad take one")
    if a.side is not None:
        if a.side not in ("fwd", "bwd"):
            return f"side {a.side!r} unknown; allowed: fwd, bwd"
        if "side" not in f.allows or a.payload is not Payload.WEIGHT:
            return (f"a side ({a.side}) names a gathered copy of ZeRO-3 weights: only ALLGATHER and FREE of "
                    f"payload weight take one")
    return None
