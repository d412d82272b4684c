"""The CrossPipe problem: traversal pattern, per-unit times and memory, per-link delays.

A :class:`CrossPipeProblem` is everything the greedy and the solver read (paper §4.1
"Inputs", §4.2 "Algorithm inputs"), already resolved per unit and per message:

- placement of units on ranks, from a traversal pattern (:func:`pattern_units`):
  ``ud`` (unit u on rank u), ``wave`` (V shape, 2 chunks: down then back up, rank 0 holds
  the first and the last unit) and ``loop`` (interleaved chunks: unit u on rank u mod P);
- per-unit times ``tf/td/tw`` of one micro-batch (F, D = input grad, W = weight grad);
- memory: ``F u`` adds ``stash[u]``, ``D u`` frees ``stash[u] - stash_w[u]``, ``W u``
  frees ``stash_w[u]`` (its last sub-block frees it); an activation or gradient buffer
  (``act_buf[u]``/``grad_buf[u]``) counts from its RECV, or from the F/D that wrote it, until
  its consumer ran or its SEND handed it over (:meth:`CrossPipeProblem.buffers`);
- the recompute case (``recompute=True``, paper §7.2 Case 2): F keeps only ``kept[u]`` (its
  boundary input), ``RECOMPUTE u`` (``tr[u]``) rebuilds the stash right before D, raising the
  level by ``stash - kept``; D and W free as without recompute;
- DP overlap (``dp_time[u] > 0``, paper §4.1 "DP Overlap Modeling"): unit u's gradient reduction
  takes ``dp_time[u]`` on its rank's group queue (FIFO), after the unit's last W, and the rank's
  optimizer steps wait for it (:meth:`CrossPipeProblem.finish`);
- ZeRO's weight gathers (``gather_time[u] > 0``), on the same group queue, posted as
  ``pipert.schedules.data_parallel`` writes them and the simulator times them (a collective starts
  once the rank's previous compute ended and the queue is free): ZeRO 1/2 after the unit's
  optimizer step (:meth:`CrossPipeProblem.after_compute`); ZeRO 3 (``gather_first[u]``) at the
  start of the step, the rank's gathers one after another in unit order (the ``crosspipe-overlap``
  policy posts them first), and the unit's first F waits for its own
  (:meth:`CrossPipeProblem.gather_release`);
- per-message ``(occupancy, latency)`` for the activation of unit u (rank(u) -> rank(u+1))
  and the gradient of unit u (rank(u+1) -> rank(u)); both are (0, 0) on one rank;
- a per-rank memory limit (None = unlimited).

Times are in the cost model's unit; memory in its memory unit (uniform mode: one stash = 1).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

from ...ir import Action, Op, Payload
from ...ir.semantics import GRAD_WRITERS

__all__ = ["PATTERNS", "CrossPipeProblem", "pattern_units", "pattern_chunks", "ChunkScaledCost",
           "problem_from_cost"]

PATTERNS = ("ud", "wave", "loop")


def pattern_chunks(pattern: str, chunks: int | None = None) -> int:
    """Units per rank of a traversal pattern: ud 1, wave 2, loop ``chunks`` (default 2)."""
    if pattern == "ud":
        if chunks not in (None, 1):
            raise ValueError(f"pattern 'ud' has one chunk per rank (got chunks={chunks})")
        return 1
    if pattern == "wave":
        if chunks not in (None, 2):
            raise ValueError(f"pattern 'wave' has two chunks per rank (got chunks={chunks})")
        return 2
    if pattern == "loop":
        v = 2 if chunks is None else chunks
        if v < 2:
            raise ValueError(f"pattern 'loop' needs chunks >= 2 (got {v})")
        return v
    raise ValueError(f"unknown traversal pattern {pattern!r}; allowed: {', '.join(PATTERNS)}")


def pattern_units(pattern: str, stages: int, chunks: int | None = None) -> list[int]:
    """``unit_ranks[u]``: the rank that runs unit u under ``pattern`` (activation passing)."""
    v = pattern_chunks(pattern, chunks)
    if pattern == "ud":
        return list(range(stages))
    if pattern == "wave":
        return [u if u < stages else 2 * stages - 1 - u for u in range(2 * stages)]
    return [u % stages for u in range(stages * v)]


def _per_unit(name: str, value: float | Sequence[float], units: int) -> tuple[float, ...]:
    if isinstance(value, (int, float)):
        return (float(value),) * units
    out = tuple(float(x) for x in value)
    if len(out) != units:
        raise ValueError(f"{name} has {len(out)} entries for {units} units")
    return out


@dataclass(frozen=True)
class CrossPipeProblem:
    """One scheduling problem; every per-unit tuple has ``len(unit_ranks)`` entries."""

    stages: int
    """P: number of ranks."""
    microbatches: int
    """M: micro-batches per step."""
    pattern: str
    """Traversal pattern: "ud", "wave" or "loop"."""
    unit_ranks: tuple[int, ...]
    """Rank of each unit (the placement)."""
    tf: tuple[float, ...]
    """Forward time of unit u for one micro-batch."""
    td: tuple[float, ...]
    """Input-gradient (D) time of unit u."""
    tw: tuple[float, ...]
    """Weight-gradient (W) time of unit u (a sub-block ``i/n`` takes ``tw/n``)."""
    stash: tuple[float, ...]
    """Memory that F of unit u adds (the whole stash of one micro-batch)."""
    stash_w: tuple[float, ...]
    """Part of the stash D keeps for W; D frees ``stash - stash_w``, W frees ``stash_w``."""
    act_link: tuple[tuple[float, float], ...]
    """(occupancy, latency) of the activation of unit u sent to unit u+1's rank; U-1 entries."""
    grad_link: tuple[tuple[float, float], ...]
    """(occupancy, latency) of the gradient of unit u sent back from unit u+1's rank; U-1 entries."""
    act_buf: tuple[float, ...] = ()
    """Memory of a received activation of unit u (held from RECV to its consumer); () = 0."""
    grad_buf: tuple[float, ...] = ()
    """Memory of a received gradient of unit u (held from RECV to its consumer); () = 0."""
    memory_limit: tuple[float, ...] | None = None
    """Per-rank limit on the running memory sum (list order); None = unlimited."""
    opt_time: tuple[float, ...] = ()
    """Time of the optimizer step of unit u (appended after the rank's last compute); () = 0."""
    recompute: bool = False
    """The recompute case: F keeps ``kept[u]``, ``RECOMPUTE u m`` rebuilds the stash before D."""
    tr: tuple[float, ...] = ()
    """Time of RECOMPUTE of unit u (() = ``tf``)."""
    kept: tuple[float, ...] = ()
    """Memory F of unit u keeps for its RECOMPUTE (its boundary input); () = 0."""
    dp_time: tuple[float, ...] = ()
    """Time of unit u's gradient reduction on its rank's group queue (DP overlap); () = 0 (no DP)."""
    gather_time: tuple[float, ...] = ()
    """Time of the all-gather of unit u's weights over its replicas (ZeRO >= 1); () = 0."""
    gather_first: tuple[bool, ...] = ()
    """Whether unit u's gather precedes its first F (ZeRO 3) rather than following its optimizer
    step (ZeRO 1/2); () = all False."""
    meta: dict[str, Any] = field(default_factory=dict, compare=False)
    """Free-form facts for reports (delays, number of DCs, memory convention)."""

    def __post_init__(self) -> None:
        u = len(self.unit_ranks)
        if u < 1 or self.stages < 1 or self.microbatches < 1:
            raise ValueError("a problem needs at least one unit, stage and micro-batch")
        if any(not 0 <= r < self.stages for r in self.unit_ranks):
            raise ValueError(f"unit_ranks {self.unit_ranks} name a rank outside 0..{self.stages - 1}")
        for name in ("tf", "td", "tw", "stash", "stash_w"):
            if len(getattr(self, name)) != u:
                raise ValueError(f"{name} needs {u} entries")
        for name in ("act_link", "grad_link"):
            if len(getattr(self, name)) != u - 1:
                raise ValueError(f"{name} needs {u - 1} entries")
        for name in ("act_buf", "grad_buf", "opt_time", "kept", "dp_time", "gather_time"):
            if not getattr(self, name):
                object.__setattr__(self, name, (0.0,) * u)
        if not self.gather_first:
            object.__setattr__(self, "gather_first", (False,) * u)
        if not self.tr:
            object.__setattr__(self, "tr", self.tf)
        for name in ("tr", "kept", "dp_time", "opt_time", "act_buf", "grad_buf", "gather_time", "gather_first"):
            if len(getattr(self, name)) != u:
                raise ValueError(f"{name} needs {u} entries")
        if self.memory_limit is not None and len(self.memory_limit) != self.stages:
            raise ValueError(f"memory_limit needs one entry per rank ({self.stages})")
        if any(t <= 0 for t in self.tf + self.td + self.tw):
            raise ValueError("F, D and W times must be > 0 (the solver orders ops by start time)")

    # --- derived views ----------------------------------------------------------
    @property
    def units(self) -> int:
        return len(self.unit_ranks)

    @property
    def chunks(self) -> int:
        return self.units // self.stages

    def units_of(self, rank: int) -> list[int]:
        return [u for u, r in enumerate(self.unit_ranks) if r == rank]

    def limit(self, rank: int) -> float:
        return math.inf if self.memory_limit is None else self.memory_limit[rank]

    def with_limit(self, limit: float | Sequence[float] | None) -> "CrossPipeProblem":
        """A copy with another memory limit (scalar = the same on every rank)."""
        lim = None if limit is None else _per_unit("memory_limit", limit, self.stages)
        return CrossPipeProblem(**{**self.__dict__, "memory_limit": lim})

    def rebuild(self, unit: int) -> float:
        """What RECOMPUTE of ``unit`` adds (0 without recompute)."""
        return self.stash[unit] - self.kept[unit] if self.recompute else 0.0

    def finish(self, rank: int, compute_end: float, last_w_end: dict[int, float]) -> float:
        """End of ``rank``'s step: its gradient reductions run FIFO on the group queue in the order
        of their units' last W (``last_w_end[u]``), each after that W; its optimizer steps follow
        the last compute and every reduction."""
        t = 0.0
        for u in sorted(self.units_of(rank), key=lambda v: last_w_end.get(v, 0.0)):
            if self.dp_time[u] > 0:
                t = max(t, last_w_end[u]) + self.dp_time[u]
        return max(compute_end, t) + self.after_compute(rank)

    def gather_release(self, unit: int) -> float:
        """When ``unit``'s ZeRO-3 weight gather ends (0 without one): its rank's ZeRO-3 gathers run
        from the step's start one after another in unit order (the order of first use)."""
        if not (self.gather_first[unit] and self.gather_time[unit] > 0):
            return 0.0
        return sum(self.gather_time[u] for u in self.units_of(self.unit_ranks[unit])
                   if u <= unit and self.gather_first[u])

    def after_compute(self, rank: int) -> float:
        """What follows ``rank``'s last compute and reduction: its optimizer steps in unit order,
        each unit's ZeRO 1/2 weight gather on the group queue once its step ran (FIFO)."""
        t = g = 0.0
        for u in self.units_of(rank):
            t += self.opt_time[u]
            if self.gather_time[u] > 0 and not self.gather_first[u]:
                g = max(g, t) + self.gather_time[u]
        return max(t, g)

    def delta(self, op: Op, unit: int, sub: tuple[int, int] | None = None) -> float:
        """Change of the running memory sum after one compute action."""
        if op is Op.F:
            return self.kept[unit] if self.recompute else self.stash[unit]
        if op is Op.RECOMPUTE:
            return self.rebuild(unit)
        if op is Op.D:
            return -(self.stash[unit] - self.stash_w[unit])
        if op is Op.W:
            return -self.stash_w[unit] if sub is None or sub[0] == sub[1] - 1 else 0.0
        if op is Op.B:
            return -self.stash[unit]
        return 0.0

    def in_buffer(self, op: Op, unit: int) -> float:
        """Memory of the received input an action consumes (0 when produced on its own rank)."""
        r = self.unit_ranks[unit]
        if op is Op.F and unit > 0 and self.unit_ranks[unit - 1] != r:
            return self.act_buf[unit - 1]
        if op in GRAD_WRITERS and unit < self.units - 1 and self.unit_ranks[unit + 1] != r:
            return self.grad_buf[unit]
        return 0.0

    def buffers(self, op: Op, unit: int) -> tuple[float, float, float]:
        """(consumed, kept, sent) activation/gradient buffers of one F or D (simulator accounting):
        ``consumed`` is the input it frees (received, or written by the rank's own previous
        unit), ``kept`` its output when the consumer is on the same rank (held until that
        consumer ran), ``sent`` its output when a SEND hands it over (held until the SEND)."""
        r, last = self.unit_ranks[unit], self.units - 1
        if op is Op.F:
            cons = self.act_buf[unit - 1] if unit > 0 else 0.0
            out, to = (self.act_buf[unit], unit + 1) if unit < last else (0.0, unit)
        elif op is Op.D:
            cons = self.grad_buf[unit] if unit < last else 0.0
            out, to = (self.grad_buf[unit - 1], unit - 1) if unit > 0 else (0.0, unit)
        else:
            return 0.0, 0.0, 0.0
        return (cons, out, 0.0) if self.unit_ranks[to] == r else (cons, 0.0, out)

    def duration(self, op: Op, unit: int, sub: tuple[int, int] | None = None) -> float:
        t = {Op.F: self.tf, Op.D: self.td, Op.W: self.tw, Op.RECOMPUTE: self.tr}[op][unit] if op is not Op.B \
            else self.td[unit] + self.tw[unit]
        return t / sub[1] if sub is not None else t


class ChunkScaledCost:
    """A cost model for V-chunk placements of the same model: compute times and stash
    sizes of one unit are ``1/V`` of ``base``'s, message and buffer sizes unchanged.

    Lets UD (V = 1), Wave and Loop (V = 2) schedules of one model share one time and
    memory scale (``UniformCost`` prices every unit alike whatever V is).
    """

    def __init__(self, base: Any, chunks: int) -> None:
        self.base, self.chunks = base, chunks

    def compute_time(self, action: Action, rank: int) -> float:
        t = self.base.compute_time(action, rank)
        return t if action.op is Op.OPT else t / self.chunks

    def message_bytes(self, payload: Payload, unit: int, num_mbs: int = 1) -> float:
        return self.base.message_bytes(payload, unit, num_mbs)

    def memory(self, kind: str, unit: int) -> float:
        m = self.base.memory(kind, unit)
        return m / self.chunks if kind in ("stash", "stash_w") else m

    def __repr__(self) -> str:
        return f"ChunkScaledCost({self.base!r}, chunks={self.chunks})"


def problem_from_cost(stages: int, microbatches: int, pattern: str, cost: Any, links: Any = None, *,
                      chunks: int | None = None, memory_limit: float | Sequence[float] | None = None,
                      count_buffers: bool = True, meta: dict | None = None, recompute: bool = False,
                      dp_time: float | Sequence[float] = 0.0, gather_time: Sequence[float] = (),
                      gather_first: Sequence[bool] = ()) -> CrossPipeProblem:
    """Resolve a pipert CostModel and LinkModel into a :class:`CrossPipeProblem`.

    ``links=None`` makes every transfer free. ``count_buffers`` counts received
    activation/gradient buffers against the memory limit (the simulator does). ``recompute``:
    the recompute case, RECOMPUTE and the kept input priced as the simulator prices them;
    ``dp_time``: each unit's gradient reduction time (scalar: the same for every unit);
    ``gather_time``, ``gather_first``: each unit's ZeRO weight gather (() = none).
    """
    from ...sim.values import kept_size
    unit_ranks = pattern_units(pattern, stages, chunks)
    n = len(unit_ranks)

    def t(op: Op, u: int) -> float:
        return float(cost.compute_time(Action(op, u, 0), unit_ranks[u]))

    def msg(payload: Payload, u: int, src: int, dst: int) -> tuple[float, float]:
        if src == dst or links is None:
            return (0.0, 0.0)
        occ, lat = links.transfer(src, dst, cost.message_bytes(payload, u, 1))
        return (float(occ), float(lat))

    act_link = tuple(msg(Payload.ACT, u, unit_ranks[u], unit_ranks[u + 1]) for u in range(n - 1))
    grad_link = tuple(msg(Payload.GRAD, u, unit_ranks[u + 1], unit_ranks[u]) for u in range(n - 1))
    buf = (lambda kind: tuple(float(cost.memory(kind, u)) for u in range(n))) if count_buffers \
        else (lambda kind: ())
    opt = tuple(float(cost.compute_time(Action(Op.OPT, unit=u), unit_ranks[u])) for u in range(n))
    lim = None if memory_limit is None else _per_unit("memory_limit", memory_limit, stages)
    return CrossPipeProblem(
        stages, microbatches, pattern, tuple(unit_ranks),
        tuple(t(Op.F, u) for u in range(n)), tuple(t(Op.D, u) for u in range(n)),
        tuple(t(Op.W, u) for u in range(n)),
        tuple(float(cost.memory("stash", u)) for u in range(n)),
        tuple(float(cost.memory("stash_w", u)) for u in range(n)),
        act_link, grad_link, buf("act"), buf("grad"), lim, opt, recompute=recompute,
        tr=tuple(t(Op.RECOMPUTE, u) for u in range(n)), kept=tuple(float(kept_size(cost, u)) for u in range(n)),
        dp_time=_per_unit("dp_time", dp_time, n), gather_time=tuple(gather_time),
        gather_first=tuple(bool(x) for x in gather_first), meta=dict(meta or {}))
