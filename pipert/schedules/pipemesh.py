"""PipeMesh's elastic schedule (Li et al., TPDS 2025, Algorithm 1).

Notation: the paper's B (micro-batches per pipeline per step) is ``microbatches``, its M (chunks
per stage) is ``chunks`` (V). Chunk c of stage s is chunk ``c*P + s`` of the model (Megatron's
looping placement); a chunk is ``units_per_chunk`` consecutive units, each of which may get its
own ZeRO stage over the data-parallel replicas, or one per parameter (``replicate(..., zero=[...])``: mixed ZeRO per
parameter group of a chunk).

Enqueue sequence ``e`` and dequeue sequence ``d`` each sum to B. Forward queue: for each
enqueue group j, chunk 0 for its e_j micro-batches, then chunk 1, ..., chunk V-1. Backward
queue: for each dequeue group j, chunk V-1 down to chunk 0 for its d_j micro-batches. Stage s
(0-indexed) runs ``w = (V-1)e_1 + 2(P-1-s)`` warm-up forwards, then one forward and one
backward at a time, then the remaining backwards. Megatron's interleaved 1F1B is e = d =
(P, P, ...); breadth-first is e = d = (B). The peak of live forward passes on stage s is
``w + 1`` (the paper's ``e_1(M-1) + 2(P-i) + 1`` with i = s + 1), reached before its first
backward.

Over D replicas (``replicate``) the collectives follow the paper's communication schedule
(``overlap_collectives``): this module registers it as the replication policy ``pipemesh-overlap``,
the default of pipemesh schedules (``pipert.schedules.data_parallel.register_policy``).
"""
from __future__ import annotations

from typing import Sequence

from ..ir import Action, Op, Payload, Schedule
from .data_parallel import WEIGHT_READERS, Replication, register_policy, relabel
from .registry import PipelineConfig, assemble

__all__ = ["pipemesh", "check_pipemesh", "sequences", "warmup", "peak_live_passes", "pass_orders",
           "overlap_collectives", "overlapped"]


def _seq(name: str, value: Sequence[int] | str | None, stages: int, total: int) -> tuple[int, ...]:
    if value is None:
        if total % stages:
            raise ValueError(f"pipemesh: {total} micro-batches do not split into groups of P={stages}; give "
                             f"{name} explicitly (positive integers >= {stages} summing to {total})")
        return (stages,) * (total // stages)
    if isinstance(value, int) and not isinstance(value, bool):
        value = (value,)
    if isinstance(value, str):
        try:
            value = [int(x) for x in value.split(",") if x.strip()]
        except ValueError:
            raise ValueError(f"pipemesh: {name} {value!r} is not a comma-separated list of integers") from None
    seq = tuple(value)
    if not seq or any(isinstance(x, bool) or not isinstance(x, int) for x in seq):
        raise ValueError(f"pipemesh: {name} must be a non-empty sequence of integers, got {value!r}")
    if sum(seq) != total:
        raise ValueError(f"pipemesh: {name} {list(seq)} sums to {sum(seq)}; it must sum to the micro-batches "
                         f"per replica B={total}")
    small = [x for x in seq if x < stages]
    if small:
        raise ValueError(f"pipemesh: {name} {list(seq)} has element(s) {small} < P={stages}; every group must hold "
                         f"at least P micro-batches (a chunk's first pass must come back around the pipeline "
                         f"before the next chunk of the group needs it)")
    return seq


def sequences(config: PipelineConfig, enqueue: Sequence[int] | str | None = None,
              dequeue: Sequence[int] | str | None = None) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The checked (enqueue, dequeue) sequences; the default is Megatron's (P, P, ...)."""
    P, B = config.stages, config.microbatches
    return _seq("enqueue", enqueue, P, B), _seq("dequeue", dequeue, P, B)


def warmup(stages: int, chunks: int, microbatches: int, e1: int, stage: int) -> int:
    """Warm-up forwards of ``stage`` (0-indexed): ``(V-1)e_1 + 2(P-1-stage)``, at most V*B."""
    return min((chunks - 1) * e1 + 2 * (stages - 1 - stage), chunks * microbatches)


def peak_live_passes(stages: int, chunks: int, microbatches: int, e1: int, stage: int) -> int:
    """Forward passes whose activations ``stage`` holds at its peak: warm-up + 1 (all if none is left)."""
    return min(warmup(stages, chunks, microbatches, e1, stage) + 1, chunks * microbatches)


def _queue(groups: tuple[int, ...], chunks: list[int]) -> list[tuple[int, int]]:
    out, start = [], 0
    for g in groups:
        out += [(c, m) for c in chunks for m in range(start, start + g)]
        start += g
    return out


def pass_orders(config: PipelineConfig, enqueue: tuple[int, ...], dequeue: tuple[int, ...]
                ) -> list[list[tuple[str, int, int]]]:
    """Per stage, its passes in order: ("F" or "B", chunk of the stage, micro-batch)."""
    P, V, B = config.stages, config.chunks, config.microbatches
    fwd = _queue(enqueue, list(range(V)))
    bwd = _queue(dequeue, list(range(V - 1, -1, -1)))
    out = []
    for s in range(P):
        w = warmup(P, V, B, enqueue[0], s)
        passes = [("F", c, m) for c, m in fwd[:w]]
        for k in range(V * B - w):
            passes += [("F", *fwd[w + k]), ("B", *bwd[k])]
        passes += [("B", c, m) for c, m in bwd[V * B - w:]]
        out.append(passes)
    return out


def check_pipemesh(config: PipelineConfig) -> None:
    """PipeMesh needs B >= P micro-batches (every group holds at least P)."""
    if config.microbatches < config.stages:
        raise ValueError(f"pipemesh needs microbatches >= stages (got B={config.microbatches} < P={config.stages})")


def pipemesh(config: PipelineConfig, enqueue: Sequence[int] | str | None = None,
             dequeue: Sequence[int] | str | None = None, units_per_chunk: int = 1,
             max_live_passes: int | None = None) -> Schedule:
    """The elastic schedule (module doc). ``enqueue``/``dequeue``: group sizes (a sequence or
    "4,4"), default (P, ..., P); ``units_per_chunk``: units in one chunk (parameter groups that
    may get different ZeRO stages); ``max_live_passes``: the activation budget of a stage in
    forward passes; a sequence whose peak exceeds it is rejected. A program that the validator
    rejects (e.g. a deadlock) is reported as a ValueError naming the sequences and the reason."""
    check_pipemesh(config)
    if isinstance(units_per_chunk, bool) or not isinstance(units_per_chunk, int) or units_per_chunk < 1:
        raise ValueError(f"pipemesh: units_per_chunk must be a positive integer, got {units_per_chunk!r}")
    e, d = sequences(config, enqueue, dequeue)
    P, V, B, k = config.stages, config.chunks, config.microbatches, units_per_chunk
    if max_live_passes is not None:
        need = peak_live_passes(P, V, B, e[0], 0)
        if need > max_live_passes:
            raise ValueError(f"pipemesh: enqueue e_1={e[0]} needs e_1(V-1) + 2(P-1) + 1 = {need} live forward "
                             f"passes on stage 0 (V={V}, P={P}); the budget max_live_passes={max_live_passes} "
                             f"allows at most e_1 <= {max(0, (max_live_passes - 1 - 2 * (P - 1)) // max(V - 1, 1))}"
                             + ("" if V > 1 else " (with V=1 the peak does not depend on e_1)"))
    orders = []
    for s, passes in enumerate(pass_orders(config, e, d)):
        acts = []
        for op, c, m in passes:
            units = [(c * P + s) * k + j for j in range(k)]
            acts += [Action(Op.F if op == "F" else Op.B, u, m) for u in (units if op == "F" else units[::-1])]
        orders.append(acts)
    unit_ranks = [(u // k) % P for u in range(P * V * k)]
    sched = assemble("pipemesh", config, unit_ranks, orders, split_backward=False, enqueue=list(e),
                     dequeue=list(d), units_per_chunk=k, post_ahead=k)  # receives posted one pass early
    from ..sim import validate
    errors = validate(sched, all_errors=True)
    if errors:
        raise ValueError(f"pipemesh: enqueue {list(e)} / dequeue {list(d)} with P={P}, V={V}, B={B} cannot run: "
                         f"{_early_backward(config, e, d)}validator: {errors[0]} [{errors[0].reason}]")
    return sched


def _early_backward(config: PipelineConfig, e: tuple[int, ...], d: tuple[int, ...]) -> str:
    """Where Algorithm 1 puts a backward before its own forward (the usual reason a sequence
    cannot run), as a sentence; empty if nowhere."""
    ends = [sum(d[:j + 1]) for j in range(len(d))]
    for s, passes in enumerate(pass_orders(config, e, d)):
        done = set()
        for op, c, m in passes:
            if op == "F":
                done.add((c, m))
            elif (c, m) not in done:
                j = next(i for i, end in enumerate(ends) if m < end)
                w = warmup(config.stages, config.chunks, config.microbatches, e[0], s)
                return (f"stage {s} would run the backward of its chunk {c}, micro-batch {m} (dequeue group {j + 1} "
                        f"of {d[j]}) before its forward: {w} warm-up forwards ((V-1)e_1 + 2(P-1-{s})) do not reach "
                        f"it; ")
    return ""


# --- the communication schedule over D replicas --------------------------------------------------

def _passes(acts: list[Action], k: int) -> list[tuple[int, int, str, int]]:
    """(first index, last index, side "F"/"B", chunk) of each pass: consecutive computes of one
    chunk, one side and the same micro-batches."""
    out: list[list] = []
    prev = None
    for i, a in enumerate(acts):
        if a.op not in WEIGHT_READERS or a.unit is None:
            continue
        side = "F" if a.op is Op.F else "B"
        key = (side, a.unit // k, a.mb)
        if key == prev:
            out[-1][1] = i
        else:
            out.append([i, i, side, a.unit // k])
        prev = key
    return [tuple(p) for p in out]


def _runs(passes: list[tuple[int, int, str, int]], side: str) -> list[tuple[int, int, int]]:
    """(chunk, first pass, last pass) of each maximal run of one chunk among the passes of ``side``."""
    runs: list[list[int]] = []
    for j, (_, _, s, c) in enumerate(passes):
        if s != side:
            continue
        if runs and runs[-1][0] == c:
            runs[-1][2] = j
        else:
            runs.append([c, j, j])
    return [tuple(r) for r in runs]


def _merge_runs(spans: list, same_side: dict[str, list[int]], n: int) -> list[list]:
    """Spans (start, end, first pass, last pass, side) of one chunk's runs, in order; those that
    overlap, or have fewer than ``n`` passes of the later run's side between them, become one (its
    weights are kept, not freed and gathered again)."""
    merged: list[list] = []
    for s, e, a, b, side in spans:
        if merged and (s <= merged[-1][1] or sum(merged[-1][3] < j < a for j in same_side[side]) < n):
            merged[-1][1], merged[-1][3] = max(merged[-1][1], e), max(merged[-1][3], b)
        else:
            merged.append([s, e, a, b, side])
    return merged


def overlap_collectives(acts: list[Action], parts: Sequence[Sequence[tuple[int | None, int]]],
                        groups: Sequence[tuple[int, ...]],
                        held: Sequence[int], units_per_chunk: int = 1, split: bool = False
                        ) -> tuple[dict[int, list[Action]], list[Action]]:
    """PipeMesh's collectives for one base rank's program ``acts`` (its OPTs are dropped by the
    caller): ``(before, tail)``, where ``before[i]`` goes right before action i and ``tail`` after
    the last action. With passes = consecutive computes of one chunk, side and micro-batch, and
    runs = maximal runs of one chunk among the forward (or the backward) passes:

    - ZeRO-3 weights are gathered for every run that uses them (overlapping runs merge) and freed
      after it; ZeRO-1/2 weights (stale since the last step's OPT stepped the shards) are gathered
      once, for the first run of their chunk, and kept (the optimizer's all-gather of the paper,
      overlapped with the step's first passes); a run's n gathers go one before each of the n
      passes of the run's side before it starts (a forward pass prefetches for the next forward
      run, a backward pass for the next backward run, as in the paper's Algorithm 1), never
      before the previous FREE (those that find no such pass go before the first pass after it);
      two runs of a chunk with fewer than n passes of the later run's side between them merge
      (the weights are kept, not freed and gathered again);
    - ZeRO-2/3 gradients are reduce-scattered after every backward run of their chunk, ZeRO-0/1
      ones (ALLREDUCE/REDUCESCATTER) after the chunk's last backward run; bucket b (of the chunk's
      units, last-finished first) goes before the (b+1)-th backward pass after the run (the tail
      when there is none); the shards accumulate;
    - the tail steps the optimizer of every held unit after all reductions. Between steps the
      whole weights of ZeRO-1/2 units are those the step started with; the shards are current.

    ``parts[u]`` lists unit u's ZeRO parts as (class, stage) (``Placement.zero_parts``): the
    rules above apply to each part, and the part's class goes on its actions. ``split`` keeps the
    gathered ZeRO-3 weights of forward and backward runs apart (the paper's separate B_Z3^fwd and
    B_Z3^bwd buffers): forward runs and backward runs never merge, each gathers and frees its own
    copy (``fwd``/``bwd``), and the ZeRO-1/2 gathers go with the chunk's first forward run.
    """
    k = units_per_chunk
    passes = _passes(acts, k)
    held_set = set(held)
    items: list[tuple[int, int, int, Action]] = []  # (index, 0 after / 1 before, seq, action)
    tail_red: list[Action] = []

    def chunk_parts(c: int, stages: tuple[int, ...]) -> list[tuple[int, int | None]]:
        """(unit, class) of the chunk's held parts whose stage is in ``stages``, in unit order."""
        return [(u, zc) for u in range(c * k, c * k + k) if u in held_set for zc, z in parts[u] if z in stages]

    def put(index: int, prio: int, a: Action) -> None:
        items.append((index, prio, len(items), a))

    same_side = {side: [j for j, p in enumerate(passes) if p[2] == side] for side in "FB"}
    # weights of ZeRO-3 units
    for c in sorted({p[3] for p in passes}):
        spans = sorted((passes[a][0], passes[b][1], a, b, side) for side in "FB"
                       for cc, a, b in _runs(passes, side) if cc == c)
        z3 = chunk_parts(c, (3,))
        tracks = [_merge_runs([sp for sp in spans if sp[4] == side], same_side, len(z3)) for side in "FB"] \
            if split else [_merge_runs(spans, same_side, len(z3))]
        for track in tracks:
            prev_free = -1
            for n, (s, e, a, b, side) in enumerate(track):
                copy = ("fwd" if side == "F" else "bwd") if split else None
                gathered = [(u, zc, copy) for u, zc in z3]
                if n == 0 and (side == "F" or not split):
                    gathered += [(u, zc, None) for u, zc in chunk_parts(c, (1, 2))]
                order = gathered if side == "F" else gathered[::-1]
                ahead = [j for j in same_side[side] if prev_free < j < a][-len(order):] if order else []
                for (u, zc, cp), target in zip(order, [prev_free + 1] * (len(order) - len(ahead)) + ahead):
                    put(passes[target][0], 1, Action(Op.ALLGATHER, unit=u, payload=Payload.WEIGHT, group=groups[u],
                                                     zclass=zc, side=cp))
                for u, zc in z3:
                    put(e + 1, 0, Action(Op.FREE, unit=u, payload=Payload.WEIGHT, zclass=zc, side=copy))
                prev_free = b
    # weight gradients
    bwd = [j for j, p in enumerate(passes) if p[2] == "B"]
    for c in sorted({p[3] for p in passes}):
        runs = [r for r in _runs(passes, "B") if r[0] == c]
        for n, (_, _, last) in enumerate(runs):
            final = n == len(runs) - 1
            reduced = chunk_parts(c, (0, 1, 2, 3) if final else (2, 3))[::-1]
            after = [j for j in bwd if j > last]
            for b, (u, zc) in enumerate(reduced):
                z = next(z for c2, z in parts[u] if c2 == zc)
                op = Op.ALLREDUCE if z == 0 else Op.REDUCESCATTER
                a = Action(op, unit=u, payload=Payload.WGRAD, group=groups[u], zclass=zc)
                if b < len(after):
                    put(passes[after[b]][0], 1, a)
                else:
                    tail_red.append(a)
    before: dict[int, list[Action]] = {}
    for index, _, _, a in sorted(items, key=lambda t: t[:3]):
        before.setdefault(index, []).append(a)
    tail = list(tail_red) + [Action(Op.OPT, unit=u) for u in sorted(held_set)]
    return before, tail


def overlapped(rep: Replication, r: int, d: int) -> list[Action]:
    """Replica d's copy of base rank r with PipeMesh's collectives (:func:`overlap_collectives`)."""
    base = rep.base
    acts = base.actions[r]
    owner = base.placement.weight_owner
    bad = [a for a in acts if a.unit is not None and a.op in WEIGHT_READERS and owner[a.unit] != r]
    if bad:
        raise ValueError(f"schedule {base.name!r}: rank {r} computes {bad[0]} of a unit it does not hold; "
                         f"PipeMesh's communication schedule needs activation passing")
    before, tail = overlap_collectives(acts, rep.parts, rep.groups, base.units_owned(r),
                                       base.meta.get("units_per_chunk", 1), rep.split)
    prog: list[Action] = []
    for i, a in enumerate(acts):
        prog += before.get(i, [])
        if a.op is not Op.OPT:
            prog.append(relabel(a, d, rep.dp, base.num_ranks))
    return prog + before.get(len(acts), []) + tail


register_policy("pipemesh-overlap", overlapped, families=("pipemesh",))
