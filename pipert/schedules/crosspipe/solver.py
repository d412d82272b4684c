"""Optimal CrossPipe schedules: the paper's constraint model (§4.1) in OR-Tools CP-SAT.

Mapping of the paper's model onto pipert's execution model (docs/semantics.md):

- **Operations.** One fixed-size interval per compute (F, D, and W in ``sub_blocks``
  pieces, as in the greedy) on its rank, one per cross-rank message (size = its link
  occupancy, possibly 0). Time is integer: ``ticks_per_tf`` ticks per largest forward
  time; every duration is rounded to ticks (exact when inputs are multiples of a tick).
- **Dependencies** (paper constraint 1): message start s_k >= producer end; consumer
  start >= s_k + occupancy + latency ("latency follows the bandwidth interval").
- **No overlap** (constraint 2): NoOverlap per rank over its computes; NoOverlap per
  directed link over its messages (per-link FIFO; links are independent). The messages
  of one link start in the order of their producers (one order literal per pair of
  messages of different units on a link; same-unit messages are in micro-batch order), so
  the lowered SENDs -- each right after its producer -- and the link's RECVs (in s_k
  order) list the link's transfers in the solver's order.
- **Receives** stand by the model's timing (:func:`.lowering.place_receives`): right
  after the last compute of the receiver ending at or before s_k, so neither a SEND nor a
  RECV is posted after s_k and the simulator starts every transfer when the model does.
- **Memory** (constraint 3), in the simulator's list-order accounting of that program: a
  reservoir per rank whose positive changes happen at an op's start and negative ones at
  its end. A compute changes the level by ``stash change - consumed buffer + output kept
  on the rank`` plus, for the moment before its SEND, its sent output: F adds the stash,
  D frees ``stash - stash_w``, the last W piece frees ``stash_w``; the sum (with the sent
  output) is one change at the start if >= 0, else at the end, and the sent output leaves
  at the end. Each received buffer is added at s_k. A RECV stands before the first compute
  ending after s_k, so at every time the reservoir level is at most a list-order level and
  every list-order level is reached (one tick before the compute after it ends): the
  maxima agree, and the limit holds in the lowered program exactly when in the model.
- **Recompute case** (``problem.recompute``): one more interval ``RECOMPUTE u m`` per F, after
  that F and before its D, raising the level by the rebuilt stash at its start (F then keeps
  only its input); it need not touch its D, so it may fill a wait for the gradient.
- **DP overlap** (``problem.dp_time``): one interval per unit on its rank's group queue, after
  the unit's last W piece, the rank's reductions in the order of their last W (the list order
  of the ``crosspipe-overlap`` policy); the rank's optimizer steps and ZeRO 1/2 weight gathers
  follow them (``problem.after_compute``); a ZeRO-3 unit's first F follows its weight gather
  (``problem.gather_release``).
- **Same-type order** (constraint 4): F, D, W (and messages) of one unit run in
  micro-batch order; the greedy satisfies it, so its solution is a valid hint.
- **Objective**: ``"all"`` (default) minimises the makespan over all ranks -- what the
  simulator reports; ``"device0"`` is the paper's span of rank 0 (first start to last end).

The hint (default: the greedy; ``build.best_hint`` also tries the static counterpart) is
an upper bound; the solve stops at the time limit or the relative gap; if the search never
gets past the hint, the hint is returned (status "HINT"). Memory is integral in the
least common denominator of all sizes relative to the largest stash (exact for simple
fractions). Once the solver proves optimality, ``simulate`` of the emitted
schedule equals the objective; otherwise it is at most the objective (the simulator
starts every action as early as the orders allow).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

from ...ir import Action, Op, Schedule
from .greedy import GreedyConfig, GreedyResult, greedy_best
from .lowering import RecvAt, lower_crosspipe, place_receives
from .model import CrossPipeProblem

__all__ = ["SolverConfig", "SolverResult", "solve", "lower_bound"]


@dataclass(frozen=True)
class SolverConfig:
    """Options of the CP-SAT solve."""

    time_limit_s: float = 60.0
    """Wall-clock limit of the search."""
    deterministic_limit: float | None = None
    """CP-SAT's deterministic time limit (work units, about seconds on one core): with one
    worker, a search stopped by it returns the same schedule on every run; a search stopped by
    the wall clock need not."""
    workers: int = 2
    """CP-SAT search workers (threads)."""
    sub_blocks: int = 4
    """W pieces per block; equal to the greedy's so the greedy solution is a hint."""
    ticks_per_tf: int = 1000
    """Integer time resolution: ticks per largest forward time."""
    objective: str = "all"
    """"all": makespan over all ranks; "device0": span of rank 0 (paper §4.1)."""
    relative_gap: float = 0.0
    """Stop once (objective - bound) / objective <= this."""
    use_hint: bool = True
    """Seed with the greedy solution (hint and upper bound)."""
    seed: int = 0
    """CP-SAT random seed."""


@dataclass
class SolverResult:
    """The best schedule found and what the solver proved about it."""

    orders: list[list[Action]]
    """Per-rank compute orders."""
    recv_at: RecvAt
    """Per rank, its RECVs in list order as (key, computes before it)."""
    makespan: float
    """Objective of the incumbent in time units (all-rank makespan for ``objective="all"``)."""
    bound: float
    """Best proven lower bound on the objective, in time units."""
    status: str
    """CP-SAT status name: OPTIMAL, FEASIBLE, ..."""
    runtime_s: float
    """Wall time of the solve (model building excluded)."""
    greedy: GreedyResult | None
    """The greedy solution used as hint, if any."""

    @property
    def gap(self) -> float:
        """Relative gap (objective - bound) / objective; 0 when proven optimal."""
        return 0.0 if self.makespan <= 0 else max(0.0, (self.makespan - self.bound) / self.makespan)

    def schedule(self, problem: CrossPipeProblem, name: str = "crosspipe-optimal", meta: dict | None = None) -> Schedule:
        info = {"predicted_makespan": self.makespan, "bound": self.bound, "gap": self.gap, "status": self.status,
                "solver_s": round(self.runtime_s, 3), **(meta or {})}
        return lower_crosspipe(problem, self.orders, self.recv_at, name=name, meta=info)


class _Model:
    """CP-SAT variables of one problem (see the module doc for the constraints)."""

    def __init__(self, pr: CrossPipeProblem, cfg: SolverConfig, horizon: float | None) -> None:
        self.pr, self.cfg = pr, cfg
        from ortools.sat.python import cp_model   # the solver loads only when a model is built
        self.scale = cfg.ticks_per_tf / max(pr.tf)
        self.m = cp_model.CpModel()
        n = cfg.sub_blocks
        self.n_sub = n
        ops = (Op.F, Op.D, Op.W) + ((Op.RECOMPUTE,) if pr.recompute else ())
        serial = sum(pr.duration(op, u) for op in ops for u in range(pr.units)) * pr.microbatches + sum(pr.dp_time)
        serial += sum(pr.gather_time)
        serial += sum(o + l for o, l in pr.act_link + pr.grad_link) * pr.microbatches
        # rounding each duration to ticks may move the hint by up to a tick per op
        self.slack = 3 * pr.units * pr.microbatches * (2 + n)
        self.H = (self.tk(horizon) if horizon is not None else self.tk(serial)) + self.slack
        self.start: dict[tuple, cp_model.IntVar] = {}
        self.dur: dict[tuple, int] = {}
        self.on: list[list[tuple]] = [[] for _ in range(pr.stages)]
        self.msg_start: dict[tuple, cp_model.IntVar] = {}
        # key -> (src, dst, occ, lat, consumer op, producer op)
        self.msg: dict[tuple, tuple[int, int, int, int, tuple, tuple]] = {}
        self.order_lits: dict[tuple, cp_model.IntVar] = {}   # (ka, kb) -> ka's transfer and producer first
        self.reduce_end: dict[int, cp_model.LinearExpr] = {}   # unit -> end of its gradient reduction

    def tk(self, t: float) -> int:
        return int(round(t * self.scale))

    def op(self, key: tuple, rank: int, d: float) -> None:
        dt = max(1, self.tk(d))
        s = self.m.new_int_var(0, self.H - dt, f"s{key}")
        self.start[key], self.dur[key] = s, dt
        self.on[rank].append(key)

    def end(self, key: tuple):
        return self.start[key] + self.dur[key]

    def build(self) -> None:
        pr, m, n = self.pr, self.m, self.n_sub
        U, M, ranks = pr.units, pr.microbatches, pr.unit_ranks
        sub = (lambda i: (i, n)) if n > 1 else (lambda i: None)
        for u in range(U):
            for mb in range(M):
                self.op(("F", u, mb), ranks[u], pr.tf[u])
                self.op(("D", u, mb), ranks[u], pr.td[u])
                if pr.recompute:
                    self.op(("RECOMPUTE", u, mb), ranks[u], pr.tr[u])
                for i in range(n):
                    self.op(("W", u, mb, i), ranks[u], pr.duration(Op.W, u, sub(i)))
        for u in range(U):
            for mb in range(M):
                if u < U - 1:
                    self.link(("act", u, mb), ("F", u, mb), ("F", u + 1, mb), ranks[u], ranks[u + 1], pr.act_link[u])
                    self.link(("grad", u, mb), ("D", u + 1, mb), ("D", u, mb), ranks[u + 1], ranks[u], pr.grad_link[u])
                else:
                    m.add(self.start[("D", u, mb)] >= self.end(("F", u, mb)))
                m.add(self.start[("W", u, mb, 0)] >= self.end(("D", u, mb)))
                if pr.recompute:
                    m.add(self.start[("RECOMPUTE", u, mb)] >= self.end(("F", u, mb)))
                    m.add(self.start[("D", u, mb)] >= self.end(("RECOMPUTE", u, mb)))
                for i in range(1, n):
                    m.add(self.start[("W", u, mb, i)] >= self.end(("W", u, mb, i - 1)))
                if mb:       # same-type order (paper constraint 4)
                    for t, last in (("F", ("F", u, mb - 1)), ("D", ("D", u, mb - 1)), ("W", ("W", u, mb - 1, n - 1))):
                        first = (t, u, mb) if t != "W" else ("W", u, mb, 0)
                        m.add(self.start[first] >= self.end(last))
        for r in range(pr.stages):
            m.add_no_overlap([self.interval(k) for k in self.on[r]])
        links: dict[tuple[int, int], list[tuple]] = {}
        for k, v in self.msg.items():
            links.setdefault((v[0], v[1]), []).append(k)
        for ks in links.values():
            self.link_order(ks)
        if pr.memory_limit is not None:
            for r in range(pr.stages):
                self.memory(r)
        for r in range(pr.stages):
            self.reductions(r)
        for u in range(U):     # ZeRO 3: a unit's first F follows its weight gather
            release = pr.gather_release(u)
            if release > 0:
                m.add(self.start[("F", u, 0)] >= self.tk(release))

    def reductions(self, r: int) -> None:
        """Rank r's gradient reductions: each after its unit's last W piece, one at a time on the
        group queue, in the order of those last W pieces."""
        m, pr, n = self.m, self.pr, self.n_sub
        us = [u for u in pr.units_of(r) if pr.dp_time[u] > 0]
        last = {u: ("W", u, pr.microbatches - 1, n - 1) for u in us}
        start = {}
        for u in us:
            d = max(1, self.tk(pr.dp_time[u]))
            start[u] = m.new_int_var(0, self.H + self.tk(sum(pr.dp_time)), f"dp{u}")
            m.add(start[u] >= self.end(last[u]))
            self.reduce_end[u] = start[u] + d
        for i, a in enumerate(us):
            for b in us[i + 1:]:
                lit = m.new_bool_var(f"dpo{a},{b}")       # a's last W (hence its reduction) first
                m.add(self.start[last[b]] >= self.end(last[a])).only_enforce_if(lit)
                m.add(start[b] >= self.reduce_end[a]).only_enforce_if(lit)
                m.add(self.start[last[a]] >= self.end(last[b])).only_enforce_if(~lit)
                m.add(start[a] >= self.reduce_end[b]).only_enforce_if(~lit)

    def link_order(self, ks: list[tuple]) -> None:
        """Per-link FIFO: no overlap, and transfers in the order of their producers."""
        m = self.m
        if len(ks) > 1 and any(self.msg[k][2] for k in ks):
            m.add_no_overlap([self.msg_interval(k) for k in ks])
        for i, ka in enumerate(ks):
            for kb in ks[i + 1:]:
                if ka[:2] == kb[:2]:     # one unit and direction: micro-batch order (in link())
                    continue
                lit = m.new_bool_var(f"o{ka}{kb}")
                self.order_lits[(ka, kb)] = lit
                for x, y, l in ((ka, kb, lit), (kb, ka, ~lit)):
                    m.add(self.start[self.msg[y][5]] >= self.end(self.msg[x][5])).only_enforce_if(l)
                    m.add(self.msg_start[y] >= self.msg_start[x] + self.msg[x][2]).only_enforce_if(l)

    def interval(self, key: tuple):
        return self.m.new_fixed_size_interval_var(self.start[key], self.dur[key], f"i{key}")

    def msg_interval(self, key: tuple):
        return self.m.new_fixed_size_interval_var(self.msg_start[key], self.msg[key][2], f"t{key}")

    def link(self, key: tuple, prod: tuple, cons: tuple, src: int, dst: int, spec: tuple[float, float]) -> None:
        m = self.m
        if src == dst:
            m.add(self.start[cons] >= self.end(prod))
            return
        occ, lat = self.tk(spec[0]), self.tk(spec[1])
        s = m.new_int_var(0, self.H, f"m{key}")
        self.msg_start[key] = s
        self.msg[key] = (src, dst, occ, lat, cons, prod)
        m.add(s >= self.end(prod))
        m.add(self.start[cons] >= s + occ + lat)
        if key[2]:       # messages of one unit and direction in micro-batch order
            prev = (key[0], key[1], key[2] - 1)
            m.add(s >= self.msg_start[prev] + self.msg[prev][2])

    def memory(self, r: int) -> None:
        """Reservoir of rank r's list-order memory (module doc)."""
        pr, m = self.pr, self.m
        q = _memory_scale(pr)
        mem = lambda x: int(round(x * q))
        times, deltas = [], []
        for k, v in self.msg.items():
            if v[1] == r:
                times.append(self.msg_start[k])
                deltas.append(mem(pr.act_buf[k[1]] if k[0] == "act" else pr.grad_buf[k[1]]))
        for key in self.on[r]:
            t, u = key[0], key[1]
            s, e = self.start[key], self.end(key)
            if t == "W":
                if key[3] == self.n_sub - 1:
                    times.append(e); deltas.append(mem(-pr.stash_w[u]))
                continue
            if t == "RECOMPUTE":
                times.append(s); deltas.append(mem(pr.rebuild(u)))
                continue
            op = Op.F if t == "F" else Op.D
            cons, kept, sent = pr.buffers(op, u)
            d = mem(pr.delta(op, u) - cons + kept + sent)     # level right after it, before its SEND
            times.append(s if d >= 0 else e); deltas.append(d)
            if sent:
                times.append(e); deltas.append(-mem(sent))
        m.add_reservoir_constraint(times, deltas, -(1 << 60), int(math.floor(pr.limit(r) * q + 1e-6)))

    def hint(self, g: GreedyResult) -> None:
        """Hint every variable with the greedy solution (W expanded into its pieces)."""
        m, n = self.m, self.n_sub
        starts: dict[tuple, float] = {}
        for tl in g.timeline:
            for t in tl:
                a = t.action
                if a.op is Op.W and a.sub is None and n > 1:
                    step = (t.end - t.start) / n
                    for i in range(n):
                        starts[("W", a.unit, a.mb[0], i)] = t.start + i * step
                elif a.op is Op.W:
                    starts[("W", a.unit, a.mb[0], a.sub[0] if a.sub else 0)] = t.start
                else:
                    starts[(a.op.value, a.unit, a.mb[0])] = t.start
        for key, var in self.start.items():
            m.add_hint(var, self.tk(starts[key]))
        for key, var in self.msg_start.items():
            m.add_hint(var, self.tk(g.messages[key][0]))
        for (ka, kb), lit in self.order_lits.items():      # producers (F or D) are never W pieces
            m.add_hint(lit, starts[self.msg[ka][5]] < starts[self.msg[kb][5]])

    def objective(self, upper: float | None) -> None:
        pr, m = self.pr, self.m
        mk = m.new_int_var(0, self.H + self.tk(sum(pr.opt_time) + sum(pr.dp_time) + sum(pr.gather_time)), "makespan")
        n = self.n_sub
        lasts = [k for k in self.start if k[0] == "W" and k[3] == n - 1]
        if self.cfg.objective == "all":
            for k in lasts:
                r = pr.unit_ranks[k[1]]
                m.add(mk >= self.end(k) + self.tk(pr.after_compute(r)))
            for u, e in self.reduce_end.items():
                m.add(mk >= e + self.tk(pr.after_compute(pr.unit_ranks[u])))
            for r in range(pr.stages):   # redundant: rank r's work all follows F of its first unit, mb 0
                busy = sum(self.dur[k] for k in self.on[r]) + self.tk(pr.after_compute(r))
                m.add(mk >= self.start[("F", min(pr.units_of(r)), 0)] + busy)
        elif self.cfg.objective == "device0":
            first = m.new_int_var(0, self.H, "first0")
            for k in self.on[0]:
                m.add(first <= self.start[k])
            for k in lasts:
                if pr.unit_ranks[k[1]] == 0:
                    m.add(mk >= self.end(k) - first + self.tk(pr.after_compute(0)))
        else:
            raise ValueError(f"objective must be 'all' or 'device0' (got {self.cfg.objective!r})")
        if upper is not None:
            m.add(mk <= self.tk(upper) + self.slack)
        self.mk = mk
        m.minimize(mk)


def _memory_scale(pr: CrossPipeProblem) -> float:
    """Integers per memory unit: exact when every size is a simple fraction of the largest
    stash (uniform mode, bytes of one model), else a millionth of it."""
    from fractions import Fraction   # imported on use, not with pipert.schedules (with decimal, ~5 ms)
    ref = max(pr.stash)
    sizes = {x / ref for x in pr.stash + pr.stash_w + pr.act_buf + pr.grad_buf + pr.kept if x > 0}
    sizes |= {pr.rebuild(u) / ref for u in range(pr.units) if pr.rebuild(u) > 0}
    sizes |= {(a - b) / ref for a, b in zip(pr.stash, pr.stash_w) if a > b}
    lcd = 1
    for x in sizes:
        f = Fraction(x).limit_denominator(10_000)
        if abs(float(f) - x) > 1e-9 * max(1.0, x):
            return 1e6 / ref
        lcd = lcd * f.denominator // math.gcd(lcd, f.denominator)
        if lcd > 10**6:
            return 1e6 / ref
    return lcd / ref


def solve(problem: CrossPipeProblem, config: SolverConfig = SolverConfig(), hint: GreedyResult | None = None) -> SolverResult:
    """Solve ``problem`` to optimality or until the time limit (see module doc).

    ``hint`` defaults to the greedy with the same sub-blocks (when ``config.use_hint``).
    Raises RuntimeError if no schedule is found within the time limit.
    """
    if config.use_hint and hint is None:
        hint = greedy_best(problem, GreedyConfig(sub_blocks=config.sub_blocks))
    horizon = hint.makespan if hint is not None else None
    mod = _Model(problem, config, horizon)
    mod.build()
    if hint is not None:
        mod.hint(hint)
    mod.objective(hint.makespan if hint is not None and config.objective == "all" else None)
    if hint is not None and config.objective == "all":
        mod.m.add_hint(mod.mk, mod.tk(hint.makespan))
    from ortools.sat.python import cp_model
    solver = cp_model.CpSolver()
    prm = solver.parameters
    prm.max_time_in_seconds = config.time_limit_s
    if config.deterministic_limit is not None:
        prm.max_deterministic_time = config.deterministic_limit
    prm.num_workers = config.workers
    prm.relative_gap_limit = config.relative_gap
    prm.random_seed = config.seed
    prm.cp_model_probing_level = 0     # probing the expanded reservoirs dominates presolve beyond P = 4
    t0 = time.perf_counter()
    status = solver.solve(mod.m)
    runtime = time.perf_counter() - t0
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        if hint is None:
            raise RuntimeError(f"CP-SAT found no schedule ({solver.status_name(status)}) within "
                               f"{config.time_limit_s} s")
        # the search never got past the hint (or tick rounding made the model infeasible):
        # keep the hint's schedule, with what was proven
        ok = status != cp_model.INFEASIBLE and math.isfinite(solver.best_objective_bound)
        bound = solver.best_objective_bound / mod.scale if ok else 0.0
        bound = max(bound, lower_bound(problem)) if config.objective == "all" else bound
        return SolverResult(hint.orders, hint.recv_at, hint.makespan, min(bound, hint.makespan), "HINT", runtime,
                            hint)
    res = _extract(mod, solver, solver.status_name(status), runtime, hint)
    if config.objective == "all":
        res.bound = min(res.makespan, max(res.bound, lower_bound(problem)))
    return res


def lower_bound(pr: CrossPipeProblem) -> float:
    """Max over ranks of (earliest start of the rank's first forward) + (its total work):
    every op of a rank follows F of its first unit for micro-batch 0."""
    est, t = [0.0] * pr.units, 0.0
    for u in range(pr.units):
        est[u] = t
        t += pr.tf[u] + (sum(pr.act_link[u]) if u < pr.units - 1 else 0.0)
    best = 0.0
    for r in range(pr.stages):
        us = pr.units_of(r)
        busy = sum(pr.tf[u] + pr.td[u] + pr.tw[u] + (pr.tr[u] if pr.recompute else 0.0) for u in us) * pr.microbatches \
            + pr.after_compute(r)
        best = max(best, est[min(us)] + busy)
    return best


def _extract(mod: _Model, solver: cp_model.CpSolver, status: str, runtime: float,
             hint: GreedyResult | None) -> SolverResult:
    pr, n = mod.pr, mod.n_sub
    val = {k: solver.value(v) for k, v in mod.start.items()}
    orders: list[list[Action]] = []
    ends: list[list[int]] = []        # end tick of each emitted compute (a merged W: its last piece)
    for r in range(pr.stages):
        keys = sorted(mod.on[r], key=val.__getitem__)
        acts, es = [], []
        i = 0
        while i < len(keys):
            k = keys[i]
            if k[0] == "W":
                if n > 1 and k[3] == 0 and i + n <= len(keys) and all(
                        keys[i + j][:3] == k[:3] and val[keys[i + j]] == val[keys[i + j - 1]] + mod.dur[keys[i + j - 1]]
                        for j in range(1, n)):
                    acts.append(Action(Op.W, k[1], k[2]))
                    es.append(val[keys[i + n - 1]] + mod.dur[keys[i + n - 1]])
                    i += n
                    continue
                acts.append(Action(Op.W, k[1], k[2], sub=(k[3], n) if n > 1 else None))
            else:
                acts.append(Action(Op(k[0]), k[1], k[2]))
            es.append(val[k] + mod.dur[k])
            i += 1
        orders.append(acts)
        ends.append(es)
    ms = {k: solver.value(v) for k, v in mod.msg_start.items()}
    # a RECV whose s_k falls inside a merged W stands before the whole W: posted earlier (still
    # by s_k), and the pieces before the last change no memory, so the peak is the reservoir's
    recv_at = place_receives(pr, orders, ends, ms)
    return SolverResult(orders, recv_at, solver.objective_value / mod.scale, solver.best_objective_bound / mod.scale,
                        status, runtime, hint)
