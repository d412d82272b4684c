"""Collectives in pass 1: match the k-th collective of a group across its members into one
joint node, and apply its data effects on each member.

Effects per member (``root`` only for BROADCAST/REDUCE):

| op | consumes the payload value | produces it |
|---|---|---|
| ALLREDUCE, REDUCESCATTER | every member | every member |
| ALLGATHER | nobody (each holds a shard) | every member |
| BROADCAST | the root | every other member |
| REDUCE | every member | the root |

A ``wgrad`` payload moves contribution sets: consumed sets leave their rank, the joint
node carries their union, producing members receive that union. Received ``act``/``grad``/
``weight`` buffers count as memory like received messages (weights only off their owner).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..ir.action import Action, Op, Payload
from .keys import K_COLLECTIVE, _ACT, _GRAD, _WEIGHT

if TYPE_CHECKING:
    from .effects import BuilderState

__all__ = ["collective_effects"]


def collective_effects(b: "BuilderState", a: Action, r: int, i: int) -> int:
    """Add rank r's part of collective ``a`` to the graph; returns its joint node (-1: broken)."""
    g = a.group
    if r not in g or len(set(g)) != len(g) or not all(0 <= x < b.P for x in g):
        b.error(r, i, a, "collective", f"rank {r} posts a collective over group {list(g)}, which must "
                f"contain it and name each member (a rank in 0..{b.P - 1}) once")
        return -1
    gk = tuple(sorted(g))
    ck = (gk, r)
    k = b.coll_count.get(ck, 0)
    b.coll_count[ck] = k + 1
    lst = b.coll_nodes.setdefault(gk, [])
    if k < len(lst):
        n = lst[k]
        members = b.coll_members[n]
        fa, fr, fi = members[0]
        if fa != a:
            b.error(r, i, a, "collective", f"collective #{k} of group {list(gk)} is {fa} on rank {fr} "
                    f"(action {fi}); every member must post the same collective in the same order")
        members.append((a, r, i))
    else:
        nbytes = b.cost.message_bytes(a.payload, a.unit, len(a.mb) or 1)
        d = b.links.collective(a.op.value.lower(), g, nbytes) if b.links is not None else 0.0
        n = b.node(K_COLLECTIVE, d)
        lst.append(n)
        b.coll_members[n] = [(a, r, i)]
        b.collectives.append((n, a, nbytes))
    b.chain(b.coll_q, n)

    op, root, u, pl = a.op, a.root, a.unit, a.payload
    consumes = (r == root) if op is Op.BROADCAST else op is not Op.ALLGATHER
    produces = (r != root) if op is Op.BROADCAST else (r == root if op is Op.REDUCE else True)
    if pl is Payload.WGRAD:
        if consumes:
            parts = b.wg_take(u, n)
            if parts is not None:
                b.wg_parts.setdefault(n, []).append(parts)
        if produces:
            b.wg_parts.setdefault(n, [])
            b.wg_state(u, r)[1].append(n)
        return n
    if pl is Payload.WEIGHT:
        keys, size = [(u << 35) | _WEIGHT], b.sz["weight"][u]
        owned = b.owner[u] == r
    else:
        kd = _ACT if pl is Payload.ACT else _GRAD
        keys, size = [((u << 32 | m) << 3) | kd for m in a.mb], b.sz[pl.value][u]
        owned = False
    for key in keys:
        if consumes:
            b.use(r, i, key, n, False)
        if produces:
            b.have[key] = n
            if not owned and key not in b.live:
                b.live[key] = size
                b.mem_delta += size
    return n
