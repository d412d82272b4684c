"""Lowering for CrossPipe: compute orders + message orders -> a full pipert Schedule.

Differs from :func:`pipert.ir.lower` in where the transfers stand in each list:

- SENDs follow ``send_order`` (default: the producers' order); each stands after its
  producer (the last sub-block of it, if split) and after the previous SEND;
- RECVs follow ``recv_order``, the order in which the model lets messages into the rank
  (the greedy: issue order; the solver: transfer start order). A rank's receive queue
  is in order, so a RECV posted in another order than its messages are sent can hold a
  transfer back; posting in the model's order makes the simulated time the model's.
  Each RECV stands as late as it can: right before its consumer, or before the next
  RECV if that one must come earlier. A RECV posted before its consumer's turn holds
  its buffer from there on (docs/semantics.md, "Memory"); the greedy and the solver
  count that.

``OPT u`` ends the list of unit u's owner. The result validates like any schedule.
"""
from __future__ import annotations

from typing import Any, Sequence

from ...ir import Action, Op, Payload, Placement, Schedule
from .model import CrossPipeProblem

__all__ = ["lower_crosspipe", "message_of", "consumer_of"]

Key = tuple  # ("act" | "grad", unit, mb)


def message_of(problem: CrossPipeProblem, a: Action) -> Key | None:
    """The cross-rank message a compute sends once it (its last sub-block) has run."""
    if a.op not in (Op.F, Op.D, Op.B) or (a.sub is not None and a.sub[0] != a.sub[1] - 1):
        return None
    u, m, ranks = a.unit, a.mb[0], problem.unit_ranks
    if a.op is Op.F and u < problem.units - 1 and ranks[u + 1] != ranks[u]:
        return ("act", u, m)
    if a.op is not Op.F and u > 0 and ranks[u - 1] != ranks[u]:
        return ("grad", u - 1, m)
    return None


def consumer_of(problem: CrossPipeProblem, a: Action) -> Key | None:
    """The cross-rank message a compute (its first sub-block) consumes."""
    if a.op not in (Op.F, Op.D, Op.B) or (a.sub is not None and a.sub[0] != 0):
        return None
    u, m, ranks = a.unit, a.mb[0], problem.unit_ranks
    if a.op is Op.F and u > 0 and ranks[u - 1] != ranks[u]:
        return ("act", u - 1, m)
    if a.op is not Op.F and u < problem.units - 1 and ranks[u + 1] != ranks[u]:
        return ("grad", u, m)
    return None


def _comm(problem: CrossPipeProblem, key: Key, send: bool) -> Action:
    kind, u, m = key
    src, dst = (problem.unit_ranks[u], problem.unit_ranks[u + 1]) if kind == "act" else \
        (problem.unit_ranks[u + 1], problem.unit_ranks[u])
    return Action(Op.SEND if send else Op.RECV, unit=u, mb=(m,),
                  payload=Payload.ACT if kind == "act" else Payload.GRAD, peer=dst if send else src)


def lower_crosspipe(problem: CrossPipeProblem, orders: Sequence[Sequence[Action]],
                    recv_order: Sequence[Sequence[Key]], send_order: Sequence[Sequence[Key]] | None = None,
                    *, name: str = "crosspipe", meta: dict[str, Any] | None = None) -> Schedule:
    """Full schedule of per-rank compute ``orders`` with transfers in the given orders."""
    P = problem.stages
    out: list[list[Action]] = []
    for r in range(P):
        acts = list(orders[r])
        produced = {message_of(problem, a): i for i, a in enumerate(acts)}
        consumed = {consumer_of(problem, a): i for i, a in enumerate(acts)}
        produced.pop(None, None)
        consumed.pop(None, None)
        sends = list(send_order[r]) if send_order is not None else \
            [k for k in (message_of(problem, a) for a in acts) if k is not None]
        recvs = list(recv_order[r])
        if sorted(map(str, sends)) != sorted(map(str, produced)) or sorted(map(str, recvs)) != sorted(map(str, consumed)):
            raise ValueError(f"rank {r}: send/receive orders do not list exactly the rank's messages")
        # RECV k goes before compute pos[k] = min over j >= k of consumer position
        pos = [0] * len(recvs)
        nxt = len(acts)
        for k in range(len(recvs) - 1, -1, -1):
            nxt = min(nxt, consumed[recvs[k]])
            pos[k] = nxt
        # SEND k goes after compute after[k] = max over j <= k of producer position
        after = []
        last = -1
        for key in sends:
            last = max(last, produced[key])
            after.append(last)
        prog: list[Action] = []
        ri = si = 0
        for i, a in enumerate(acts):
            while ri < len(recvs) and pos[ri] == i:
                prog.append(_comm(problem, recvs[ri], send=False))
                ri += 1
            prog.append(a)
            while si < len(sends) and after[si] == i:
                prog.append(_comm(problem, sends[si], send=True))
                si += 1
        prog += [Action(Op.OPT, unit=u) for u in problem.units_of(r)]
        out.append(prog)
    info = {"family": name, "stages": P, "chunks": problem.chunks, "split_backward": True,
            "pattern": problem.pattern, **(meta or {})}
    return Schedule(name, P, problem.units, problem.microbatches, Placement.by_unit(list(problem.unit_ranks)),
                    out, info)
