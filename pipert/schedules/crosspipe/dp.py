"""CrossPipe's data-parallel overlap operations (paper §4.1 "DP Overlap Modeling", Fig. 7).

The replication policy ``crosspipe-overlap`` (:mod:`pipert.schedules.data_parallel`), the default
of the three CrossPipe families: a unit's gradient collective (``ALLREDUCE wgrad u``, or
``REDUCESCATTER`` under ZeRO 1/2) stands right after the rank's last compute that adds to that
unit's weight gradient -- the W (or B) of its last micro-batch --, so it runs on the group queue
while the rank's remaining backward (its other chunks' D and W) computes; the optimizer steps and
the ZeRO-1/2 weight gathers stay where ``at-opt`` puts them, at the end of the list. With one
unit per rank (UD) that is ``at-opt``'s program; with Wave's or Loop's later chunks it overlaps.
ZeRO-3's gathers (of the copy forward computes read) all open the rank's list, in the order of
their units' first use, so a later chunk's gather runs while the first chunk computes; each unit's
first F waits for its own (``CrossPipeProblem.gather_release``).

The collectives are the IR's own ops, so validator, simulator, emulator and executor read them as
every other replicated schedule's (``pipert.ir.semantics``); the simulator prices each on the
links its replica group spans (``Links.collective``: a group split over two datacenters pays the
inter-DC ring, ``2 alpha + b / B`` for an all-reduce of b bytes between two members).
"""
from __future__ import annotations

from ...ir import Action, Op, Payload
from ...ir.semantics import LOCAL_WGRAD_OPS
from ..data_parallel import Replication, at_opt, register_policy

__all__ = ["overlap_reductions", "FAMILIES"]

FAMILIES = ("crosspipe-greedy", "crosspipe-wave", "crosspipe-optimal")

_REDUCES = (Op.ALLREDUCE, Op.REDUCESCATTER)


def overlap_reductions(rep: Replication, r: int, d: int) -> list[Action]:
    """Replica d's program of base rank r: ``at-opt``'s, each gradient reduction moved up to
    right after the last compute writing its unit's weight gradient (module doc)."""
    prog = at_opt(rep, r, d)
    reduces = [a for a in prog if a.op in _REDUCES and a.payload is Payload.WGRAD]
    rest = [a for a in prog if not (a.op in _REDUCES and a.payload is Payload.WGRAD)]
    last = {a.unit: i for i, a in enumerate(rest) if a.op in LOCAL_WGRAD_OPS}
    after: dict[int, list[Action]] = {}
    for a in reduces:
        after.setdefault(last[a.unit], []).append(a)
    out: list[Action] = []
    for i, a in enumerate(rest):
        out.append(a)
        out += after.get(i, [])
    first_opt = next((i for i, a in enumerate(out) if a.op is Op.OPT), len(out))
    early = {i for i, a in enumerate(out[:first_opt])
             if a.op is Op.ALLGATHER and a.payload is Payload.WEIGHT and a.side != "bwd"}
    return [out[i] for i in sorted(early)] + [a for i, a in enumerate(out) if i not in early]


register_policy("crosspipe-overlap", overlap_reductions, FAMILIES)
