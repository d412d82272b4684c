"""Lowering: from placement + per-rank compute order to a full program with transfers.

Activation edges: whenever unit u and unit u+1 of one micro-batch run on different ranks,
the producer rank gets ``SEND act u m ->dst`` right after F(u, m) and the consumer gets
``RECV act u m <-src`` right before F(u+1, m); gradients flow the same way backwards
(``grad u`` is the gradient w.r.t. the output of unit u, produced by B/D of unit u+1).

Weight edges (``weights=True``): a rank that computes unit u without owning it receives
``weight u`` from the owner before its first use and returns its ``wgrad u`` after its
last backward of u; the owner sends at the start and receives before ``OPT u``. Weight-
passing generators that route weights through rings or groups emit transfers themselves.

A compute split into sub-blocks (``sub=(i, n)``) receives before its first piece and sends
after its last. The position of a RECV in the list fixes its order in the rank's receive queue; it is
posted as soon as the queue reaches it, independent of the compute queue.
"""
from __future__ import annotations

import functools
import itertools
from operator import attrgetter

from .. import native
from .action import Action, Op, Payload, message_action
from .schedule import Placement, Schedule
from .semantics import BOUNDARY_OPS, LOCAL_WGRAD_OPS, TABLE, Queue, Semantics, Value

__all__ = ["lower", "add_optimizer_steps", "order_recvs_by_send"]


def _rank_of(placement: Placement, unit: int, mbs: tuple[int, ...]) -> int:
    if len(mbs) == 1:
        return placement.rank(unit, mbs[0])
    ranks = {placement.rank(unit, m) for m in mbs}
    if len(ranks) != 1:
        raise ValueError(f"unit {unit} of folded micro-batches {mbs} is placed on several ranks {sorted(ranks)}")
    return ranks.pop()


def add_optimizer_steps(compute: list[list[Action]], placement: Placement) -> list[list[Action]]:
    """Append ``OPT u`` on each unit's weight owner after its last compute action."""
    out = [list(c) for c in compute]
    for u, owner in enumerate(placement.weight_owner):
        out[owner].append(Action(Op.OPT, unit=u))
    return out


def _cross_rank_unit(kind: Value, unit: int, reading: bool) -> int:
    """The unit whose compute writes (``reading``: the reader needs it from) or reads value
    ``kind`` of ``unit``, from the op table: ACT u is written by F u and read by F u+1; GRAD u is
    written by the backward of u+1 and read by the backward of u."""
    return unit - _cross_du(kind, reading)


@functools.cache
def _cross_du(kind: Value, reading: bool) -> int:
    for op in sorted(BOUNDARY_OPS):
        refs = TABLE[op].writes if reading else TABLE[op].reads
        for ref in refs:
            if ref.value is kind:
                return ref.du
    raise ValueError(f"no compute op {'writes' if reading else 'reads'} {kind.name}")


def lower(name: str, num_ranks: int, num_units: int, num_microbatches: int, placement: Placement,
          compute: list[list[Action]], meta: dict | None = None, weights: bool = False,
          order_recvs: bool = True, post_ahead: int = 1) -> Schedule:
    """Insert the SEND/RECV actions that ``placement`` implies into per-rank compute orders.

    A value a compute reads (at its first sub-block) that another rank writes gets a RECV right
    before it; a value it writes (at its last sub-block) that another rank reads gets a SEND right
    after it (what reads and writes what: ``pipert.ir.semantics.TABLE``). With ``order_recvs``
    (the default) every link's RECVs are then put in its SEND order
    (:func:`order_recvs_by_send`), as FIFO matching requires, and activation/gradient receives
    are posted ``post_ahead`` computes early (:func:`pipert.ir.passes.post_receives_early`).

    The common case is lowered in one pass: without weight transfers, with every listed action on
    the compute queue and ``post_ahead == 1``, each compute's receives are placed before the
    previous compute as they are made. That is the two passes' result whenever every link is
    then in SEND order (which posting early never changes: it keeps each link's receives in
    order) and no compute receives twice from one rank (whose tie the pass breaks by position);
    otherwise the passes run.
    """
    build = functools.partial(_programs, num_ranks, num_units, placement, compute, weights)
    if order_recvs and post_ahead == 1 and not weights and _on_compute_queue(compute, placement):
        links: dict[tuple[int, int], tuple[list, list]] = {}
        out = build(True, links)
        if out is not None and (_same_order(links) or
                                all(_in_send_order(acts, sent) for acts, sent in zip(out, _sent_index(out)))):
            return Schedule(name, num_ranks, num_units, num_microbatches, placement, out, dict(meta or {}))
    sched = Schedule(name, num_ranks, num_units, num_microbatches, placement, build(False), dict(meta or {}))
    if not order_recvs:
        return sched
    from .passes import post_receives_early
    return post_receives_early(order_recvs_by_send(sched), post_ahead)


def _on_compute_queue(compute: list[list[Action]], placement: Placement) -> bool:
    sem = Semantics(0, placement)
    return all(sem.queue(op) is Queue.COMPUTE for op in set(map(_OP, itertools.chain.from_iterable(compute))))


def _programs(num_ranks: int, num_units: int, placement: Placement, compute: list[list[Action]], weights: bool,
              ahead: bool, links: dict | None = None) -> list[list[Action]] | None:
    """Per-rank programs (see :func:`lower`); ``ahead``: each compute's receives before the previous
    compute (None when a compute receives twice from one rank). ``links`` (with ``ahead``) gets,
    per directed link (src, dst), the messages it made as (payload, unit, micro-batches) in two
    lists: the SENDs in src's program order, the RECVs in dst's (each compute's receives go
    before the previous compute, after every earlier receive: the order they are made in)."""
    out: list[list[Action]] = [[] for _ in range(num_ranks)]
    sem = Semantics(num_units, placement)
    made = links if links is not None else {}
    cross: dict[tuple, tuple] = {}
    unit_rank = placement.ranks if placement.kind == "unit" else None   # the rank depends on the unit only
    OPT, SEND, RECV = Op.OPT, Op.SEND, Op.RECV   # locals: Op.X is an attribute lookup per use
    if weights:
        first_use, last_bwd = _weight_uses(compute, placement)
        for (r, u) in sorted(first_use):
            out[placement.weight_owner[u]].append(Action(Op.SEND, unit=u, payload=Payload.WEIGHT, peer=r))
    simc = native.SIMC if not weights and unit_rank is not None else None
    for r, acts in enumerate(compute):
        prog = out[r]
        if simc is not None and type(acts) is list:   # this loop in C (pipert._simc), the same programs
            crossing = functools.partial(_crossing_of, sem=sem, rank=r, cache=cross)
            if simc.lower_rank(prog, acts, r, cross, unit_rank, ahead, made, crossing, RECV, SEND) is None:
                return None
            continue
        at = 0   # with ahead: where the next receive goes (just before the previous compute)
        for i, a in enumerate(acts):
            u, mbs = a.unit, a.mb
            if weights and a.op is OPT:
                for (src, uu) in sorted(last_bwd):
                    if uu == u:
                        prog.append(Action(Op.RECV, unit=u, payload=Payload.WGRAD, peer=src))
            if weights and (r, u) in first_use and first_use[(r, u)] == i:
                prog.append(Action(Op.RECV, unit=u, payload=Payload.WEIGHT, peer=placement.weight_owner[u]))
            if u is None:
                at = len(prog)
                prog.append(a)
                continue
            first_piece = a.sub is None or a.sub[0] == 0
            last_piece = a.sub is None or a.sub[0] == a.sub[1] - 1
            got = cross.get((a.op, a.payload, u, not mbs))   # _crossing_of's cache, read without its call
            incoming, outgoing = got if got is not None else _crossing_of(a, sem, r, cross)
            if first_piece:
                sources: list[int] = []
                for payload, v, cu in incoming:
                    src = unit_rank[cu] if unit_rank is not None else _rank_of(placement, cu, mbs)
                    if src == r:
                        continue
                    msg = message_action(RECV, v, mbs, payload, src)
                    if not ahead:
                        prog.append(msg)
                        continue
                    if src in sources:
                        return None
                    sources.append(src)
                    prog.insert(at, msg)
                    at += 1
                    got = made.get((src, r))
                    if got is None:
                        got = made[(src, r)] = ([], [])
                    got[1].append((payload, v, mbs))
            at = len(prog)
            prog.append(a)
            if last_piece:
                for payload, v, cu in outgoing:
                    dst = unit_rank[cu] if unit_rank is not None else _rank_of(placement, cu, mbs)
                    if dst != r:
                        prog.append(message_action(SEND, v, mbs, payload, dst))
                        got = made.get((r, dst))
                        if got is None:
                            got = made[(r, dst)] = ([], [])
                        got[0].append((payload, v, mbs))
            if weights and last_bwd.get((r, u)) == i:
                prog.append(Action(Op.SEND, unit=u, payload=Payload.WGRAD, peer=placement.weight_owner[u]))
    return out


_PAYLOAD = {Value.ACT: Payload.ACT, Value.GRAD: Payload.GRAD}
_OP = attrgetter("op")


def _crossing_of(a: Action, sem: Semantics, rank: int, cache: dict) -> tuple[tuple, tuple]:
    """(read, written) activation/gradient values of ``a`` (:func:`_crossing`), each as
    (payload, unit, unit of the compute on the other side; :func:`_cross_rank_unit`). Which
    they are depends only on the op, the payload, the unit and whether it names micro-batches,
    so each such shape is expanded once; more micro-batches only repeat the keys."""
    key = (a.op, a.payload, a.unit, not a.mb)
    got = cache.get(key)
    if got is None:
        got = cache[key] = tuple(
            tuple((_PAYLOAD[kind], v, _cross_rank_unit(kind, v, reading)) for kind, v in _crossing(refs))
            for refs, reading in ((sem.reads(a, rank), True), (sem.writes(a, rank), False)))
    return got


def _crossing(refs: list) -> list[tuple[Value, int]]:
    """(kind, unit) of the activation/gradient values among ``refs``, one per unit (a fold's
    micro-batches travel together)."""
    seen = []
    for kind, v, _ in refs:
        if kind in _PAYLOAD and (kind, v) not in seen:
            seen.append((kind, v))
    return seen


def _weight_uses(compute: list[list[Action]], placement: Placement) -> tuple[dict, dict]:
    """(rank, unit) -> index of first compute / last weight-gradient compute, off-owner only."""
    first: dict[tuple[int, int], int] = {}
    last_bwd: dict[tuple[int, int], int] = {}
    for r, acts in enumerate(compute):
        for i, a in enumerate(acts):
            if a.unit is None or a.op is Op.OPT or placement.weight_owner[a.unit] == r:
                continue
            first.setdefault((r, a.unit), i)
            if a.op in LOCAL_WGRAD_OPS:
                last_bwd[(r, a.unit)] = i
    return first, last_bwd


def order_recvs_by_send(schedule: Schedule) -> Schedule:
    """Reorder RECVs so that, per directed link, they follow the sender's SEND order.

    SEND/RECV match by FIFO position per link (docs/semantics.md). Lowering puts each RECV
    just before its consumer, so when a rank consumes two messages of one link in another
    order than they were sent (ZB-V: ``act`` and ``grad`` share the 0->1 link), the
    earlier-sent RECV is hoisted to just before the RECV it must precede. RECVs only ever
    move earlier and non-RECV actions keep their relative order, so every consumer still
    follows its RECV. A schedule whose links are already in order is returned unchanged.
    """
    sent = _sent_index(schedule.actions)
    RECV = Op.RECV
    out: list[list[Action]] = []
    for dst, acts in enumerate(schedule.actions):
        if _in_send_order(acts, sent[dst]):
            out.append(acts)
            continue
        slot: dict[int, tuple[int, int]] = {}   # action index -> (new position, send index)
        recvs_from: dict[int, list[int]] = {}   # peer -> indices of its RECVs
        for i, a in enumerate(acts):
            if a.op is RECV:
                recvs_from.setdefault(a.peer, []).append(i)
        for src, idx in recvs_from.items():
            order = sent[dst].get(src, {})
            recvs = sorted((order.get(acts[i].key, -1), i) for i in idx)
            earliest = len(acts)
            for k, i in reversed(recvs):         # position = min over this and later-sent RECVs
                if i < earliest:
                    earliest = i
                slot[i] = (earliest, k)
        if all(pos == i for i, (pos, _) in slot.items()):   # every key (i, .) is distinct: the order stays
            out.append(acts)
            continue
        out.append([acts[i] for i in sorted(range(len(acts)), key=lambda i: slot.get(i, (i, 0)))])
    if out == schedule.actions:
        return schedule
    return schedule.with_actions(out)


def _same_order(links: dict[tuple[int, int], tuple[list, list]]) -> bool:
    """Whether every link receives exactly what it sends, in the same order, no message twice
    (then every RECV's SEND place grows by one: :func:`_in_send_order` holds on every rank)."""
    return all(sends == recvs and len(set(sends)) == len(sends) for sends, recvs in links.values())


def _sent_index(actions: list[list[Action]]) -> list[dict[int, dict[tuple, int]]]:
    """Per destination rank: source rank -> message key (:attr:`Action.key`) -> its SEND's place
    in the link's order."""
    sent: list[dict[int, dict[tuple, int]]] = [{} for _ in actions]
    SEND = Op.SEND
    for src, acts in enumerate(actions):
        to: dict[int, dict[tuple, int]] = {}   # dst -> sent[dst][src]
        for a in acts:
            if a.op is SEND:
                link = to.get(a.peer)
                if link is None:
                    link = to[a.peer] = sent[a.peer].setdefault(src, {}) if 0 <= a.peer < len(sent) else {}
                link[(a.payload, a.unit, a.mb, a.tag)] = len(link)   # a.key without the property call
    return sent


def _in_send_order(acts: list[Action], links: dict[int, dict[tuple, int]]) -> bool:
    """Whether every link's RECVs on a rank already follow strictly increasing SEND places
    (``links``: its sources' message key -> SEND place; then :func:`order_recvs_by_send` keeps the
    list; a RECV nothing sent breaks the order)."""
    last: dict[int, int] = {}
    RECV = Op.RECV
    for a in acts:
        if a.op is RECV:
            peer = a.peer
            link = links.get(peer)
            k = -1 if link is None else link.get((a.payload, a.unit, a.mb, a.tag), -1)
            if k <= last.get(peer, -1):
                return False
            last[peer] = k
    return True
