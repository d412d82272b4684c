"""Greedy CrossPipe schedules: CrossUDSub (paper §4.2, Algorithm 1) and its Wave variant.

One event-driven loop serves every traversal pattern (the data dependencies come from the
placement: F u -> F u+1, F of the last unit -> its D, D u -> D u-1, D u -> W u):

1. pick the rank with the earliest *schedulable time* = max(end of its last op, earliest
   availability of an op it may run now); ties go to the lower rank;
2. on it, among the ops available at that time pick by priority:
   - F and D both available: alternate with the last F/D block run on this rank
     (steady state); only F arrives during warm-up, only D and W remain in tear-down;
   - F and D blocked by the memory limit, or nothing else available: one W sub-block
     (the oldest pending W, so every W runs in micro-batch order);
   - among several F (or D) of different units (Wave, Loop): the higher unit first,
     then the lower micro-batch;
3. schedule it: F and D run as whole blocks; W runs one sub-block (``tw/n_sub``) at a
   time, so a W delays an arriving F or D by at most one sub-block. A block starts when
   the simulator starts it: at max(end of the rank's previous op, its input ready). The
   throttle (``GreedyConfig.throttle``) only decides *when a block may be chosen*, never
   holds a chosen block back: a lowered schedule has no way to express a deliberate
   delay, and the simulator runs every compute as soon as its queue and inputs allow;
4. when a block finishes, its message (if the next unit is on another rank) is issued:
   it starts when the producer ended, the sender's previous message left (send queue,
   FIFO in compute order) and the receiver's previously issued message left (receive
   queue, FIFO in issue order); it occupies both queues -- hence its directed link -- for
   its occupancy and arrives its latency later. This is the paper's range-based
   occupancy model restricted to what the simulator executes (docs/semantics.md): with
   in-order queues a message can only use the window after the previous one.

Memory follows the simulator's list-order rule with receives posted in issue order
(:mod:`.lowering`): consuming the k-th message a rank was sent posts every earlier one
still unposted, and each posted buffer counts until its consumer ran. An F is admitted
only if, after it, the rank keeps room for one incoming gradient and one incoming
activation buffer (so a later D can always be posted).

Invariants of the result: every F, D and W of one unit runs in micro-batch order (the
solver's same-type ordering constraint holds for the greedy solution); the running memory
of every rank stays within the limit; the timeline equals ``pipert.sim.simulate`` of the
lowered schedule.
"""
from __future__ import annotations

import dataclasses
import math
import time
from collections import deque
from dataclasses import dataclass, field

from ...ir import Action, Op
from .model import CrossPipeProblem

__all__ = ["GreedyConfig", "GreedyResult", "Timed", "greedy_schedule", "greedy_best", "PORTFOLIO"]

_EPS = 1e-9


@dataclass(frozen=True)
class GreedyConfig:
    """Options of the greedy."""

    sub_blocks: int = 4
    """n_sub: W blocks are split into this many sub-blocks (1 = whole blocks)."""
    prefer: str = "alternate"
    """F and D both available: "alternate" with the rank's last F/D block (paper's steady
    state), "d" always D first (1F1B-like), "f" always F first (memory permitting)."""
    chunk_order: str = "unit"
    """Among several available F (or D) of one rank: "unit" = higher unit first, then lower
    micro-batch; "mb" = lower micro-batch first, then higher unit."""
    throttle: str = "fd"
    """Blocks whose message has link occupancy may be chosen only once the message could
    leave as they finish (no backlog in the send queue, which would hold back the rank's
    other messages), so other ready work goes first; a chosen block still starts as soon
    as the rank and its input are ready (as the simulator runs it). "f" for F blocks,
    "fd" for F and D, "" never."""


@dataclass(frozen=True)
class Timed:
    """One compute action with its start and end time in the greedy's timeline."""

    action: Action
    start: float
    end: float


@dataclass
class GreedyResult:
    """Per-rank compute orders with their times, message orders, and the greedy's cost."""

    timeline: list[list[Timed]]
    """``timeline[r]``: rank r's compute actions in order, with times."""
    makespan: float
    """Predicted makespan: max over ranks of the last compute end plus its optimizer steps."""
    runtime_s: float
    """Wall time the greedy took."""
    messages: dict = field(default_factory=dict)
    """("act"|"grad", unit, mb) -> (start, arrival) of every cross-rank message."""
    recv_order: list[list[tuple]] = field(default_factory=list)
    """Per rank, the keys of the messages it receives, in receive-queue order."""
    peak_memory: list[float] = field(default_factory=list)
    """Per rank, peak running memory (simulator accounting)."""

    @property
    def orders(self) -> list[list[Action]]:
        return [[t.action for t in tl] for tl in self.timeline]


def greedy_schedule(problem: CrossPipeProblem, config: GreedyConfig = GreedyConfig()) -> GreedyResult:
    """Run the greedy on ``problem``.

    Raises ValueError when the memory limit leaves a rank no runnable op (too small a limit).
    """
    t0 = time.perf_counter()
    pr = problem
    P, M, U = pr.stages, pr.microbatches, pr.units
    n_sub = config.sub_blocks
    if n_sub < 1:
        raise ValueError(f"sub_blocks must be >= 1 (got {n_sub})")
    ranks = pr.unit_ranks
    lim = [pr.limit(r) * (1 + 1e-12) + _EPS for r in range(P)]      # limits with a rounding tolerance
    # room an F must leave for posting one incoming gradient (so a D can always run)
    reserve = [max((pr.grad_buf[u] for u in pr.units_of(r) if u < U - 1 and ranks[u + 1] != r), default=0.0)
               for r in range(P)]
    # a micro-batch entering a rank (F of the rank's first unit) commits the stash of all
    # the rank's units, so its later chunks never wait for memory (no Wave/Loop deadlock)
    first_unit = [min(pr.units_of(r)) for r in range(P)]
    entry = [sum(pr.stash[u] for u in pr.units_of(r)) for r in range(P)]
    committed = [0.0] * P
    # ready lists hold (avail, unit, mb, inbox index or -1)
    ready_f: list[list[tuple[float, int, int, int]]] = [[] for _ in range(P)]
    ready_d: list[list[tuple[float, int, int, int]]] = [[] for _ in range(P)]
    pend_w: list[deque] = [deque() for _ in range(P)]          # [unit, mb, next sub-block]
    end = [0.0] * P
    mem = [0.0] * P
    peak = [0.0] * P
    last_fd: list[Op | None] = [None] * P
    timeline: list[list[Timed]] = [[] for _ in range(P)]
    send_free = [0.0] * P
    recv_free = [0.0] * P
    inbox: list[list[tuple]] = [[] for _ in range(P)]          # message keys in receive order
    inbuf: list[list[float]] = [[0.0] for _ in range(P)]       # prefix sums of their buffer sizes
    posted = [0] * P
    messages: dict = {}
    for m in range(M):
        ready_f[ranks[0]].append((0.0, 0, m, -1))

    def extra(r: int, k: int) -> float:
        """Buffers that consuming inbox message k posts now (it and every earlier unposted one)."""
        return inbuf[r][k + 1] - inbuf[r][posted[r]] if k >= posted[r] else 0.0

    def f_ok(r: int, u: int, k: int) -> bool:
        lvl = mem[r] + (extra(r, k) if k >= 0 else 0.0)
        own = pr.act_buf[u - 1] if k >= 0 else 0.0
        if u != first_unit[r]:
            return lvl <= lim[r] and lvl - own + pr.stash[u] <= lim[r]
        return lvl <= lim[r] and lvl - own + entry[r] + committed[r] + reserve[r] <= lim[r]

    def d_ok(r: int, k: int) -> bool:
        return k < 0 or mem[r] + extra(r, k) <= lim[r]

    thr_f = [("f" in config.throttle and u < U - 1 and ranks[u + 1] != ranks[u] and pr.act_link[u][0] > 0)
             for u in range(U)]
    thr_d = [("d" in config.throttle and u > 0 and ranks[u - 1] != ranks[u] and pr.grad_link[u - 1][0] > 0)
             for u in range(U)]

    def avail_f(r: int, a: float, u: int) -> float:
        return max(a, send_free[r] - pr.tf[u]) if thr_f[u] else a

    def avail_d(r: int, a: float, u: int) -> float:
        return max(a, send_free[r] - pr.td[u]) if thr_d[u] else a

    def sched_time(r: int) -> float:
        best = end[r] if pend_w[r] else math.inf
        for a, u, _, k in ready_f[r]:
            a = avail_f(r, a, u)
            if a < best and f_ok(r, u, k):
                best = a
        for a, u, _, k in ready_d[r]:
            a = avail_d(r, a, u)
            if a < best and d_ok(r, k):
                best = a
        return max(end[r], best)

    def issue(src: int, dst: int, key: tuple, ready: float, link: tuple[float, float], buf: float) -> tuple:
        occ, lat = link
        s = max(ready, send_free[src], recv_free[dst])
        send_free[src] = recv_free[dst] = s + occ
        messages[key] = (s, s + occ + lat)
        inbox[dst].append(key)
        inbuf[dst].append(inbuf[dst][-1] + buf)
        return s + occ + lat, len(inbox[dst]) - 1

    def post(r: int, k: int) -> None:
        if k >= posted[r]:
            mem[r] += extra(r, k)
            posted[r] = k + 1
            peak[r] = max(peak[r], mem[r])

    key_of = (lambda x: (-x[1], x[2])) if config.chunk_order == "unit" else (lambda x: (x[2], -x[1]))
    cache = [sched_time(r) for r in range(P)]
    done, total = 0, M * U * (2 + n_sub)
    while done < total:
        r = min(range(P), key=cache.__getitem__)
        now = cache[r]
        if now == math.inf:
            stuck = [q for q in range(P) if ready_f[q] or ready_d[q]]
            raise ValueError(f"greedy: memory limit {pr.memory_limit} too small: ranks {stuck} cannot run any "
                             f"available op")
        fs = [x for x in ready_f[r] if avail_f(r, x[0], x[1]) <= now and f_ok(r, x[1], x[3])]
        ds = [x for x in ready_d[r] if avail_d(r, x[0], x[1]) <= now and d_ok(r, x[3])]
        dirty = {r}
        if fs or ds:
            if fs and ds:
                op = Op.F if config.prefer == "f" else Op.D if config.prefer == "d" or last_fd[r] is Op.F else Op.F
            else:
                op = Op.F if fs else Op.D
            item = min(fs if op is Op.F else ds, key=key_of)
            (ready_f if op is Op.F else ready_d)[r].remove(item)
            a, u, m, k = item
            # the throttle only steers the choice (other ops may go first); the block itself
            # starts as the simulator runs it: when the rank is free and its input is ready
            start = max(end[r], a)
            fin = start + pr.duration(op, u)
            timeline[r].append(Timed(Action(op, u, m), start, fin))
            end[r] = fin
            last_fd[r] = op
            done += 1
            if k >= 0:
                post(r, k)
            own = (pr.act_buf[u - 1] if op is Op.F else pr.grad_buf[u]) if k >= 0 else 0.0
            mem[r] += pr.delta(op, u) - own
            if op is Op.F:
                committed[r] += entry[r] - pr.stash[u] if u == first_unit[r] else -pr.stash[u]
            peak[r] = max(peak[r], mem[r])
            if op is Op.F:
                if u == U - 1:
                    ready_d[r].append((fin, u, m, -1))
                elif ranks[u + 1] == r:
                    ready_f[r].append((fin, u + 1, m, -1))
                else:
                    dst = ranks[u + 1]
                    avail, idx = issue(r, dst, ("act", u, m), fin, pr.act_link[u], pr.act_buf[u])
                    ready_f[dst].append((avail, u + 1, m, idx))
                    dirty.add(dst)
            else:
                pend_w[r].append([u, m, 0])
                if u > 0:
                    if ranks[u - 1] == r:
                        ready_d[r].append((fin, u - 1, m, -1))
                    else:
                        dst = ranks[u - 1]
                        avail, idx = issue(r, dst, ("grad", u - 1, m), fin, pr.grad_link[u - 1], pr.grad_buf[u - 1])
                        ready_d[dst].append((avail, u - 1, m, idx))
                        dirty.add(dst)
        else:
            w = pend_w[r][0]
            u, m, i = w
            sub = (i, n_sub) if n_sub > 1 else None
            start = end[r]
            fin = start + pr.duration(Op.W, u, sub)
            timeline[r].append(Timed(Action(Op.W, u, m, sub=sub), start, fin))
            end[r] = fin
            mem[r] += pr.delta(Op.W, u, sub)
            w[2] += 1
            done += 1
            if w[2] == n_sub:
                pend_w[r].popleft()
        for q in dirty:
            cache[q] = sched_time(q)
    timeline = [_merge_w(tl, n_sub) for tl in timeline]
    makespan = max((tl[-1].end + sum(pr.opt_time[u] for u in pr.units_of(r))
                    for r, tl in enumerate(timeline) if tl), default=0.0)
    return GreedyResult(timeline, makespan, time.perf_counter() - t0, messages, inbox, peak)


PORTFOLIO = ("alternate", "d", "f")
"""Steady-state rules :func:`greedy_best` tries (``GreedyConfig.prefer``)."""


def greedy_best(problem: CrossPipeProblem, config: GreedyConfig = GreedyConfig(),
                portfolio: tuple[str, ...] = PORTFOLIO) -> GreedyResult:
    """The greedy under each steady-state rule of ``portfolio``; the shortest makespan wins
    (ties: the earlier rule). ``runtime_s`` is the total over all runs. A rule whose run
    gets stuck on the memory limit is skipped; if all do, the first one's error is raised."""
    best: GreedyResult | None = None
    total = 0.0
    err: ValueError | None = None
    for rule in portfolio:
        try:
            g = greedy_schedule(problem, dataclasses.replace(config, prefer=rule))
        except ValueError as e:
            err = err or e
            continue
        total += g.runtime_s
        if best is None or g.makespan < best.makespan - 1e-9:
            best = g
    if best is None:
        raise err if err is not None else ValueError("empty portfolio")
    best.runtime_s = total
    return best


def _merge_w(tl: list[Timed], n_sub: int) -> list[Timed]:
    """Fuse the n_sub sub-blocks of a W that ran back to back into one whole W."""
    if n_sub == 1:
        return tl
    out: list[Timed] = []
    i = 0
    while i < len(tl):
        a = tl[i].action
        if a.op is Op.W and a.sub == (0, n_sub) and i + n_sub <= len(tl) and all(
                tl[i + k].action.op is Op.W and tl[i + k].action.unit == a.unit and tl[i + k].action.mb == a.mb
                for k in range(n_sub)):
            out.append(Timed(Action(Op.W, a.unit, a.mb), tl[i].start, tl[i + n_sub - 1].end))
            i += n_sub
        else:
            out.append(tl[i])
            i += 1
    return out
