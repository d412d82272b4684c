"""Lowering for CrossPipe: compute orders + receive positions -> a full pipert Schedule.

Differs from :func:`pipert.ir.lower` in where the transfers stand in each list
(docs/semantics.md, "The three queues and time": a SEND or RECV is posted when the
compute before it in the list has finished; a transfer starts at max(SEND posted, value
ready, RECV posted, its directed link free)):

- SENDs follow ``send_order`` (default: the producers' order); each stands right after
  its producer (the last sub-block of it, if split) and after the previous SEND, before
  the slot's RECVs. With the default it is posted when its value is ready, so it never
  delays a transfer, and the producer's output buffer counts only up to it. The models
  keep every directed link's transfers in producer order, so the default is their order.
- RECVs stand where ``recv_at`` puts them: (key, number of computes before it). The
  models place a RECV by their own timing (:func:`place_receives`): right after the last
  compute of the receiver that ends no later than the transfer's start s_k, i.e. before
  the first compute ending after s_k. Its posting time is then <= s_k, so it never delays
  the transfer either, and its buffer counts from there (docs/semantics.md, "Memory")
  until its consumer ran -- the list-order accounting the greedy and the solver use.

``OPT u`` ends the list of unit u's owner. The result validates like any schedule.
"""
from __future__ import annotations

from bisect import bisect_right
from typing import Any, Mapping, Sequence

from ...ir import Action, Op, Payload, Placement, Schedule
from ...ir.semantics import BOUNDARY_OPS
from .model import CrossPipeProblem

__all__ = ["lower_crosspipe", "place_receives", "message_of", "consumer_of", "Key", "RecvAt"]

Key = tuple  # ("act" | "grad", unit, mb)
RecvAt = list[list[tuple[Key, int]]]
"""Per rank, its RECVs in list order as (message key, number of computes before it)."""


def message_of(problem: CrossPipeProblem, a: Action) -> Key | None:
    """The cross-rank message a compute sends once it (its last sub-block) has run."""
    if a.op not in BOUNDARY_OPS or (a.sub is not None and a.sub[0] != a.sub[1] - 1):
        return None
    u, m, ranks = a.unit, a.mb[0], problem.unit_ranks
    if a.op is Op.F and u < problem.units - 1 and ranks[u + 1] != ranks[u]:
        return ("act", u, m)
    if a.op is not Op.F and u > 0 and ranks[u - 1] != ranks[u]:
        return ("grad", u - 1, m)
    return None


def consumer_of(problem: CrossPipeProblem, a: Action) -> Key | None:
    """The cross-rank message a compute (its first sub-block) consumes."""
    if a.op not in BOUNDARY_OPS or (a.sub is not None and a.sub[0] != 0):
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


def place_receives(problem: CrossPipeProblem, orders: Sequence[Sequence[Action]], ends: Sequence[Sequence[float]],
                   starts: Mapping[Key, float]) -> RecvAt:
    """Receive positions by the model's timing (module doc): RECV k goes after every compute
    of its receiver with end <= s_k (``ends[r][i]``: end of ``orders[r][i]``, non-decreasing;
    ``starts[k]``: s_k). RECVs in one slot are ordered by (s_k, end of their producer), so
    the RECVs of one directed link follow its transfer order (per-link FIFO)."""
    prod_end: dict[Key, float] = {}
    for acts, es in zip(orders, ends):
        for a, e in zip(acts, es):
            k = message_of(problem, a)
            if k is not None:
                prod_end[k] = e
    out: RecvAt = []
    for acts, es in zip(orders, ends):
        items = []
        for a in acts:
            k = consumer_of(problem, a)
            if k is not None:
                s = starts[k]
                items.append((bisect_right(es, s), s, prod_end[k], k))
        items.sort()
        out.append([(k, n) for n, _, _, k in items])
    return out


def lower_crosspipe(problem: CrossPipeProblem, orders: Sequence[Sequence[Action]],
                    recv_at: Sequence[Sequence[tuple[Key, int]]], send_order: Sequence[Sequence[Key]] | None = None,
                    *, name: str = "crosspipe", meta: dict[str, Any] | None = None) -> Schedule:
    """Full schedule of per-rank compute ``orders`` with RECVs at ``recv_at`` (see
    :data:`RecvAt`) and SENDs in ``send_order`` (module doc)."""
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
        recvs = [k for k, _ in recv_at[r]]
        pos = [n for _, n in recv_at[r]]
        if sorted(map(str, sends)) != sorted(map(str, produced)) or \
                sorted(map(str, recvs)) != sorted(map(str, consumed)):
            raise ValueError(f"rank {r}: send/receive orders do not list exactly the rank's messages")
        if any(b < a for a, b in zip(pos, pos[1:])) or any(not 0 <= n <= consumed[k] for k, n in recv_at[r]):
            raise ValueError(f"rank {r}: receive positions must be non-decreasing and before each consumer")
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
