"""Greedy CrossPipe schedules: CrossUDSub (paper §4.2, Algorithm 1) and its Wave variant.

One event-driven loop serves every traversal pattern (the data dependencies come from the
placement: F u -> F u+1, F of the last unit -> its D, D u -> D u-1, D u -> W u):

1. pick the rank with the earliest *schedulable time* = max(end of its last op, earliest
   availability of an op it may run now); ties go to the lower rank;
2. on it, among the ops available at that time pick by priority:
   - F and D both available: alternate with the last F/D block run on this rank
     (steady state); only F arrives during warm-up, only D and W remain in tear-down;
   - F and D blocked by the memory limit (or flow control), or nothing else available: one W sub-block
     (the oldest pending W, so every W runs in micro-batch order);
   - among several F (or D) of different units (Wave, Loop): the higher unit first,
     then the lower micro-batch;
3. schedule it: F and D run as whole blocks; W runs one sub-block (``tw/n_sub``) at a
   time, so a W delays an arriving F or D by at most one sub-block. A block starts when
   the simulator starts it: at max(end of the rank's previous op, its input ready). The
   throttle (``GreedyConfig.throttle``) only decides *when a block may be chosen*, never
   holds a chosen block back: a lowered schedule has no way to express a deliberate
   delay, and the simulator runs every compute as soon as its queue and inputs allow;
4. when a block finishes, its message (if the next unit is on another rank) is issued on
   its directed link (src, dst): it starts at s_k = max(producer end, link_free[(src, dst)])
   -- per-link FIFO, links independent of each other (docs/semantics.md, "The three queues
   and time") --, occupies the link for its occupancy and arrives its latency later.

Lowering (:mod:`.lowering`) puts each SEND right after its producer and each RECV right
after the last compute of the receiver that ends no later than s_k (before the first one
ending after s_k): both are posted by s_k, so neither delays a transfer, and the simulator
starts every transfer at the model's s_k (per link, s_k follows producer order, so the
SEND, RECV and transfer orders of a link agree).

Memory is the simulator's list-order running sum of that program, kept per rank: ``mem``
= the sum after the last placed action; ``lo``/``hi`` = the levels right before / right
after each compute (``hi`` with its sent output, which its SEND frees right after). A
compute changes it by its stash change minus the buffer it consumes plus the output it
keeps on the rank (:meth:`.model.CrossPipeProblem.buffers`). Issued messages whose RECV
is not placed yet wait in ``pending`` (each with s_k >= end of the rank's last compute);
scheduling a compute that ends at fin first places every pending buffer with s_k < fin.
A message issued while the receiver's last compute ends after s_k belongs before it
(retroactive): every level from there on grows by its buffer; if that would break the
limit, the RECV goes right after that compute instead and s_k = its end.

Admission keeps ``held`` = mem + pending buffers within the limit, so placing them later
never breaks it:
- an F keeps held + committed + free gradient slots <= limit: a micro-batch entering a
  rank (F of its first unit) commits the stash of all the rank's units (later chunks
  never wait for memory: no Wave/Loop deadlock), and every unit X whose D reads a
  gradient from another rank has a slot, taken from such a gradient's arrival until the
  local D chain it feeds (D X, D X-1, ... on this rank) has run; a free slot keeps room
  for one gradient, so a D can always receive its input;
- an F also keeps room for the rank's D that sends more than it frees (the last unit's D
  reads no buffer but sends a gradient), less what its pending Ws free; the free gradient
  slots share that room;
- flow control: a buffer counts on its receiver from s_k on, so an F or D whose message
  crosses ranks is admitted only if the receiver can take the buffer now and then run its
  consumer (a gradient beyond its slot also needs room besides the free slots); an
  activation also leaves room for the gradients other micro-batches owe to free slots
  (their F of the stream ran; its own micro-batch's comes only after it is consumed).
These make a larger limit no harder for the unidirectional placement (property-tested);
Wave and Loop can still get stuck at some limits above one that runs.
The greedy raises ValueError when no rank can run anything (limit too small).

Invariants of the result: every F, D and W of one unit runs in micro-batch order (the
solver's same-type ordering constraint holds for the greedy solution); every directed link
carries its messages in producer order; the running memory of every rank stays within the
limit; timeline, message starts and peak memory equal ``pipert.sim.simulate`` of the
lowered schedule.
"""
from __future__ import annotations

import dataclasses
import math
import time
from collections import deque
from dataclasses import dataclass, field

from ...ir import Action, Op
from .lowering import Key, RecvAt, place_receives
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
    flush_w: bool = False
    """DP overlap: once a unit with a gradient reduction (``dp_time > 0``) has run its last D, its
    pending W sub-blocks go before any other op of the rank, so its reduction starts early and
    overlaps the rank's remaining backward (:func:`greedy_best` tries both when the problem has
    reductions)."""
    throttle: str = "fd"
    """Blocks whose message has link occupancy may be chosen only once the message could
    leave as they finish (no backlog on its directed link, which would hold back the link's
    later messages), so other ready work goes first; a chosen block still starts as soon
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
    """Per-rank compute orders with their times, message times, receive positions, cost."""

    timeline: list[list[Timed]]
    """``timeline[r]``: rank r's compute actions in order, with times."""
    makespan: float
    """Predicted makespan: max over ranks of :meth:`.model.CrossPipeProblem.finish` (the last compute
    end or the last gradient reduction's, plus the optimizer steps and ZeRO 1/2 gathers)."""
    runtime_s: float
    """Wall time the greedy took."""
    messages: dict[Key, tuple[float, float]] = field(default_factory=dict)
    """("act"|"grad", unit, mb) -> (start s_k, arrival) of every cross-rank message."""
    recv_at: RecvAt = field(default_factory=list)
    """Per rank, its RECVs in list order as (key, computes before it): :func:`.lowering.place_receives`."""
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
    # gradient slots: every unit X whose D reads a gradient from another rank is a stream of its
    # rank; a slot is taken from such a gradient's arrival until the local D chain it feeds
    # (D X, D X-1, ... while the next one is on the same rank) has run. The rank keeps room for
    # one gradient per free slot, so a D can always receive its gradient (no deadlock).
    streams = [[u for u in pr.units_of(r) if u < U - 1 and ranks[u + 1] != r] for r in range(P)]
    chain_end: dict[int, int] = {}                 # unit v -> stream X whose chain D v ends
    for r in range(P):
        for x in streams[r]:
            v = x
            while v > 0 and ranks[v - 1] == r:
                v -= 1
            chain_end[v] = x
    slots: list[dict[int, int]] = [{x: 0 for x in streams[r]} for r in range(P)]   # X -> gradients taking it
    owed: list[dict[int, set]] = [{x: set() for x in streams[r]} for r in range(P)]  # X -> mbs: F X ran, gradient not issued
    # a micro-batch entering a rank (F of the rank's first unit) commits the stash of all
    # the rank's units, so its later chunks never wait for memory (no Wave/Loop deadlock)
    first_unit = [min(pr.units_of(r)) for r in range(P)]
    hold = [pr.delta(Op.F, u) for u in range(U)]           # what F keeps (the kept input if recomputed)
    entry = [sum(hold[u] for u in pr.units_of(r)) for r in range(P)]
    committed = [0.0] * P
    io = {(op, u): pr.buffers(op, u) for op in (Op.F, Op.D) for u in range(U)}   # (consumed, kept, sent)
    # a D whose sent output outweighs the stash and input it frees (the last unit's: it reads no
    # buffer) raises the level while it runs; every F keeps that room, less what the rank's
    # pending Ws will free (always admissible, they run when nothing else can), so a D can run.
    # The free gradient slots share it: a D that reads a received gradient frees more than it
    # sends, so it runs whenever its gradient is there and gives the room back
    # With recompute the D block is RECOMPUTE then D: it first rises by the rebuilt stash, which
    # every F also keeps room for beside the free gradient slots.
    d_net = [pr.delta(Op.D, u) - io[(Op.D, u)][0] + io[(Op.D, u)][1] + io[(Op.D, u)][2] for u in range(U)]
    d_rise = [pr.rebuild(u) + max(0.0, d_net[u]) for u in range(U)]
    d_room = [max([0.0] + [d_rise[u] for u in pr.units_of(r)]) for r in range(P)]
    rb_room = [max([0.0] + [pr.rebuild(u) for u in pr.units_of(r)]) for r in range(P)]
    d_time = [pr.td[u] + (pr.tr[u] if pr.recompute else 0.0) for u in range(U)]   # the D block's length
    ready_f: list[list[tuple[float, int, int]]] = [[] for _ in range(P)]       # (avail, unit, mb)
    ready_d: list[list[tuple[float, int, int]]] = [[] for _ in range(P)]
    pend_w: list[deque] = [deque() for _ in range(P)]          # [unit, mb, next sub-block]
    end = [0.0] * P
    release = [pr.gather_release(u) for u in range(U)]      # ZeRO 3: F waits for the unit's gather
    last_fd: list[Op | None] = [None] * P
    timeline: list[list[Timed]] = [[] for _ in range(P)]
    # list-order memory: mem = level after the rank's last placed action; lo[r][i] / hi[r][i]
    # = level right before / right after compute i (hi counts its sent output)
    mem = [0.0] * P
    peak = [0.0] * P
    lo: list[list[float]] = [[] for _ in range(P)]
    hi: list[list[float]] = [[] for _ in range(P)]
    pending: list[list[tuple[float, float]]] = [[] for _ in range(P)]   # (s_k, buffer), s_k >= end[r]
    held = [0.0] * P        # mem + pending buffers: the level if every issued RECV stood now; <= limit
    link_free: dict[tuple[int, int], float] = {}
    messages: dict[Key, tuple[float, float]] = {}
    peers = [sorted({ranks[v] for u in pr.units_of(r) for v in (u - 1, u + 1) if 0 <= v < U} - {r})
             for r in range(P)]
    for m in range(M):
        ready_f[ranks[0]].append((0.0, 0, m))

    def free_slots(r: int) -> float:
        return sum(pr.grad_buf[x] for x, n in slots[r].items() if n == 0)

    def owed_slots(r: int, m: int) -> float:
        """Free slots whose gradient a micro-batch other than m will send (its F of the stream
        ran); m's own comes only after the activation of m that asks is consumed."""
        return sum(pr.grad_buf[x] for x, n in slots[r].items() if n == 0 and owed[r][x] - {m})

    # admission counts every issued buffer (held), so placing them later never breaks the limit;
    # an F keeps held + committed + free_slots <= limit (room for the committed stashes and
    # one gradient per free slot)
    def f_mem(r: int, u: int, extra: float = 0.0) -> bool:
        cons, kept, sent = io[(Op.F, u)]
        h = held[r] + extra - cons + kept + hold[u]    # level once the F and its SEND ran
        if h + sent > lim[r]:
            return False
        c = committed[r] + (entry[r] - hold[u] if u == first_unit[r] else -hold[u])
        w_free = sum(pr.stash_w[w[0]] for w in pend_w[r])
        return h + c + max(free_slots(r) + rb_room[r], d_room[r] - w_free) <= lim[r]

    def d_mem(r: int, u: int, extra: float = 0.0) -> bool:
        # the level after RECOMPUTE (if any), then after D with its sent output
        h, rb = held[r] + extra, pr.rebuild(u)
        return (rb == 0 or h + rb <= lim[r]) and h + rb + d_net[u] <= lim[r]

    # flow control: a block whose message crosses ranks runs only if the receiver can take the
    # buffer now and then run its consumer
    def f_ok(r: int, u: int, m: int) -> bool:
        if not f_mem(r, u):
            return False
        if u == U - 1 or ranks[u + 1] == r:
            return True
        dst, b = ranks[u + 1], pr.act_buf[u]
        # while it waits for its F, the buffer leaves room for the gradients already on their
        # way to free slots (else the D that sends one could not run, nor free the F it feeds)
        return held[dst] + b + owed_slots(dst, m) <= lim[dst] and f_mem(dst, u + 1, b)

    def d_ok(r: int, u: int) -> bool:
        if not d_mem(r, u):
            return False
        if u == 0 or ranks[u - 1] == r:
            return True
        dst, b = ranks[u - 1], pr.grad_buf[u - 1]
        if held[dst] + b > lim[dst] or not d_mem(dst, u - 1, b):
            return False
        # a free slot was kept for it; a gradient beyond its slot needs room besides the others
        return slots[dst][u - 1] == 0 or held[dst] + b + committed[dst] + free_slots(dst) + rb_room[dst] <= lim[dst]

    thr_f = [("f" in config.throttle and u < U - 1 and ranks[u + 1] != ranks[u] and pr.act_link[u][0] > 0)
             for u in range(U)]
    thr_d = [("d" in config.throttle and u > 0 and ranks[u - 1] != ranks[u] and pr.grad_link[u - 1][0] > 0)
             for u in range(U)]

    def avail_f(r: int, a: float, u: int) -> float:
        return max(a, link_free.get((r, ranks[u + 1]), 0.0) - pr.tf[u]) if thr_f[u] else a

    def avail_d(r: int, a: float, u: int) -> float:
        return max(a, link_free.get((r, ranks[u - 1]), 0.0) - d_time[u]) if thr_d[u] else a

    def sched_time(r: int) -> float:
        best = end[r] if pend_w[r] else math.inf   # a W only frees memory: always admissible
        for a, u, m in ready_f[r]:
            t = avail_f(r, a, u)
            if t < best and f_ok(r, u, m):
                best = t
        for a, u, _ in ready_d[r]:
            t = avail_d(r, a, u)
            if t < best and d_ok(r, u):
                best = t
        return max(end[r], best)

    def run(r: int, act: Action, start: float, fin: float, delta: float, sent: float) -> None:
        """Append a compute to rank r: place the pending buffers it follows, then apply it."""
        keep = []
        for s, b in pending[r]:
            if s < fin:
                mem[r] += b
            else:
                keep.append((s, b))
        pending[r] = keep
        lo[r].append(mem[r])
        mem[r] += delta
        held[r] += delta
        hi[r].append(mem[r] + sent)
        peak[r] = max(peak[r], lo[r][-1], hi[r][-1])
        timeline[r].append(Timed(act, start, fin))
        end[r] = fin

    def issue(src: int, dst: int, key: Key, ready: float, link: tuple[float, float], buf: float) -> None:
        """Start message ``key`` on its link (the receiver has room: flow control admitted it)."""
        occ, lat = link
        s = max(ready, link_free.get((src, dst), 0.0))
        held[dst] += buf
        if end[dst] > s:
            # the receiver's last compute(s) end after s: the RECV belongs before the first of them
            tl = timeline[dst]
            j = len(tl)
            while j > 0 and tl[j - 1].end > s:
                j -= 1
            top = max(max(lo[dst][j:]), max(hi[dst][j:]), mem[dst]) + buf
            if top <= lim[dst]:
                for i in range(j, len(tl)):
                    lo[dst][i] += buf
                    hi[dst][i] += buf
                mem[dst] += buf
                peak[dst] = max(peak[dst], top)
            else:                                   # no room back there: RECV after the last compute
                s = end[dst]
                pending[dst].append((s, buf))
        else:
            pending[dst].append((s, buf))
        link_free[(src, dst)] = s + occ
        messages[key] = (s, s + occ + lat)
        kind, u, m = key
        if kind == "grad":
            slots[dst][u] += 1
            owed[dst][u].discard(m)
        (ready_f if kind == "act" else ready_d)[dst].append((s + occ + lat, u + 1 if kind == "act" else u, m))
        dirty.update(peers[dst])                    # their flow control reads dst's memory
        dirty.add(dst)

    dirty: set[int] = set()                         # ranks whose schedulable time may have changed
    flushing: set[int] = set()                      # units whose last D ran and whose reduction waits on W
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
        fs = [x for x in ready_f[r] if avail_f(r, x[0], x[1]) <= now and f_ok(r, x[1], x[2])]
        ds = [x for x in ready_d[r] if avail_d(r, x[0], x[1]) <= now and d_ok(r, x[1])]
        dirty.clear()
        dirty.add(r)
        dirty.update(peers[r])
        flush = [w for w in pend_w[r] if w[0] in flushing] if config.flush_w else []
        if (fs or ds) and not flush:
            if fs and ds:
                op = Op.F if config.prefer == "f" else Op.D if config.prefer == "d" or last_fd[r] is Op.F else Op.F
            else:
                op = Op.F if fs else Op.D
            item = min(fs if op is Op.F else ds, key=key_of)
            (ready_f if op is Op.F else ready_d)[r].remove(item)
            a, u, m = item
            # the throttle only steers the choice (other ops may go first); the block itself
            # starts as the simulator runs it: when the rank is free and its input is ready
            if op is Op.D and pr.recompute:
                # the paper's B under recompute: RECOMPUTE (it reads only the kept input, so it
                # runs as soon as the rank is free), then D once its gradient is there
                run(r, Action(Op.RECOMPUTE, u, m), end[r], end[r] + pr.tr[u], pr.rebuild(u), 0.0)
            start = max(end[r], a, release[u] if op is Op.F else 0.0)
            fin = start + pr.duration(op, u)
            cons, kept, sent = io[(op, u)]
            run(r, Action(op, u, m), start, fin, pr.delta(op, u) - cons + kept, sent)
            last_fd[r] = op
            done += 1
            if op is Op.F:
                if u in owed[r]:
                    owed[r][u].add(m)
                committed[r] += entry[r] - hold[u] if u == first_unit[r] else -hold[u]
                if u == U - 1:
                    ready_d[r].append((fin, u, m))
                elif ranks[u + 1] == r:
                    ready_f[r].append((fin, u + 1, m))
                else:
                    issue(r, ranks[u + 1], ("act", u, m), fin, pr.act_link[u], pr.act_buf[u])
            else:
                pend_w[r].append([u, m, 0])
                if m == M - 1 and pr.dp_time[u] > 0:
                    flushing.add(u)
                if u in chain_end:
                    slots[r][chain_end[u]] -= 1
                if u > 0:
                    if ranks[u - 1] == r:
                        ready_d[r].append((fin, u - 1, m))
                    else:
                        issue(r, ranks[u - 1], ("grad", u - 1, m), fin, pr.grad_link[u - 1], pr.grad_buf[u - 1])
        else:
            w = flush[0] if flush else pend_w[r][0]
            u, m, i = w
            sub = (i, n_sub) if n_sub > 1 else None
            start = end[r]
            run(r, Action(Op.W, u, m, sub=sub), start, start + pr.duration(Op.W, u, sub), pr.delta(Op.W, u, sub), 0.0)
            w[2] += 1
            done += 1
            if w[2] == n_sub:
                pend_w[r].remove(w)
        for q in dirty:
            cache[q] = sched_time(q)
    timeline = [_merge_w(tl, n_sub) for tl in timeline]
    last_w = {t.action.unit: t.end for tl in timeline for t in tl if t.action.op is Op.W}
    makespan = max((pr.finish(r, tl[-1].end, last_w) for r, tl in enumerate(timeline) if tl), default=0.0)
    # a RECV between two merged W pieces moves before the whole W: posted earlier (still by
    # s_k), and the pieces before the last change no memory, so the peak stays the same
    recv_at = place_receives(pr, [[t.action for t in tl] for tl in timeline], [[t.end for t in tl] for tl in timeline],
                             {k: v[0] for k, v in messages.items()})
    return GreedyResult(timeline, makespan, time.perf_counter() - t0, messages, recv_at, peak)


PORTFOLIO = ("alternate", "d", "f")
"""Steady-state rules :func:`greedy_best` tries (``GreedyConfig.prefer``), each also with
``flush_w`` when the problem has gradient reductions (DP overlap)."""


def greedy_best(problem: CrossPipeProblem, config: GreedyConfig = GreedyConfig(),
                portfolio: tuple[str, ...] = PORTFOLIO) -> GreedyResult:
    """The greedy under each steady-state rule of ``portfolio``; the shortest makespan wins
    (ties: the earlier rule). ``runtime_s`` is the total over all runs. A rule whose run
    gets stuck on the memory limit is skipped; if all do, the first one's error is raised."""
    best: GreedyResult | None = None
    total = 0.0
    err: ValueError | None = None
    flushes = (False, True) if any(problem.dp_time) else (config.flush_w,)
    for rule, flush in ((r, f) for r in portfolio for f in flushes):
        try:
            g = greedy_schedule(problem, dataclasses.replace(config, prefer=rule, flush_w=flush))
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
