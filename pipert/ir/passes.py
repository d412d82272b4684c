"""Lowering passes: decisions about *how* a schedule runs, made on the IR so that the simulator
times exactly the program the executor runs (docs/semantics.md, "Lowering passes").

Each pass is a pure function ``Schedule -> Schedule`` that keeps the schedule valid:

- :func:`post_receives_early` posts activation/gradient receives some computes before their
  consumer (latency hiding; the buffer is held from there);
- :func:`receives_at_consumer` moves them back down to just before their consumer (where a
  runtime whose receives block, as torch.distributed.pipelining's simulator models it, accepts them);
- :func:`send_early` moves every SEND right after the action that produces its value;
- :func:`merge_sub_blocks` runs a compute split into sub-blocks as one action at its last piece;
- :func:`expand_folds` turns an action over several micro-batches into one action per
  micro-batch (then :func:`send_early` lets each micro-batch's message leave at once);
- :func:`recompute` rebuilds chosen units' stashes before their backward instead of keeping them;
- :func:`offload_stashes` moves chosen stashes to host memory between forward and backward;
- :func:`offload_weights` moves chosen units' weights to host memory between two computes of
  the unit that other computes separate;
- :func:`fold_microbatches` makes every op run a fold of k micro-batches.

A pass returns the schedule unchanged (the same object) when it has nothing to do.
"""
from __future__ import annotations

import dataclasses
from typing import Iterable

from .action import COMPUTE_OPS, P2P_OPS, Action, Op, Payload, compute_action, message_action
from .schedule import Schedule
from .semantics import (PAYLOAD_VALUE, PER_MB_PAYLOADS, PER_UNIT, PIECEWISE_OPS, STASH_READERS, UNIT_COMPUTE_OPS,
                        WEIGHT_READERS, Queue, Semantics, slot)

__all__ = ["post_receives_early", "receives_at_consumer", "consumer_positions", "send_early", "merge_sub_blocks",
           "expand_folds", "split_folds", "recompute", "offload_stashes", "offload_weights", "fold_microbatches", "apply_passes",
           "PASSES"]


def post_receives_early(schedule: Schedule, computes: int = 1,
                        payloads: Iterable[Payload] = (Payload.ACT, Payload.GRAD)) -> Schedule:
    """Move each RECV of ``payloads`` up to ``computes`` compute-queue actions earlier (to just
    before the compute that many places before its old position), never above an earlier RECV of
    the same directed link (FIFO matching) nor above the list start."""
    if computes < 0:
        raise ValueError(f"computes must be >= 0, got {computes}")
    kinds = frozenset(payloads)
    out = []
    sem = Semantics(0, schedule.placement)
    on_compute = {op: sem.queue(op) is Queue.COMPUTE for op in Op}
    RECV = Op.RECV
    for acts in schedule.actions:
        compute_pos: list[int] = []   # indices of the compute-queue actions before index i
        pos = list(range(len(acts)))   # sort position per index: a moved RECV's is fractional, before a compute
        moved = False
        last_of_link: dict[int, float] = {}
        for i, a in enumerate(acts):
            op = a.op
            if op is not RECV:
                if on_compute[op]:
                    compute_pos.append(i)
                continue
            p = float(i)
            if computes and a.payload in kinds:
                k = len(compute_pos) - computes  # the compute it is posted before
                p = compute_pos[k] - 0.5 if k >= 0 else -0.5
            bound = last_of_link.get(a.peer)
            if bound is not None and p <= bound:
                p = bound + 1e-6
            if p < i:
                pos[i] = p
                moved = True
            last_of_link[a.peer] = min(p, i)
        # no fractional position equals an index, and the sort is stable: equal ones keep list order
        out.append([acts[i] for i in sorted(range(len(acts)), key=pos.__getitem__)] if moved else acts)
    return _with(schedule, out)


def receives_at_consumer(schedule: Schedule,
                         payloads: Iterable[Payload] = (Payload.ACT, Payload.GRAD)) -> Schedule:
    """Move each RECV of ``payloads`` down to just before the first later action that reads its
    value (or WAITs for it), never below a later RECV of the same directed link (FIFO matching).
    A RECV nothing reads stays. Then a rank stops at a receive only where its next action needs
    the value anyway: with each SEND right after its producer (as lowering places it), a compute
    order that runs runs with receives that block."""
    out = []
    sem = Semantics.of(schedule)
    for r, acts in enumerate(schedule.actions):
        pos = consumer_positions(acts, sem, r, payloads)
        out.append([acts[i] for i in sorted(range(len(acts)), key=lambda i: (pos[i], i))])
    return _with(schedule, out)


def consumer_positions(acts: list[Action], sem: Semantics, rank: int,
                       payloads: Iterable[Payload] = (Payload.ACT, Payload.GRAD)) -> list[float]:
    """Sort positions of ``acts`` (rank ``rank``'s list) that put each RECV of ``payloads`` where
    :func:`receives_at_consumer` does: just below its first reader's index, at most the position of
    the link's next RECV; every other action keeps its index. Sorting by (position, index) gives
    the list. Positions never lie below indices, and those of one link's RECVs never decrease
    along the list (their order stays the link's)."""
    kinds = frozenset(payloads)
    RECV = Op.RECV
    pos: list[float] = list(range(len(acts)))
    first_reader: dict[tuple, int] = {}   # value or awaited message -> index of its first reader after here
    next_on_link: dict[int, float] = {}   # peer -> position of the next RECV from it
    for i in range(len(acts) - 1, -1, -1):
        a = acts[i]
        if a.op is not RECV:
            for key in sem.reads(a, rank):
                first_reader[key] = i
            if a.op is Op.WAIT and a.waits is RECV:
                first_reader[(a.peer, a.key)] = i
            continue
        if a.payload in kinds:
            readers = [first_reader.get(k) for k in sem.writes(a, rank)] + [first_reader.get((a.peer, a.key))]
            found = [j for j in readers if j is not None]
            if found:
                pos[i] = min(found) - 0.5
        bound = next_on_link.get(a.peer)
        if bound is not None and pos[i] > bound:   # ties keep list order: the sort key is (position, index)
            pos[i] = bound
        next_on_link[a.peer] = pos[i]
    return pos


def send_early(schedule: Schedule) -> Schedule:
    """Move each SEND right after the last earlier action that writes its value (or to its old
    place), never above an earlier SEND to the same peer.

    Each SEND is inserted into the rank's list as it is met, directly after that action (before the
    SENDs inserted there earlier; at the front when there is none). Insertions keep the order of
    what is already placed, so each action gets its place as a sort key once: a non-SEND the
    tuple ``(its count,)``, appended after everything; a SEND the key of the action it follows plus
    ``(-t,)``, t the insertion count (later insertions sort first among one action's followers,
    and everything that follows one of them after it). Time O(n log n) instead of O(n^2)."""
    sem = Semantics.of(schedule)
    out = []
    head = (-1,)
    for r, acts in enumerate(schedule.actions):
        keyed: list[tuple[tuple, Action]] = []
        last_send_at: dict[int, tuple] = {}
        writer_at: dict[tuple, tuple] = {}
        appended = 0
        for t, a in enumerate(acts):
            if a.op is Op.SEND:
                after = max((writer_at[k] for k in _values(a) if k in writer_at), default=head)
                peer = last_send_at.get(a.peer)
                if peer is not None and peer > after:
                    after = peer
                key = after + (-t,)
                keyed.append((key, a))
                last_send_at[a.peer] = key
                continue
            key = (appended,)
            appended += 1
            keyed.append((key, a))
            if a.sub is None or a.sub[0] == a.sub[1] - 1:
                for k in sem.writes(a, r):
                    writer_at[k] = key
        keyed.sort(key=lambda ka: ka[0])
        out.append([a for _, a in keyed])
    return _with(schedule, out)


def _values(a: Action) -> list[tuple]:
    """The values a SEND carries (of weights: the class it names)."""
    kind = PAYLOAD_VALUE[a.payload]
    return [(kind, a.unit, slot(a.zclass))] if kind in PER_UNIT else [(kind, a.unit, m) for m in a.mb]


def merge_sub_blocks(schedule: Schedule, ops: Iterable[Op] = UNIT_COMPUTE_OPS - PIECEWISE_OPS) -> Schedule:
    """Replace the pieces ``sI/N`` of each compute in ``ops`` (default: every compute whose pieces
    the executor does not run as pieces) by the whole action at the place of its last piece."""
    ops = frozenset(ops)
    out = []
    changed = False
    for acts in schedule.actions:
        new = []
        for a in acts:
            if a.sub is None or a.op not in ops:
                new.append(a)
                continue
            changed = True
            if a.sub[0] == a.sub[1] - 1:
                new.append(dataclasses.replace(a, sub=None))
        out.append(new)
    return _with(schedule, out) if changed else schedule


def expand_folds(schedule: Schedule) -> Schedule:
    """One action per micro-batch for every action over several (in micro-batch order, at the
    place of the fold); then :func:`send_early`, so each micro-batch's message leaves as soon as
    its own compute ends (the two-fold overlap of HelixPipe)."""
    split = split_folds(schedule)
    return send_early(split) if split is not schedule else schedule


def split_folds(schedule: Schedule) -> Schedule:
    """:func:`expand_folds` without its :func:`send_early`: each fold's action in place, one per
    micro-batch (the same object when there is no fold to split)."""
    out = []
    changed = False
    for acts in schedule.actions:
        new = []
        for a in acts:
            if len(a.mb) > 1 and (a.op in COMPUTE_OPS or a.payload in PER_MB_PAYLOADS):
                changed = True
                new.extend(_one_microbatch(a, m) for m in a.mb)
            else:
                new.append(a)
        out.append(new)
    return _with(schedule, out) if changed else schedule


def _one_microbatch(a: Action, m: int) -> Action:
    """``dataclasses.replace(a, mb=(m,))`` for a valid fold ``a`` and one of its micro-batches;
    without the checks (compute_action, message_action) where ``a`` sets only the fields those
    set: a unit compute, or a SEND/RECV (the fold's own check covers the piece)."""
    if a.sub is None and a.tag == 0 and a.root is None and a.waits is None and a.zclass is None and \
            a.side is None and not a.group:
        if a.op in UNIT_COMPUTE_OPS and a.payload is None and a.peer is None:
            return compute_action(a.op, a.unit, (m,))
        if a.op in P2P_OPS:
            return message_action(a.op, a.unit, (m,), a.payload, a.peer)
    return dataclasses.replace(a, mb=(m,))


PASSES = {"post_receives_early": post_receives_early, "receives_at_consumer": receives_at_consumer,
          "send_early": send_early,
          "merge_sub_blocks": merge_sub_blocks, "expand_folds": expand_folds}
"""Passes by name (``pipert train --passes``, ``pipert simulate --passes``)."""


def apply_passes(schedule: Schedule, names: Iterable[str]) -> Schedule:
    """Apply the named passes in order."""
    for name in names:
        try:
            schedule = PASSES[name](schedule)
        except KeyError:
            raise ValueError(f"unknown pass {name!r}; allowed: {', '.join(PASSES)}") from None
    return schedule


def _with(schedule: Schedule, actions: list[list[Action]]) -> Schedule:
    if actions == schedule.actions:
        return schedule
    return schedule.with_actions(actions)


def recompute(schedule: Schedule, units: Iterable[int] | None = None) -> Schedule:
    """Recompute instead of stashing: ``RECOMPUTE u m`` right before the first backward (B or
    D) of each (u, m) of ``units`` (default: every unit) on its rank; that F then keeps only its
    input (docs/semantics.md)."""
    chosen = set(range(schedule.num_units)) if units is None else set(units)
    out = []
    for acts in schedule.actions:
        new, done = [], set()
        for a in acts:
            if a.op in STASH_READERS and a.unit in chosen and (a.sub is None or a.sub[0] == 0):
                ms = tuple(m for m in a.mb if (a.unit, m) not in done)
                if ms:
                    new.append(Action(Op.RECOMPUTE, unit=a.unit, mb=ms))
                    done.update((a.unit, m) for m in ms)
            new.append(a)
        out.append(new)
    return _with(schedule, out)


def offload_stashes(schedule: Schedule, units: Iterable[int] | None = None) -> Schedule:
    """``OFFLOAD stash u m`` right after each F (its last piece) of ``units`` and ``PREFETCH stash
    u m`` right before its first backward; stashes a RECOMPUTE rebuilds are left alone."""
    chosen = set(range(schedule.num_units)) if units is None else set(units)
    out = []
    for acts in schedule.actions:
        rebuilt = {(a.unit, m) for a in acts if a.op is Op.RECOMPUTE for m in a.mb}
        new, moved = [], set()
        for a in acts:
            first = a.sub is None or a.sub[0] == 0
            last = a.sub is None or a.sub[0] == a.sub[1] - 1
            if a.op in STASH_READERS and first:
                for m in a.mb:
                    if (a.unit, m) in moved:
                        new.append(Action(Op.PREFETCH, unit=a.unit, mb=(m,), payload=Payload.STASH))
                        moved.discard((a.unit, m))
            new.append(a)
            if a.op is Op.F and last and a.unit in chosen:
                for m in a.mb:
                    if (a.unit, m) not in rebuilt:
                        new.append(Action(Op.OFFLOAD, unit=a.unit, mb=(m,), payload=Payload.STASH))
                        moved.add((a.unit, m))
        out.append(new)
    return _with(schedule, out)


def fold_microbatches(schedule: Schedule, k: int) -> Schedule:
    """The same program with every micro-batch j replaced by the fold ``k*j .. k*j+k-1`` (each
    op runs k micro-batches; the schedule then has k times as many). Transfers carry folds."""
    if k < 1:
        raise ValueError(f"fold must be >= 1, got {k}")
    if k == 1:
        return schedule
    if schedule.placement.kind == "microbatch":
        raise ValueError("fold_microbatches needs a placement that does not depend on the micro-batch "
                         f"(schedule {schedule.name!r} places by micro-batch)")
    out = [[a if not a.mb else dataclasses.replace(a, mb=tuple(k * j + i for j in a.mb for i in range(k)))
            for a in acts] for acts in schedule.actions]
    pl = schedule.placement
    if pl.kind == "table":
        pl = dataclasses.replace(pl, ranks=tuple(tuple(row[j // k] for j in range(len(row) * k)) for row in pl.ranks))
    meta = dict(schedule.meta, fold=k * schedule.meta.get("fold", 1))
    if meta.get("update_every"):
        meta["update_every"] *= k
    return Schedule(f"{schedule.name}-fold{k}" if "-fold" not in schedule.name else schedule.name,
                    schedule.num_ranks, schedule.num_units, schedule.num_microbatches * k, pl, out, meta)


def offload_weights(schedule: Schedule, units: Iterable[int] | None = None) -> Schedule:
    """``OFFLOAD weight u`` right after a compute of u and ``PREFETCH weight u`` right before the
    next compute of u on the same rank, wherever other computes run between the two and nothing
    else touches unit u's weights or gradients (no transfer, collective, FREE or OPT of u): the
    weights leave the device while the rank works on other units."""
    chosen = set(range(schedule.num_units)) if units is None else set(units)
    out = []
    for acts in schedule.actions:
        offload_after: set[int] = set()
        prefetch_before: set[int] = set()
        last: dict[int, int] = {}      # unit -> index of its last compute with no barrier since
        between: dict[int, int] = {}   # unit -> computes of other units since then
        for i, a in enumerate(acts):
            if a.op in WEIGHT_READERS:
                j = last.get(a.unit)
                if a.unit in chosen and j is not None and between.get(a.unit, 0) > 0:
                    offload_after.add(j)
                    prefetch_before.add(i)
                last[a.unit] = i
                between[a.unit] = 0
                for u in between:
                    if u != a.unit:
                        between[u] += 1
            elif a.unit is not None:
                last.pop(a.unit, None)   # a barrier for its unit
            elif a.op is Op.OPT:
                last.clear()
        if not offload_after:
            out.append(acts)
            continue
        new = []
        for i, a in enumerate(acts):
            classes = [zc for zc, _ in schedule.placement.zero_parts(a.unit)] if a.unit is not None else []
            if i in prefetch_before:  # a unit with ZeRO classes moves class by class
                new += [Action(Op.PREFETCH, unit=a.unit, payload=Payload.WEIGHT, zclass=zc) for zc in classes]
            new.append(a)
            if i in offload_after:
                new += [Action(Op.OFFLOAD, unit=a.unit, payload=Payload.WEIGHT, zclass=zc) for zc in classes]
        out.append(new)
    return _with(schedule, out)


PASSES.update({"recompute": recompute, "offload_stashes": offload_stashes, "offload_weights": offload_weights})
