"""The zero-bubble authors' ZB-V auto-scheduler (Qi et al. 2024), as a reference.

A re-implementation of the greedy in ``megatron/core/pipeline_parallel/zerobubble/scheduler/
zbv.py`` of sail-sg/zero-bubble-pipeline-parallelism, kept step for step so that pipert's
``zb-v`` can be compared with it (tests, ``benchmarks/bench_zbv.py``). Its model: rank i
holds chunk 0 (unit i, down the V) and chunk 1 (unit 2P-1-i, back up); F, B (= pipert's D)
and W take fixed times, a message ``comm`` after its producer; a rank's memory changes by
``mem_f`` / ``mem_b`` / ``mem_w`` per F / B / W and never exceeds ``max_mem``
(default ``2 * P * mem_f``: 1F1B's activation memory). It

1. warms up: chunk-0 forwards, then chunk-1 forwards as they become ready, then both
   chunks alternately until each rank is as far as its predecessor;
2. runs ``2 M`` rounds of one B then one F per rank, putting pending W first when the
   next op would exceed ``max_mem`` or while it waits on its input anyway, and also when
   the wait would exceed the worst bubble so far (``fill_b`` / ``fill_f``: whether a B /
   F of chunk 0 may take such a W);
3. drains the remaining W.

A pass that ends with a smaller worst per-rank bubble than the bubbles it was allowed is
rerun with those as its allowance; the best of the four (fill_b, fill_f) variants wins.
Durations are in the caller's unit; with ``comm = 0`` the greedy's end times equal the
pipert simulator's with free links.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from ..ir import Action, Op

__all__ = ["ZBVGreedyResult", "zbv_greedy", "zbv_greedy_variants"]

_F, _B, _W = 0, 1, 2  # op categories; a B/W "chunk" c is model chunk 1-c (backward runs up the V)


@dataclass
class ZBVGreedyResult:
    """The greedy's schedule and its own timing."""

    ops: list[list[tuple[int, int, int]]]
    """Per rank, the greedy's own order: (category 0/1/2 = F/B/W, its chunk index, micro-batch)."""
    makespan: float
    """Largest end time in the greedy's model."""
    max_bubble: float
    """Worst per-rank idle time after the rank's first F (the greedy's objective)."""
    peak_memory: list[float]
    """Per rank, the largest running sum of mem_f/mem_b/mem_w."""

    @property
    def orders(self) -> list[list[Action]]:
        """Per rank, the compute order as pipert actions (F, D, W on the V-shape units)."""
        p = len(self.ops)
        out = []
        for i, ops in enumerate(self.ops):
            units = (i, 2 * p - 1 - i)
            out.append([Action((Op.F, Op.D, Op.W)[cat], units[chunk if cat == _F else 1 - chunk], mb)
                        for cat, chunk, mb in ops])
        return out


class _Pass:
    """One pass of the greedy (``try_v_schedule``)."""

    def __init__(self, p: int, m: int, cost: tuple[float, float, float], comm: float,
                 mem: tuple[float, float, float], max_mem: float, approved: list[float] | None) -> None:
        self.p, self.m, self.cost, self.comm, self.mem, self.max_mem = p, m, cost, comm, mem, max_mem
        self.approved = approved if approved is not None else [-1.0] * p
        self.count = [[0] * 6 for _ in range(p)]          # [rank][cat*2+chunk] ops put so far
        self.end: dict[tuple[int, int, int, int], float] = {}  # (cat, chunk, rank, mb) -> end time
        self.now = [0.0] * p
        self.level = [0.0] * p
        self.peak = [0.0] * p
        self.bubble = [0.0] * p
        self.pending_w: list[deque[int]] = [deque() for _ in range(p)]
        self.order: list[list[tuple[int, int, int]]] = [[] for _ in range(p)]

    def worst_bubble(self, rank: int = -1) -> float:
        worst = max(self.bubble)
        if rank >= 0:
            worst = max(worst, max(self.approved) - self.approved[rank])
        return worst

    def done(self, cat: int, chunk: int, rank: int, mb: int) -> bool:
        return (cat, chunk, rank, mb) in self.end

    def ready_at(self, cat: int, chunk: int, rank: int, mb: int) -> float:
        """End time of (cat, chunk, rank, mb); -1 when it has not been put."""
        return self.end.get((cat, chunk, rank, mb), -1.0)

    def put(self, cat: int, chunk: int, rank: int) -> None:
        mb = self.count[rank][cat * 2 + chunk]
        if mb >= self.m:
            raise AssertionError(f"rank {rank}: op {cat}/{chunk} past the last micro-batch")
        if self.level[rank] + self.mem[cat] > self.max_mem + 1e-9:
            raise ValueError(f"max_mem={self.max_mem} is too small for the greedy at P={self.p}, M={self.m}")
        free_end = self.now[rank] + self.cost[cat]
        end = free_end
        if cat < _W:
            peer = rank + 1 if chunk == 1 else rank - 1     # the previous hop of this op's data
            if 0 <= peer < self.p:
                dep = self.ready_at(cat, chunk, peer, mb)
                if dep < 0:     # the authors assert here: a cap below ~2P stalls the warm-up
                    raise ValueError(f"max_mem={self.max_mem} is too small for the greedy at P={self.p}, "
                                     f"M={self.m}: its warm-up needs the input of {'FB'[cat]} chunk {chunk} "
                                     f"m{mb} on rank {rank} before rank {peer} made it")
                end = max(end, dep + self.comm + self.cost[cat])
        if self.count[rank][0] > 0:
            self.bubble[rank] += end - free_end
        self.end[(cat, chunk, rank, mb)] = end
        self.now[rank] = end
        self.level[rank] += self.mem[cat]
        self.peak[rank] = max(self.peak[rank], self.level[rank])
        self.order[rank].append((cat, chunk, mb))
        if cat == _B:
            self.pending_w[rank].append(chunk)
        self.count[rank][cat * 2 + chunk] += 1

    def put_w(self, rank: int) -> None:
        if not self.pending_w[rank]:    # the authors assert here: the cap leaves no room
            raise ValueError(f"max_mem={self.max_mem} is too small for the greedy at P={self.p}, M={self.m}")
        self.put(_W, self.pending_w[rank].popleft(), rank)

    def warm_up(self) -> None:
        p, m, cnt = self.p, self.m, self.count
        for i in range(p):
            self.put(_F, 0, i)
        for i in range(p - 1, -1, -1):
            if i < p - 1:
                turn = self.ready_at(_F, 1, i + 1, 0) + self.comm
                while (self.level[i] + self.mem[_F] * (2 + 2 * i) <= self.max_mem
                       and self.now[i] + self.cost[_F] <= turn and cnt[i][0] < m):
                    for j in range(i + 1):
                        self.put(_F, 0, j)
            self.put(_F, 1, i)
        chunk = 0
        for i in range(1, p):
            while cnt[i][0] + cnt[i][1] < cnt[i - 1][0] + cnt[i - 1][1] or cnt[i][1] <= cnt[i - 1][1] < m:
                for j in range(p - 1, i - 1, -1):
                    if cnt[j][chunk] < m:
                        self.put(_F, chunk, j)
                chunk = 1 - chunk

    def backward_round(self, fill_b: bool) -> None:
        p, cnt = self.p, self.count
        for i in range(p):
            while self.level[i] + self.mem[_B] > self.max_mem:
                self.put_w(i)
        first, second = [], []      # B chunk 1 from the last rank down, then B chunk 0 upward
        for i in range(p):
            if cnt[i][3] >= cnt[i][2]:
                second.append(i)
            elif i == p - 1 or self.done(_B, 1, i + 1, cnt[i][3]) or cnt[i][2] >= self.m:
                first.append(i)
            else:
                second.append(i)
        for i, chunk in [(i, 1) for i in reversed(first)] + [(i, 0) for i in second]:
            upstream = None
            if chunk == 1 and i < p - 1:
                upstream = (_B, 1, i + 1, cnt[i][3])
            if chunk == 0 and i > 0:
                upstream = (_B, 0, i - 1, cnt[i][2])
            self.fill_w_for(i, upstream, chunk == 1 or fill_b)
            self.put(_B, chunk, i)

    def fill_w_for(self, rank: int, upstream: tuple[int, int, int, int] | None, allow: bool) -> None:
        """W passes before an op of ``rank`` whose input comes from ``upstream`` (None: the
        op has none): those that fit before the input arrives, then one more if ``allow``
        and the wait exceeds the rank's bubble budget. With no upstream the authors' code
        reads the end time of the last node of its table (W of chunk 1, last rank and
        micro-batch; -1 until it is put); kept as is."""
        w = self.cost[_W]
        while self.pending_w[rank] and upstream is not None and \
                self.ready_at(*upstream) + self.comm >= self.now[rank] + w:
            self.put_w(rank)
        dep = self.ready_at(*(upstream or (_W, 1, self.p - 1, self.m - 1)))
        if allow and self.pending_w[rank] and dep + self.comm - self.now[rank] > \
                self.worst_bubble(rank) - self.bubble[rank]:
            self.put_w(rank)

    def forward_round(self, fill_f: bool) -> None:
        p, m, cnt = self.p, self.m, self.count
        for i in range(p):
            if cnt[i][1] >= m:
                continue
            chunk = None
            if cnt[i][1] >= cnt[i][0]:
                chunk = 0
            elif i == p - 1 or self.done(_F, 1, i + 1, cnt[i][1]):
                chunk = 1
            elif cnt[i][0] < m and (i == 0 or self.done(_F, 0, i - 1, cnt[i][0])):
                chunk = 0
            if chunk is None:
                continue
            while self.level[i] + self.mem[_F] > self.max_mem:
                self.put_w(i)
            upstream = None
            if chunk == 0 and i > 0:
                upstream = (_F, 0, i - 1, cnt[i][0])
            if chunk == 1 and i < p - 1:
                upstream = (_F, 1, i + 1, cnt[i][1])
            self.fill_w_for(i, upstream, fill_f)
            self.put(_F, chunk, i)

    def run(self, fill_b: bool, fill_f: bool) -> "_Pass":
        self.warm_up()
        for _ in range(2 * self.m):
            self.backward_round(fill_b)
            self.forward_round(fill_f)
        for i in range(self.p):
            while self.pending_w[i]:
                self.put_w(i)
        return self


def _best_pass(p: int, m: int, cost: tuple[float, float, float], comm: float, mem: tuple[float, float, float],
               max_mem: float, fill_b: bool, fill_f: bool, approved: list[float] | None = None) -> _Pass:
    """One pass, rerun with its own bubbles as allowance while that lowers the worst bubble."""
    cur = _Pass(p, m, cost, comm, mem, max_mem, approved).run(fill_b, fill_f)
    allowed = max(cur.approved)
    if allowed < 0 or cur.worst_bubble() < allowed:
        nxt = _best_pass(p, m, cost, comm, mem, max_mem, fill_b, fill_f, cur.bubble)
        if nxt.worst_bubble() < cur.worst_bubble():
            return nxt
    return cur


def _check_shape(stages: int, microbatches: int) -> None:
    for name, v in (("stages", stages), ("microbatches", microbatches)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive integer (got {v!r})")


def _result(done: _Pass) -> ZBVGreedyResult:
    return ZBVGreedyResult(done.order, max(done.end.values()), done.worst_bubble(), list(done.peak))


def zbv_greedy_variants(stages: int, microbatches: int, *, f: float = 1.0, b: float = 1.0, w: float = 1.0,
                        comm: float = 0.0, mem_f: float = 2.0, mem_b: float = -1.0, mem_w: float = -1.0,
                        max_mem: float | None = None) -> list[ZBVGreedyResult]:
    """The greedy's result for each (fill_b, fill_f) in (T, T), (T, F), (F, T), (F, F);
    arguments as :func:`zbv_greedy`. ValueError if ``max_mem`` leaves the greedy no room."""
    _check_shape(stages, microbatches)
    limit = 2 * stages * mem_f if max_mem is None else max_mem
    return [_result(_best_pass(stages, microbatches, (f, b, w), comm, (mem_f, mem_b, mem_w), limit,
                                       fill_b, fill_f))
            for fill_b in (True, False) for fill_f in (True, False)]


def zbv_greedy(stages: int, microbatches: int, *, f: float = 1.0, b: float = 1.0, w: float = 1.0,
               comm: float = 0.0, mem_f: float = 2.0, mem_b: float = -1.0, mem_w: float = -1.0,
               max_mem: float | None = None) -> ZBVGreedyResult:
    """The authors' ZB-V order for P = ``stages``, M = ``microbatches``: of the four fill
    variants, the first with the smallest worst per-rank bubble (their choice).

    ``f``/``b``/``w``: times of F, D (their B) and W of one chunk; ``comm``: message time;
    ``mem_*``: memory change per op (``mem_f + mem_b + mem_w`` should be 0); ``max_mem``:
    per-rank limit (default ``2 * P * mem_f``). Units on rank i: ``i`` and ``2P-1-i``.
    """
    variants = zbv_greedy_variants(stages, microbatches, f=f, b=b, w=w, comm=comm, mem_f=mem_f, mem_b=mem_b,
                                   mem_w=mem_w, max_mem=max_mem)
    best = variants[0]
    for v in variants[1:]:
        if v.max_bubble < best.max_bubble:
            best = v
    return best
