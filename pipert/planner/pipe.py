"""One replica's pipeline, simulated: what the planner reads from ``pipert.sim.simulate``, and its
linear extrapolation in the micro-batch count for steps too large to simulate in the search.

Extrapolation: a step of M micro-batches whose (unit, micro-batch) pairs exceed the planner's
limit is simulated at m and m/2 micro-batches (the largest halvings of M under the limit that the
family accepts with m/2 >= P, 2P for :data:`STEADY`; without one under the limit, the smallest such
pair). Times are extended along the line through the two, and so is the peak memory of
:data:`PEAK_GROWS`; the others keep the larger step's peak. Past the warm-up each extra
micro-batch adds the same work to a steady schedule, and a peak that stopped growing (1F1B: P
stashes) stays put. Checked on 7B, P = 8, M = 64 for every family: from (32, 16) every makespan
within 0.3 % and every peak exact; from (16, 8) ZB-V 7 % short (hence :data:`STEADY`).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

from .layouts import PLAN_PAIR_LIMIT, PLAN_PAIRS, Layout, build_problem

__all__ = ["Pipe", "simulate_pipe", "sim_microbatches", "finish_times", "STEADY", "PEAK_GROWS"]

STEADY = {"zb-v": 2, "helixpipe": 2, "helixpipe-2fold": 2}
"""Families whose smaller step must hold 2P micro-batches (others: P) to be on the line: ZB-V's
makespan extrapolated from 16 and 8 at P = 8 was 7 % short, from 32 and 16 exact."""
PEAK_GROWS = ("helixpipe", "helixpipe-2fold")
"""Families whose peak memory grows with M (extended along the line); the others' peak is the
larger simulated step's (a line through 16 and 8 at P = 8 overstated interleaved's by 180 %)."""


@dataclass
class Pipe:
    """The pipeline of one replica (seconds and bytes per device)."""

    makespan: float
    busy: float
    """Compute seconds summed over the ranks."""
    peak: list[float]
    """Per rank, the simulator's peak (model states of held units not included)."""
    exposed: float
    """The worst rank's time waiting on communication."""
    finish: list[float]
    """Per rank, when its last compute before the optimizer step ends."""
    extrapolated_from: tuple[int, ...] = ()
    """The micro-batch counts simulated when the step itself was too large (else empty)."""

    @property
    def bubble(self) -> float:
        n = len(self.finish)
        return 1.0 - self.busy / (n * self.makespan) if self.makespan > 0 else 0.0


def sim_microbatches(lay: Layout) -> tuple[int, ...]:
    """The micro-batch counts to simulate ``lay`` at: (M,) when it fits the planner's limit, else
    (m, m/2) to extrapolate from (the largest under the limit, else the smallest there is), else (M,)
    up to 4x the limit, else ()."""
    limit = PLAN_PAIRS.get(lay.family, PLAN_PAIR_LIMIT)
    if lay.units * lay.microbatches <= limit:
        return (lay.microbatches,)
    def ok(m: int) -> bool:
        return build_problem(lay.family, lay.stages, m, lay.chunks) is None
    m, smallest = lay.microbatches, ()
    steady = lay.stages * STEADY.get(lay.family, 1)      # m/2 at least this
    while m % 2 == 0 and m // 4 >= steady:
        m //= 2
        if ok(m) and ok(m // 2):
            smallest = (m, m // 2)
            if lay.units * m <= limit:
                return smallest
    if not smallest and lay.units * lay.microbatches <= 4 * limit:
        return (lay.microbatches,)      # no steady pair below M: simulate M itself up to 4x the limit
    return smallest                     # over the limit, but cheaper than M itself


def simulate_pipe(lay: Layout, run: Callable[[Layout], tuple[Any, Any]]) -> Pipe | None:
    """The pipeline of ``lay``; ``run(layout)`` builds and simulates one (returns the schedule and
    the SimResult). None when ``lay`` is too large and cannot be extrapolated."""
    counts = sim_microbatches(lay)
    if not counts:
        return None
    pipes = [_pipe(*run(replace(lay, microbatches=m))) for m in counts]
    if len(pipes) == 1:
        return pipes[0]
    (a, ma), (b, mb) = zip(pipes, counts)
    M = lay.microbatches

    def line(x: float, y: float) -> float:   # x at ma, y at mb: the value at M
        return x + (x - y) * (M - ma) / (ma - mb)
    peak = [line(x, y) for x, y in zip(a.peak, b.peak)] if lay.family in PEAK_GROWS else a.peak
    return Pipe(line(a.makespan, b.makespan), line(a.busy, b.busy), peak,
                line(a.exposed, b.exposed), [line(x, y) for x, y in zip(a.finish, b.finish)], counts)


def _pipe(sched: Any, res: Any) -> Pipe:
    return Pipe(res.makespan, sum(res.busy), list(res.peak_memory), max(res.exposed_comm, default=0.0),
                finish_times(res.graph, res.times))


def finish_times(g: Any, times: Any) -> list[float]:
    """Per rank of graph ``g`` timed by ``times``, when its optimizer step may begin (0 without a
    compute): the later of the end of its last compute-queue action other than OPT and the start of
    the first OPT after it (which waits for gradients still arriving: weight passing's sums). A rank's
    compute-queue nodes run in list order, each starting after the one before ends (the engine's
    chain edges), so their ends never decrease along the list and the last such action's end is the
    latest; the data-parallel reduction ``replicate`` puts right before an OPT starts no earlier than
    that OPT could."""
    from ..ir.action import Op
    end0, dur = times.end0, g.dur
    out = []
    for acts, queues, nodes in zip(g.schedule.actions, g.queues, g.node_of):
        end, opt = 0.0, None
        for i in range(len(nodes) - 1, -1, -1):
            n = nodes[i]
            if n < 0 or queues[i] != "compute":
                continue
            if acts[i].op is Op.OPT:
                opt = end0[n] - dur[n]
            else:
                end = end0[n]
                break
        out.append(end if opt is None else max(end, opt))
    return out
