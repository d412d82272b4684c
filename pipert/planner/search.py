"""PipeMesh's planner (Eq. 6): buffer size q and recomputation set minimising T_iter under a
memory budget, and the same model evaluated for fixed schedules (Megatron, breadth-first).

F(o) picks, among the buffer sizes that fit when a pass stores ``o`` bytes, the one with the
least exposed DP time, ties to the largest q (the paper's "largest q that fits" whenever
T_DP^crit falls with q, which Eq. 2 makes the rule).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Sequence

from .pipemesh import (Components, QueuePlan, activation_memory, breadth_first_plan, iteration_time, live_passes,
                       megatron_plan, queue_plan, state_memory)
from .recompute import OpCost, Recompute, recompute_dp

__all__ = ["Plan", "plan", "plan_fixed", "candidate_queues", "runnable", "GiB"]

GiB = float(1 << 30)


@dataclass(frozen=True)
class Plan:
    """A chosen schedule with its predicted iteration time and memory."""

    name: str
    """"pipemesh", "megatron" or "breadth-first"."""
    components: Components
    queue: QueuePlan
    recompute: Recompute
    op_names: tuple[str, ...]
    """Names of the operations, in the order of ``recompute.recomputed``."""
    base_activation: float
    """Bytes every pass stores whatever is recomputed (the chunk's layer inputs)."""
    budget: float
    stage: int = 1
    time: dict[str, float] = field(default_factory=dict)
    memory: dict[str, float] = field(default_factory=dict)

    @property
    def recomputed(self) -> list[str]:
        return [n for n, r in zip(self.op_names, self.recompute.recomputed) if r]

    def as_dict(self) -> dict[str, Any]:
        c = self.components
        return {"schedule": self.name, "P": c.stages, "D": c.dp, "M": c.chunks, "B": c.microbatches,
                **self.queue.as_dict(), "live_passes": live_passes(self.queue.q, c.chunks, c.stages, c.microbatches, self.stage),
                "activation_per_pass": self.base_activation + self.recompute.stored,
                "recomputed": self.recomputed, "recompute_time_per_pass": self.recompute.recompute_time,
                "time": dict(self.time), "memory": dict(self.memory), "budget": self.budget}


@lru_cache(maxsize=4096)
def runnable(stages: int, chunks: int, microbatches: int, enqueue: tuple[int, ...],
             dequeue: tuple[int, ...]) -> bool:
    """Whether the pipemesh schedule of these sequences validates (no deadlock, every input
    produced before it is read): the generator and the validator decide."""
    from ..schedules import build_schedule
    try:
        build_schedule("pipemesh", stages=stages, microbatches=microbatches, chunks=chunks, enqueue=enqueue,
                       dequeue=dequeue)
    except ValueError:
        return False
    return True


def candidate_queues(c: Components) -> list[QueuePlan]:
    """For every q in [P, B]: queue_plan(q) if its sequences run, else the same q with the
    dequeue sequence equal to the enqueue one if that runs, else nothing."""
    out = []
    for q in range(c.stages, c.microbatches + 1):
        try:
            qp = queue_plan(c, q)
        except ValueError:
            continue
        shape = (c.stages, c.chunks, c.microbatches)
        if not runnable(*shape, qp.enqueue, qp.dequeue):
            qp = queue_plan(c, q, dequeue=qp.enqueue)
            if not runnable(*shape, qp.enqueue, qp.dequeue):
                continue
        out.append(qp)
    return out


def _limits(c: Components, queues: Sequence[QueuePlan], budget: float, base: float,
            stage: int) -> list[tuple[float, QueuePlan]]:
    """Per queue: stored bytes per pass must stay strictly below this for M_sum < budget."""
    out = []
    for qp in queues:
        room = budget - sum(state_memory(c, qp.sharding).values())
        out.append((room / live_passes(qp.q, c.chunks, c.stages, c.microbatches, stage) - base, qp))
    return out


def _finish(name: str, c: Components, qp: QueuePlan, rec: Recompute, ops: Sequence[OpCost], base: float,
            budget: float, stage: int) -> Plan:
    mem = state_memory(c, qp.sharding)
    mem["activations"] = activation_memory(c, qp.q, base + rec.stored, stage)
    mem["total"] = sum(mem.values())
    return Plan(name, c, qp, rec, tuple(o.name for o in ops), base, budget, stage,
                iteration_time(c, qp.dp_crit, rec.recompute_time), mem)


def _too_small(c: Components, limits: list[tuple[float, QueuePlan]], budget: float, base: float,
               stage: int, what: str) -> ValueError:
    need = []
    for _, qp in limits:
        mem = state_memory(c, qp.sharding)
        mem["activations"] = activation_memory(c, qp.q, base, stage)
        need.append((sum(mem.values()), qp.q, mem))
    total, q, mem = min(need, key=lambda t: t[0])
    parts = ", ".join(f"{k} {v / GiB:.3f}" for k, v in mem.items())
    return ValueError(f"memory budget {budget / GiB:.3f} GiB is below the minimum {total / GiB:.3f} GiB that "
                      f"{what} needs (q={q}, every operation recomputed; GiB: {parts})")


def _solve(name: str, c: Components, queues: Sequence[QueuePlan], ops: Sequence[OpCost], budget: float,
           base: float, stage: int) -> Plan:
    if not budget > 0:
        raise ValueError(f"memory budget={budget!r}: must be > 0 bytes")
    if base < 0:
        raise ValueError(f"base_activation={base!r}: must be >= 0 bytes")
    limits = _limits(c, queues, budget, base, stage)

    def pick(o: int) -> QueuePlan | None:
        fits = [qp for lim, qp in limits if o < lim]
        return min(fits, key=lambda qp: (qp.dp_crit, -qp.q)) if fits else None

    def dp_time(o: int) -> float | None:
        qp = pick(o)
        return None if qp is None else qp.dp_crit

    j = c.chunks * c.microbatches + c.stages - 1
    rec = recompute_dp(ops, dp_time, j)
    if rec is None:
        raise _too_small(c, limits, budget, base, stage, name)
    qp = pick(rec.stored)
    assert qp is not None
    return _finish(name, c, qp, rec, ops, base, budget, stage)


def plan(c: Components, ops: Sequence[OpCost], budget: float, base_activation: float = 0.0,
         stage: int = 1) -> Plan:
    """PipeMesh: the q and recomputation set of least T_iter with M_sum < ``budget`` (bytes) on
    ``stage`` (1-indexed; stage 1 holds the most passes). ``ops``: one chunk's operations."""
    queues = candidate_queues(c)
    if not queues:
        raise ValueError(f"no buffer size in [P, B] = [{c.stages}, {c.microbatches}] gives sequences "
                         f"whose groups are all >= P")
    return _solve("pipemesh", c, queues, ops, budget, base_activation, stage)


def plan_fixed(kind: str, c: Components, ops: Sequence[OpCost], budget: float, base_activation: float = 0.0,
               stage: int = 1) -> Plan:
    """A fixed schedule under the same budget, with recomputation chosen by the same DP:
    ``megatron`` (e = d = (P, ...), ZeRO-1) or ``breadth-first`` (q = B)."""
    makers = {"megatron": megatron_plan, "breadth-first": breadth_first_plan}
    if kind not in makers:
        raise ValueError(f"schedule {kind!r}; allowed: {', '.join(makers)}")
    return _solve(kind, c, [makers[kind](c)], ops, budget, base_activation, stage)
