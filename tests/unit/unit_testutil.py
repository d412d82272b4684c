"""Helpers shared by the unit tests (imported as ``from unit_testutil import ...``: pytest's
default import mode puts this folder on sys.path).

- ``one_f_one_b`` and ``gpipe``: classic schedules built inline, independent of the
  generators in ``pipert.schedules``, so simulator and validator tests do not rest on them.
"""
from __future__ import annotations

from pipert.ir import Action, Op, Placement, Schedule, lower


def one_f_one_b_order(P: int, M: int) -> list[list[Action]]:
    """Per-rank compute order of 1F1B (unit i on rank i): warm-up forwards, then one forward
    one backward, then the remaining backwards."""
    comp = []
    for i in range(P):
        nw = min(P - 1 - i, M)
        acts = [Action(Op.F, unit=i, mb=(m,)) for m in range(nw)]
        for j in range(M - nw):
            acts += [Action(Op.F, unit=i, mb=(nw + j,)), Action(Op.B, unit=i, mb=(j,))]
        acts += [Action(Op.B, unit=i, mb=(m,)) for m in range(M - nw, M)]
        comp.append(acts)
    return comp


def one_f_one_b(P: int, M: int) -> Schedule:
    return lower("1f1b", P, P, M, Placement.by_unit(list(range(P))), one_f_one_b_order(P, M))


def gpipe(P: int, M: int) -> Schedule:
    comp = [[Action(Op.F, unit=i, mb=(m,)) for m in range(M)] + [Action(Op.B, unit=i, mb=(m,)) for m in range(M)]
            for i in range(P)]
    return lower("gpipe", P, P, M, Placement.by_unit(list(range(P))), comp)


def token_batch(b=2, s=8, seed=0):
    """Random byte tokens and targets [b, s], seeded."""
    import torch
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (b, s), generator=g), torch.randint(0, 256, (b, s), generator=g)


def run_chain(units, tokens, targets):
    """The loss of ``units`` applied in order (the last one takes the targets)."""
    x = tokens
    for u in units[:-1]:
        x = u(x)
    return units[-1](x, targets)
