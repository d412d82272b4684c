"""PipeMesh's pipeline-aware selective recomputation (section IV-B, Eqs. 7-9) and a brute force.

Each operation ``k`` of a chunk (in topological order) keeps ``size`` bytes per pass for its
backward unless it is recomputed, which costs ``time`` once per pass; ``j = M B + P - 1``
passes lie on the critical path (compute plus bubble), so recomputing costs ``j * time``.
``dp_time(o)`` is T_DP^crit(F(o)), the exposed DP time of the best buffer size that fits when
each pass stores ``o`` bytes of these activations, or ``None`` where none fits. Feasibility
is upward closed (storing more never makes a plan fit), which the table relies on.

L[0][0] = dp_time(0)                                               (7, with F(0) for F(B))
L[k][o] = min(L[k-1][o] + j u_k, L[k-1][o - o_k] + I(o - o_k, o))  (8)
I(o', o) = dp_time(o) - dp_time(o')                                (9)

The paper starts from T_DP^crit(B), which assumes q = B fits when everything is recomputed;
starting from dp_time(0) changes every L[K][o] by the same constant, so the argmin is the same.
Sizes are integers; the table runs on their greatest common divisor.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from itertools import product
from typing import Callable, Optional, Sequence

__all__ = ["OpCost", "Recompute", "recompute_dp", "recompute_brute"]

DpTime = Callable[[int], Optional[float]]


@dataclass(frozen=True)
class OpCost:
    """One operation of a chunk as the recomputation planner sees it."""

    name: str
    """Label, e.g. ``"layer3.gelu"``."""
    size: int
    """Bytes its output keeps per pass for the backward when it is not recomputed."""
    time: float
    """Seconds (or the unit of the other times) to recompute it for one pass."""

    def __post_init__(self) -> None:
        if isinstance(self.size, bool) or not isinstance(self.size, numbers.Integral) or self.size < 0:
            raise ValueError(f"OpCost {self.name!r}: size={self.size!r} must be an integer >= 0 (bytes)")
        if not (isinstance(self.time, numbers.Real) and 0 <= self.time < math.inf):
            raise ValueError(f"OpCost {self.name!r}: time={self.time!r} must be a finite number >= 0")


@dataclass(frozen=True)
class Recompute:
    """A recomputation choice and its cost."""

    recomputed: tuple[bool, ...]
    """Per operation: recomputed (True) or stored."""
    stored: int
    """Bytes stored per pass: the sizes of the operations not recomputed."""
    recompute_time: float
    """Per pass: the sum of the recomputed operations' times."""
    dp_time: float
    """dp_time(stored)."""
    objective: float
    """dp_time + j * recompute_time (L[K][o*])."""


def _check(ops: Sequence[OpCost], j: float) -> None:
    if not all(isinstance(o, OpCost) for o in ops):
        raise ValueError("ops must be OpCost values")
    if not (isinstance(j, numbers.Real) and j >= 0):
        raise ValueError(f"j={j!r}: must be >= 0 (M*B + P - 1)")


def _result(ops: Sequence[OpCost], rec: tuple[bool, ...], dp_time: DpTime, j: float) -> Recompute:
    stored = sum(o.size for o, r in zip(ops, rec) if not r)
    t = dp_time(stored)
    if t is None:
        raise AssertionError("a chosen recomputation must fit")
    rt = sum(o.time for o, r in zip(ops, rec) if r)
    return Recompute(rec, stored, rt, t, t + j * rt)


def recompute_dp(ops: Sequence[OpCost], dp_time: DpTime, j: float) -> Recompute | None:
    """The recomputation set minimising ``dp_time(stored) + j * recompute_time`` by Eqs. 7-9;
    None when nothing fits even with every operation recomputed. Ties: the smaller ``stored``."""
    _check(ops, j)
    t0 = dp_time(0)
    if t0 is None:
        return None
    g = math.gcd(*[o.size for o in ops if o.size]) if any(o.size for o in ops) else 1
    steps = [o.size // g for o in ops]
    # Largest grid point that fits; feasibility is upward closed, so stop at the first miss.
    n = 0
    while n < sum(steps) and dp_time((n + 1) * g) is not None:
        n += 1
    T = [dp_time(o * g) for o in range(n + 1)]
    inf = math.inf
    L = [t0] + [inf] * n
    store: list[list[bool]] = []
    for op, s in zip(ops, steps):
        new = [v + j * op.time for v in L]
        keep = [False] * (n + 1)
        for o in range(s, n + 1):
            prev = L[o - s]
            if prev < inf:
                v = prev + (T[o] - T[o - s])
                if v < new[o]:
                    new[o], keep[o] = v, True
        L = new
        store.append(keep)
    best = min(range(n + 1), key=lambda o: (L[o], o))
    rec, o = [], best
    for k in range(len(ops) - 1, -1, -1):
        kept = store[k][o]
        rec.append(not kept)
        if kept:
            o -= steps[k]
    return _result(ops, tuple(reversed(rec)), dp_time, j)


def recompute_brute(ops: Sequence[OpCost], dp_time: DpTime, j: float) -> Recompute | None:
    """Every subset (2^K of them): the reference for ``recompute_dp``."""
    _check(ops, j)
    best: Recompute | None = None
    for rec in product((False, True), repeat=len(ops)):
        stored = sum(o.size for o, r in zip(ops, rec) if not r)
        if dp_time(stored) is None:
            continue
        r = _result(ops, rec, dp_time, j)
        if best is None or (r.objective, r.stored) < (best.objective, best.stored):
            best = r
    return best
