"""Zero-bubble schedules (Qi et al. 2024): ZB-H1 and ZB-V.

Both split every backward into D (input gradient, on the critical path) and W (weight
gradient, free to move). W of (u, m) always follows D of (u, m) on the same rank.

ZB-H1: one chunk per rank, unit u on rank u. Same warm-up as 1F1B; rank i holds back
i W passes (all of them when M <= i) and runs them after its last D, filling the
cool-down bubble. Rank i holds at most min(P-i, M) stashes between F and D plus its
deferred W parts, and never more than min(P, M) between F and W, so the peak over
ranks equals 1F1B's.

ZB-V: two chunks per rank in a V shape, unit u on rank u for u < P and on rank 2P-1-u
for u >= P (rank 0 holds the first and the last unit). The handcrafted ZB-V order (as in
``torch.distributed.pipelining.ScheduleZBVZeroBubble``) is built for max(M, 2P-1)
micro-batches and restricted to the first M, which keeps it deadlock-free because every
dependency stays inside one micro-batch; below 2P-1 micro-batches that leaves bubbles, so
``zb_v`` picks the fastest of it, the zero-bubble authors' greedy and pipert's
memory-aware V greedy within a memory limit (:mod:`.zbv_select`).
"""
from __future__ import annotations

from typing import Any

from ..ir import Action, Op, Schedule
from .registry import PipelineConfig, assemble, require_chunks

__all__ = ["zb_h1", "zb_v", "zb_v_handcrafted", "check_zb_h1", "check_zb_v", "zb_v_units"]


def check_zb_h1(config: PipelineConfig) -> None:
    """ZB-H1 runs any M >= 1 with one chunk per rank."""
    require_chunks("zb-h1", config, 1, 1)


def check_zb_v(config: PipelineConfig) -> None:
    """ZB-V runs any M >= 1 with exactly two chunks per rank."""
    require_chunks("zb-v", config, 2, 2)


def zb_h1(config: PipelineConfig) -> Schedule:
    """Handcrafted ZB-H1.

    Rank i: w = min(P-1-i, M) warm-up forwards; then for each remaining forward the step
    ``F, D`` followed by the W of the oldest pending D once i steps have passed; then the
    cool-down ``D`` (+ W under the same rule); then the held-back W passes.
    """
    check_zb_h1(config)
    p, m = config.stages, config.microbatches
    orders = []
    for i in range(p):
        warm = min(p - 1 - i, m)
        acts = [Action(Op.F, i, k) for k in range(warm)]
        next_w = 0
        for k in range(m):
            if k < m - warm:
                acts.append(Action(Op.F, i, warm + k))
            acts.append(Action(Op.D, i, k))
            if k >= i:
                acts.append(Action(Op.W, i, next_w))
                next_w += 1
        acts += [Action(Op.W, i, k) for k in range(next_w, m)]
        orders.append(acts)
    return assemble("zb-h1", config, list(range(p)), orders, split_backward=True)


def zb_v_units(stages: int) -> list[int]:
    """V-shape placement: ``rank[u] = u`` for u < P, ``2P-1-u`` for u >= P."""
    return [u if u < stages else 2 * stages - 1 - u for u in range(2 * stages)]


def _zb_v_rank(p: int, m: int, i: int) -> list[Action]:
    """ZB-V order of rank i for n = max(m, 2p-1) micro-batches, restricted to the first m."""
    n = max(m, 2 * p - 1)
    u0, u1 = i, 2 * p - 1 - i            # chunk 0 (down the V) and chunk 1 (back up)
    f0 = f1 = d0 = d1 = 0
    acts: list[Action] = []
    for _ in range(2 * (p - i) - 1):     # warm-up 1: chunk-0 forwards
        acts.append(Action(Op.F, u0, f0)); f0 += 1
    for _ in range(i):                   # warm-up 2: alternate chunk 1 and chunk 0
        acts.append(Action(Op.F, u1, f1)); f1 += 1
        acts.append(Action(Op.F, u0, f0)); f0 += 1
    for _ in range(p - i):               # warm-up 3: chunk-1 F D W
        acts += [Action(Op.F, u1, f1), Action(Op.D, u1, d1), Action(Op.W, u1, d1)]
        f1 += 1; d1 += 1
    while f1 < f0 or f0 < n:             # steady: [F0] D0 W0 F1 D1 W1
        if f0 < n:
            acts.append(Action(Op.F, u0, f0)); f0 += 1
        acts += [Action(Op.D, u0, d0), Action(Op.W, u0, d0)]; d0 += 1
        acts += [Action(Op.F, u1, f1), Action(Op.D, u1, d1), Action(Op.W, u1, d1)]
        f1 += 1; d1 += 1
    w0, w1 = d0, d1
    for _ in range(i):                   # cool-down 1: D of both chunks, W deferred
        acts.append(Action(Op.D, u0, d0)); d0 += 1
        acts.append(Action(Op.D, u1, d1)); d1 += 1
    for _ in range(p - i):               # cool-down 2: chunk-0 D with an older W0
        acts.append(Action(Op.D, u0, d0)); d0 += 1
        acts.append(Action(Op.W, u0, w0)); w0 += 1
    acts += [Action(Op.W, u1, k) for k in range(w1, d1)]
    acts += [Action(Op.W, u0, k) for k in range(w0, d0)]
    # invariant: every (unit, micro-batch < n) has exactly one F, D and W
    assert f0 == f1 == d0 == d1 == n, (f0, f1, d0, d1, n)
    return [a for a in acts if a.mb[0] < m]


def zb_v_handcrafted(config: PipelineConfig) -> list[list[Action]]:
    """Per-rank compute orders of the handcrafted ZB-V order."""
    check_zb_v(config)
    return [_zb_v_rank(config.stages, config.microbatches, i) for i in range(config.stages)]


def zb_v(config: PipelineConfig, *, cost: Any = None, links: Any = None, memory_limit: float | None = None,
         solver_time_limit: float | None = None, order: str = "best") -> Schedule:
    """ZB-V (V shape, 2 chunks per rank, D/W split): the fastest of the handcrafted order,
    the zero-bubble authors' greedy and pipert's memory-aware V greedy within
    ``memory_limit`` (see :mod:`.zbv_select`).

    ``cost`` (default: uniform, F = D = W = 1) and ``links`` (default: free) time the
    candidates; ``memory_limit`` is per rank in the cost model's memory unit (default: the
    handcrafted order's peak, 1F1B's activation memory); ``solver_time_limit`` (CP-SAT
    deterministic seconds, one worker) also tries CP-SAT and keeps a faster order it finds;
    ``order``: "best", or only "handcrafted", "greedy" (the authors') or "wave-greedy".
    """
    from .zbv_select import select_zb_v
    return select_zb_v(config, zb_v_handcrafted(config), zb_v_units(config.stages), cost=cost, links=links,
                       memory_limit=memory_limit, solver_time_limit=solver_time_limit, order=order)
