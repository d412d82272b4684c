"""PipeMesh's elastic schedule (Li et al., TPDS 2025, Algorithm 1).

Notation: the paper's B (micro-batches per pipeline per step) is ``microbatches``, its M (chunks
per stage) is ``chunks`` (V). Chunk c of stage s is chunk ``c*P + s`` of the model (Megatron's
looping placement); a chunk is ``units_per_chunk`` consecutive units, each of which may get its
own ZeRO stage over the data-parallel replicas (``replicate(..., zero=[...])``: mixed ZeRO per
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
(``overlap_collectives``).
"""
from __future__ import annotations

from typing import Sequence

from ..ir import Action, Op, Schedule
from .registry import PipelineConfig, assemble

__all__ = ["pipemesh", "check_pipemesh", "sequences", "warmup", "peak_live_passes", "pass_orders"]


def _seq(name: str, value: Sequence[int] | str | None, stages: int, total: int) -> tuple[int, ...]:
    if value is None:
        if total % stages:
            raise ValueError(f"pipemesh: {total} micro-batches do not split into groups of P={stages}; give "
                             f"{name} explicitly (positive integers >= {stages} summing to {total})")
        return (stages,) * (total // stages)
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
                     dequeue=list(d), units_per_chunk=k)
    from ..sim import validate
    errors = validate(sched, all_errors=True)
    if errors:
        raise ValueError(f"pipemesh: enqueue {list(e)} / dequeue {list(d)} with P={P}, V={V}, B={B} cannot run: "
                         f"{errors[0]} [{errors[0].reason}]")
    return sched
