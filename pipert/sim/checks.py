"""Rules checked after pass 1 has walked every rank: matching completeness, compute
completeness, and whether a missing input is produced later or never."""
from __future__ import annotations

import bisect
from typing import TYPE_CHECKING

from ..ir.action import Action, Op
from ..ir.phases import forward_only_program
from ..ir.semantics import Semantics
from .keys import describe_key, vkey

if TYPE_CHECKING:
    from .values import Builder

__all__ = ["finish_checks", "produced_keys"]


def produced_keys(sem: Semantics, a: Action, rank: int) -> list[int]:
    """Value keys action ``a`` may write on ``rank`` (an F: with or without a RECOMPUTE after it;
    slow, used to explain errors)."""
    if a.unit is not None and a.unit >= sem.num_units:
        return []
    return [vkey(e.kind, e.unit, m, e.shard, e.host) for keeps in ((False, True) if a.op is Op.F else (False,))
            for e in sem.plan(a, rank, keeps).writes for m in (a.mb if e.slots is None else e.slots)]


_D_BIT = 1   # a bwd entry's low bit: the backward is a D (Builder.mark_done)


def finish_checks(b: "Builder") -> None:
    _unmatched(b)
    _collectives(b)
    _completeness(b)
    _classify_missing(b)


def _unmatched(b: "Builder") -> None:
    for lk, ls in b.link_state.items():
        ns, nr = ls[0], ls[1]
        if ns == nr:
            continue
        src, dst = divmod(lk, b.P)
        what = f"link {src}->{dst} carries {ns} SEND(s) and {nr} RECV(s)"
        for first in ls[3][min(ns, nr):]:
            a, r, i = first
            if a.op is Op.SEND:
                b.error(r, i, a, "unmatched_send", f"no matching RECV on rank {dst}: {what}")
            else:
                b.error(r, i, a, "unmatched_recv", f"no matching SEND on rank {src}: {what}")


def _collectives(b: "Builder") -> None:
    for n, members in b.coll_members.items():
        fa, fr, fi = members[0]
        posted = {r for _, r, _ in members}
        absent = sorted(set(fa.group) - posted)
        if absent:
            b.error(fr, fi, fa, "collective", f"collective is not posted by rank(s) {absent} of its group "
                    f"{list(fa.group)} (each member must post the same k-th collective of the group)")


def _completeness(b: "Builder") -> None:
    fwd, bwd, wdone = b.fwd, b.bwd, b.wdone
    whole = b.U * b.M
    if len(fwd) == whole and len(bwd) == whole and not any(map(_D_BIT.__and__, bwd.values())):
        return   # the tables hold (unit, micro-batch) pairs in range only: every F and B is there, no D
    if not bwd and not wdone and forward_only_program(b.s):
        bwd = {k: 0 for k in fwd}  # an evaluation program: every F and nothing of a backward
    for u in range(b.U):
        for m in range(b.M):
            fk = u << 32 | m
            f = fwd.get(fk)
            if f is None:
                try:
                    r = b.s.placement.rank(u, m)
                except (IndexError, TypeError):
                    r = 0
                b.error(r, -1, None, "missing_compute", f"unit {u}, micro-batch {m} has no F on any rank")
                continue
            bk = bwd.get(fk)
            r, i = f >> 32, f & 0xFFFFFFFF
            if bk is None:
                b.error(r, i, b.s.actions[r][i], "missing_compute", f"micro-batch {m} of unit {u} has no B or D")
            elif bk & 1 and fk not in wdone:
                loc = bk >> 1
                r, i = loc >> 32, loc & 0xFFFFFFFF
                b.error(r, i, b.s.actions[r][i], "missing_compute", f"micro-batch {m} of unit {u} has a D but no W")


def _released_keys(sem: Semantics, a: Action, rank: int) -> list[int]:
    """Value keys action ``a`` ends on ``rank`` (reads that release, frees; slow, explains errors)."""
    if a.unit is not None and a.unit >= sem.num_units:
        return []
    plan = sem.plan(a, rank)
    return [vkey(e.kind, e.unit, m, e.shard, e.host) for e in plan.reads + plan.frees
            if e.release or e in plan.frees for m in (a.mb if e.slots is None else e.slots)]


def _classify_missing(b: "Builder") -> None:
    """Name what became of each missing input: produced later, ended earlier (by the last action
    before the reader that releases it), or never produced."""
    by_rank: dict[int, tuple[dict[int, list[int]], dict[int, list[int]]]] = {}
    for r, i, key in b.missing:
        got = by_rank.get(r)
        if got is None:
            got = by_rank[r] = ({}, {})
            for j, a in enumerate(b.s.actions[r]):
                for k in produced_keys(b.sem, a, r):
                    got[0].setdefault(k, []).append(j)
                for k in _released_keys(b.sem, a, r):
                    got[1].setdefault(k, []).append(j)
        produced, released = got[0].get(key, []), got[1].get(key, [])
        k = bisect.bisect_right(produced, i)
        a = b.s.actions[r][i]
        ended = [j for j in released if (produced[k - 1] if k else -1) <= j < i]
        if k and ended:
            j = ended[-1]
            b.error(r, i, a, "missing_input", f"input {describe_key(key)} was produced at action {produced[k - 1]} "
                    f"and ended at action {j} ({b.s.actions[r][j]}) before this action reads it")
        elif k < len(produced):
            b.error(r, i, a, "input_later", f"input {describe_key(key)} is produced later, at action {produced[k]}")
        else:
            b.error(r, i, a, "missing_input", f"input {describe_key(key)} is never produced on rank {r}")
