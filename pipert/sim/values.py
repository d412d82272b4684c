"""The walk of pass 1: every action's node, edges, value effects and memory, read from
``pipert.ir.semantics.TABLE`` (see graph.py for the DAG and docs/semantics.md for the rules).

Per rank the walk keeps ``have`` (value key -> node that produced it; INITIAL for values present
from the start), ``live`` (counted value key -> its size), ``wg`` (weight-gradient contribution
sets per (unit, shard, class slot)) and ``host`` (the rank's last compute-queue node: where its program is).
"""
from __future__ import annotations

from itertools import chain, islice
from operator import attrgetter
from typing import Any

from ..cost.uniform import UniformCost
from ..ir.action import Action, Op, Payload
from ..ir.semantics import (COLLECTIVE_OPS, LOCAL_WGRAD_OPS, MEMORY_KIND, TIMED_OPS, UNIT_COMPUTE_OPS, Semantics, Value,
                            action_time, recomputed)
from .. import native
from .comm import CommState
from .keys import HOST, INITIAL, K_COMPUTE, K_TRANSFER, MISSING, QUEUES, SHARD, SHIFT, describe_key
from .oprules import OpRules

__all__ = ["Builder", "kept_size"]

_ACT, _STASH, _STASHW, _GRAD, _WEIGHT, _KEPT, _WGRAD = (int(v) for v in Value)
# members as module constants: on Python 3.11 each ``Op.X`` goes through EnumType.__getattr__
_F, _D, _W, _OPT, _RECOMPUTE, _WAIT = Op.F, Op.D, Op.W, Op.OPT, Op.RECOMPUTE, Op.WAIT


class Builder(OpRules, CommState):
    """Pass 1 (see module doc). ``run`` fills the node arrays and the per-rank results."""

    fast = True
    """Plain computes through :meth:`plain_compute`; False: every action through :meth:`effects`
    (the same graph, tested)."""

    def __init__(self, s: Any, cost: Any, links: Any, memory_limit: Any) -> None:
        super().__init__(s, cost, links)
        self.limits = self._limits(memory_limit)
        sem = self.sem = Semantics.of(s)
        self.mixed = [info.mixed for info in sem.units]
        self.split = sem.split
        mem = cost.memory
        kinds = [k for k in MEMORY_KIND.values() if k != "kept"]
        self.sz = {k: [mem(k, u) for u in range(self.U)] for k in kinds}
        self.sz["kept"] = [kept_size(cost, u) for u in range(self.U)]
        self.size_of = [self.sz[MEMORY_KIND[Value(k)]] for k in range(7)]
        self.q_of = {op: QUEUES.index(sem.queue(op).value) for op in Op}
        self._plan_cache: dict[tuple, tuple] = {}
        # packed plans and compiled compute plans of every rank, by Semantics.plan_key (the
        # per-rank caches above and in run() are keyed by the action's fields alone)
        self._plans: dict[tuple, tuple] = {}
        self._compiled: dict[tuple, tuple | None] = {}
        # (native.int_map: dicts, or C-owned maps the compiled walk fills directly)
        self.fwd = native.int_map()     # u << 32 | m -> r << 32 | i of its F
        self.bwd = native.int_map()     # -> (r << 32 | i) << 1 | is_D
        self.wdone = native.int_map()
        self.wg_parts: dict[int, list] = {}
        self.opt_checks: list[tuple] = []
        self.node_of: list[list[int]] = []
        self.compute_nodes: list[list[int]] = []
        self.busy: list[float] = []
        self.peaks: list[float] = []
        self.queues: list[list[str]] = []
        self.memory_trace: list[list[float]] = []

    def _limits(self, memory_limit: Any) -> list:
        if memory_limit is None or isinstance(memory_limit, (int, float)):
            return [memory_limit] * self.P
        limits = list(memory_limit)
        if len(limits) != self.P:
            raise ValueError(f"memory_limit has {len(limits)} entries for {self.P} ranks")
        return limits

    # --- the walk ---------------------------------------------------------------------------
    def run(self) -> None:
        s, U, M = self.s, self.U, self.M
        q_of, ctime = self.q_of, self.cost.compute_time
        qname = {op: QUEUES[q] for op, q in q_of.items()}
        kind, dur, lat, succ, indeg = self.kind, self.dur, self.lat, self.succ, self.indeg
        fast, tx_prod = self.fast, self.tx_prod
        timed, unit_computes = TIMED_OPS, UNIT_COMPUTE_OPS
        placed = self.split or any(self.mixed)  # the placement gives some unit ZeRO classes or copies
        simc = native.SIMC
        # the compiled walk reads a compute's duration from a table where the cost model is
        # exactly UniformCost (a pure function of the op), else calls compute_time
        ctx = (q_of, timed & unit_computes, Op.SEND, self.cost.op_times() if type(self.cost) is UniformCost else ctime)
        for r in range(self.P):
            acts = s.actions[r]
            self.r = r
            have, live = self.have, self.live = native.value_maps()
            self._initial(r, have)
            self._plan_cache = {}
            self.ends = {}
            self._compute_plans: dict[tuple, tuple] = {}
            messages = self.message_plans = {}
            self.wg: dict[tuple[int, int], list] = {}
            self.open_sub: dict[tuple, tuple] = {}
            self.wait_index = None
            self.opt_count: dict[int, int] = {}
            # the scans of the rank's actions: in one pass where pipert._simc is loaded
            got = simc.survey(acts, U, M, _UNIT_PAYLOAD_TUPLE, qname, _RECOMPUTE) \
                if simc is not None and type(acts) is list else None
            if got is None:
                ops = list(map(_OP, acts))
                got = (_out_of_range(acts, U, M), None, _RECOMPUTE in ops, list(map(qname.__getitem__, ops)))
            check, names_classes, has_recompute, queues = got
            self.recomputed = recomputed(acts) if has_recompute else set()
            self.host = -1
            self.mem = 0.0
            nodes_r = self.nodes_r = [-1] * len(acts)
            cq: list[int] = []
            trace: list[float] = []
            peak = busy = 0.0
            limit, over = self.limits[r], False
            # indices are checked per action only where one is bad (check); likewise ZeRO classes
            classes = placed or (_names_classes(acts) if names_classes is None else names_classes)
            # the compiled walk (pipert._simc) runs the actions it covers, from i up to the next one
            # it leaves to this loop (``nxt``); only where no per-action check applies
            walk = simc.walk if simc is not None and fast and type(acts) is list and \
                not (check or classes or self.recomputed) else None
            steps = enumerate(acts)
            for i, a in steps:
                if walk is not None:
                    nxt, busy, peak, over = walk(self, r, acts, i, busy, peak, over, limit, nodes_r, cq, trace, ctx)
                    if nxt == len(acts):
                        break
                    if nxt > i:   # on to action nxt (islice skips the walked ones in C)
                        i, a = next(islice(steps, nxt - i - 1, None))
                op = a.op
                q = q_of[op]
                if check and self._bad_index(r, i, a):
                    trace.append(self.mem)
                    continue
                if classes and (a.zclass is not None or a.side is not None or a.payload in _UNIT_PAYLOADS and
                                (self.mixed[a.unit] or self.split)) and self._bad_class(r, i, a):
                    trace.append(self.mem)
                    continue
                if q == 0:
                    if op in COLLECTIVE_OPS:
                        n = self.collective(a, r, i, chained=True)
                    else:
                        # a cost model prices one micro-batch of a whole compute; folds and pieces: action_time
                        d = (ctime(a, r) if a.sub is None and len(a.mb) < 2 else action_time(ctime, a, r)) \
                            if op in timed else 0.0
                        n = len(kind)  # node(K_COMPUTE, d) and chain_compute(n) without their calls
                        kind.append(K_COMPUTE)
                        dur.append(d)
                        lat.append(0.0)
                        succ.append([])
                        p = self.host
                        if p >= 0:
                            succ[p].append(n << 1)
                            indeg.append(1)
                        else:
                            indeg.append(0)
                        self.host = n
                        busy += d
                    nodes_r[i] = n
                    if n >= 0:
                        cq.append(n)
                        if fast and a.sub is None and op in unit_computes:
                            self.plain_compute(a, r, i, n)
                        else:
                            self.effects(a, r, i, n)
                elif q == 3:
                    n = nodes_r[i] = self.collective(a, r, i, chained=False)
                    if n >= 0:
                        self.effects(a, r, i, n)
                else:
                    n = nodes_r[i] = self.p2p(a, r, i)
                    # the message's recorded one-value plan (see message_effects), applied inline
                    one = messages.get((a.payload, a.unit, q)) if fast and n >= 0 else None
                    if one is None:
                        if n >= 0:
                            self.message_effects(a, r, i, n)
                    elif one[0]:  # comm_reads of one per-micro-batch value, inlined
                        _, ku, release, _ = one
                        for m in a.mb:
                            k = ku | m << SHIFT
                            p = have.get(k, MISSING)
                            if p >= 0:
                                if p != self.host:   # as comm_reads: the posting edge is from p
                                    succ[p].append(n << 1 | 1)
                                    indeg[n] += 1
                                tx_prod[n] = p
                            elif p == MISSING:
                                self.use(r, i, k, n, False)
                                continue
                            if release:
                                del have[k]
                                self.mem -= live.pop(k, 0.0)
                    else:  # apply_writes of one per-micro-batch value, inlined
                        _, ku, _, size = one
                        for m in a.mb:
                            k = ku | m << SHIFT
                            have[k] = n
                            if size is not None and k not in live:
                                live[k] = size
                                self.mem += size
                mem = self.mem
                trace.append(mem)
                if mem > peak:
                    peak = mem
                    if limit is not None and peak > limit and not over:
                        over = True
                        self.memory_error(r, i, a, peak, limit)
            for (op, u, mb), (nxt, j, a) in self.open_sub.items():
                self.error(r, j, a, "sub_block", f"sub-block {nxt - 1}/{a.sub[1]} is never followed by "
                           f"sub-block {nxt}/{a.sub[1]}")
            self.node_of.append(nodes_r)
            self.compute_nodes.append(cq)
            self.busy.append(busy)
            self.peaks.append(peak)
            self.queues.append(queues)
            self.memory_trace.append(trace)
        self.finish()

    def memory_error(self, r: int, i: int, a: Action, peak: float, limit: float) -> None:
        """The rank's running memory first exceeds its limit at action i."""
        self.error(r, i, a, "memory", f"memory {peak:g} exceeds the limit {limit:g}")

    def _initial(self, r: int, have: Any) -> None:
        """What the rank holds at the start of a step (the semantics' initial holdings), into ``have``."""
        for u, sl, shard in self.sem.initial(r):
            have[(u << 32 | sl) << SHIFT | _WEIGHT | (SHARD if shard else 0)] = INITIAL

    def _bad_class(self, r: int, i: int, a: Action) -> bool:
        """An action's ZeRO class or side the placement does not allow (Semantics.field_error)."""
        detail = self.sem.field_error(a)
        if detail is not None:
            self.error(r, i, a, "zero_class", detail)
        return detail is not None

    def _bad_index(self, r: int, i: int, a: Action) -> bool:
        if (a.unit is not None and a.unit >= self.U) or (a.mb and max(a.mb) >= self.M):
            self.error(r, i, a, "bad_index", f"unit or micro-batch out of range (schedule has {self.U} units, "
                       f"{self.M} micro-batches)")
            return True
        return False

    def chain_compute(self, n: int) -> None:
        p = self.host
        if p >= 0:  # edge(p, n, 0) without its call: one per compute
            self.succ[p].append(n << 1)
            self.indeg[n] += 1
        self.host = n

    def post(self, n: int) -> None:
        """A SEND/RECV/collective is posted when the rank's program reaches it."""
        p = self.host
        if p >= 0:  # edge(p, n, 0) without its call: one per message
            self.succ[p].append(n << 1)
            self.indeg[n] += 1

    # --- effects of one action ----------------------------------------------------------------
    def effects(self, a: Action, r: int, i: int, n: int) -> None:
        op = a.op
        if op is _WAIT:
            self.wait(a, r, i, n)
            return
        if op is _OPT:
            self.opt(a, r, i, n)
            return
        compute = op in UNIT_COMPUTE_OPS
        first = last = True
        if a.sub is not None and compute:
            first, last = self.sub_block(r, i, a)
        u = a.unit
        keeps = op is _F and bool(self.recomputed) and any((u, m) in self.recomputed for m in a.mb)
        got = self._plan_cache.get((op, a.payload, u, r == a.root, keeps, a.zclass, a.side))
        reads, writes, frees = got if got is not None else self._plan(a, r, keeps)
        if reads and (first or last):  # a split compute reads at its first piece, frees what it read at its last
            if compute:
                self.compute_reads(a, r, i, n, reads, use=first, free=last)
            else:
                self.comm_reads(a, r, i, n, reads)
        if op is _W and first and not last:  # its pieces fill the gradient from the first one on
            for sl in self.sem.units[u].slots:
                self.reserve_wgrad(u, sl, n)
        if last:
            if compute:
                self.mark_done(a, r, i)
            if writes:
                self.apply_writes(a, r, n, writes)
            if frees:
                self.apply_frees(frees)

    def message_effects(self, a: Action, r: int, i: int, n: int) -> None:
        """The effects of SEND/RECV ``a`` (transfer node n): its plan's, which are all of its effects.
        A message of an activation or gradient whose plan is one per-micro-batch value read or
        written has it recorded as (is read, key of micro-batch 0, release, size) in
        ``message_plans``, which the walk applies inline (``fast``) the next time."""
        got = self._plan_cache.get((a.op, a.payload, a.unit, r == a.root, False, a.zclass, a.side))
        reads, writes, _ = got if got is not None else self._plan(a, r, False)
        if reads:
            self.comm_reads(a, r, i, n, reads)
        if writes:
            self.apply_writes(a, r, n, writes)
        if (a.payload is _P_ACT or a.payload is _P_GRAD) and len(reads) + len(writes) == 1:
            wg, _, release, _, ku, slots, size = (reads or writes)[0]
            if not wg and slots is None:
                self.message_plans[(a.payload, a.unit, self.q_of[a.op])] = (bool(reads), ku, release, size)

    def plain_compute(self, a: Action, r: int, i: int, n: int) -> None:
        """effects() of an F, B, D, W or RECOMPUTE of one micro-batch without sub-blocks, the most
        common actions, from its compiled plan (:meth:`_compute_plan`): the same reads (taken and
        freed at once), once-per-(unit, micro-batch) check and writes, in the same order (``fast``
        off, a fold, or a plan that does not compile: effects())."""
        op, u, mb = a.op, a.unit, a.mb
        rec = self.recomputed
        keeps = op is _F and bool(rec) and any((u, m) in rec for m in mb)
        got = self._compute_plans.get((op, u, keeps), False)
        if got is False:
            key = self.sem.plan_key(a, r, keeps)
            got = self._compiled.get(key, False)
            if got is False:
                got = self._compiled[key] = self._compute_plan(a, r, keeps)
            self._compute_plans[(op, u, keeps)] = got
        if got is None or len(mb) != 1:
            self.effects(a, r, i, n)
            return
        reads, writes, wgrads, table, d_bit = got
        have, kind, live = self.have, self.kind, self.live
        mk = mb[0] << SHIFT
        mem = self.mem   # the running sum, changed in the order effects() changes it
        for kb, per_mb, release in reads:
            k = kb | mk if per_mb else kb
            p = have.get(k, MISSING)
            if p == MISSING:
                self.use(r, i, k, n, True)
                continue
            if p >= 0 and kind[p]:  # a value from another queue: an edge, communicated input
                self.succ[p].append(n << 1 | 1)
                self.indeg[n] += 1
                self.comm_in.append((n, p))
            if release:
                del have[k]
                mem -= live.pop(k, 0.0)
        if table is not None:
            fk = u << 32 | mb[0]
            if fk in table:  # a second run: mark_done names the first
                self.mark_done(a, r, i)
            else:
                table[fk] = r << 32 | i if d_bit is None else (r << 32 | i) << 1 | d_bit
        for kb, per_mb, size in writes:
            k = kb | mk if per_mb else kb
            have[k] = n
            if size is not None and k not in live:
                live[k] = size
                mem += size
        self.mem = mem
        wg = self.wg
        for key in wgrads:
            st = wg.get(key)
            if st is not None and st[2] >= 0:  # add_wgrad to a local accumulator that exists
                st[0].extend(mb)
                st[2] = n
            else:
                self.add_wgrad(a, r, n, *key)

    def _compute_plan(self, a: Action, r: int, keeps: bool) -> tuple | None:
        """The plan of compute ``a`` (:meth:`_plan`) with each ref's key of micro-batch 0 per slot:
        (reads as (key, per micro-batch, release), writes as (key, per micro-batch, size), weight-grad
        contributions as (unit, shard, slot), the table of :meth:`mark_done` (None for RECOMPUTE), its
        D bit (None outside ``bwd``)). None where a weight gradient is read, written before another
        value (plain_compute does not order them) or written by an op that does not accumulate it
        locally (add_wgrad)."""
        reads, writes, frees = self._plan(a, r, keeps)
        if any(ref[0] for ref in reads) or any(ref[0] for ref in writes[:-1]) or frees or \
                writes and writes[-1][0] and a.op not in LOCAL_WGRAD_OPS:
            return None
        flat_reads = tuple((ku | m << SHIFT, False, release) if slots else (ku, True, release)
                           for _, _, release, _, ku, slots, _ in reads for m in (slots or (0,)))
        flat_writes = tuple(((ku | m << SHIFT, False, sz) for m, sz in zip(slots, size)) if slots else
                            ((ku, True, size),) for wg, _, _, _, ku, slots, size in writes if not wg)
        wgrads = tuple((uu, shard, sl) for wg, uu, _, shard, _, slots, _ in writes if wg for sl in slots)
        op = a.op
        table = None if op is _RECOMPUTE else self.fwd if op is _F else self.wdone if op is _W else self.bwd
        return (flat_reads, tuple(w for ws in flat_writes for w in ws), wgrads, table,
                int(op is _D) if table is self.bwd else None)

    def _plan(self, a: Action, r: int, keeps: bool) -> tuple[tuple, tuple, tuple]:
        """(reads, writes, frees) of ``a`` on rank r from the semantics (``keeps``: an F that keeps
        its input for a later RECOMPUTE), packed (:meth:`_packed`). That depends only on the rank's
        cache key's fields, and across ranks only on ``Semantics.plan_key``, so each of those is
        planned once per simulation."""
        key = (a.op, a.payload, a.unit, r == a.root, keeps, a.zclass, a.side)
        got = self._plan_cache.get(key)
        if got is None:
            shared = self.sem.plan_key(a, r, keeps)
            got = self._plans.get(shared)
            if got is None:
                plan = self.sem.plan(a, r, keeps)
                got = self._plans[shared] = (self._packed(plan.reads, r), self._packed(plan.writes, r),
                                             self._packed(plan.frees, r))
            self._plan_cache[key] = got
        return got

    def _packed(self, effects: tuple, r: int) -> tuple:
        """Each Effect as (is weight grad, unit, release, shard, key of the unit's value (micro-batch
        or slot 0), slots, size a write adds to the running sum (None for a value not counted:
        Semantics.counted)). ``slots`` is None for a value per micro-batch; for a per-unit value the
        class slots it covers, and its size is then one per slot (a shard: the holder's share)."""
        counted, units = self.sem.counted, self.sem.units
        out = []
        for e in effects:
            kind, uu, shard = int(e.kind), e.unit, e.shard
            base = (uu << 32) << SHIFT | kind | (SHARD if shard else 0) | (HOST if e.host else 0)
            if e.slots is None:
                size = self.size_of[kind][uu] if counted(e.kind, uu, r, shard, 0, e.host) else None
                out.append((False, uu, e.release, shard, base, None, size))
                continue
            sizes = []
            for sl in e.slots:
                size = None
                if kind != _WGRAD and counted(e.kind, uu, r, shard, sl, e.host):
                    num, den = units[uu].fraction[sl]
                    size = self.size_of[kind][uu] * num / den / (len(units[uu].holders) if shard else 1)
                sizes.append(size)
            out.append((kind == _WGRAD, uu, e.release, shard, base, e.slots, tuple(sizes)))
        return tuple(out)

    def compute_reads(self, a: Action, r: int, i: int, n: int, refs: tuple, use: bool = True,
                      free: bool = True) -> None:
        """Reads of compute node n (``use``: its first piece takes the values, ``free``: its last
        releases them). A value from another queue's node gets an edge and counts as communicated
        input (``comm_in``); one from this rank's compute queue is ordered by the queue already."""
        have, kind = self.have, self.kind
        for wg, uu, release, shard, ku, slots, _ in refs:
            if wg:
                if use:
                    for sl in slots:
                        self.take_wgrad(a, r, i, n, uu, shard, sl)
                continue
            for m in (a.mb if slots is None else slots):
                k = ku | m << SHIFT
                p = have.get(k, MISSING)
                if p == MISSING:
                    if use:
                        self.use(r, i, k, n, True)
                    continue
                if use and p >= 0 and kind[p]:  # an edge as in use(), without its call
                    self.succ[p].append(n << 1 | 1)
                    self.indeg[n] += 1
                    self.comm_in.append((n, p))
                if release and free:
                    del have[k]
                    self.mem -= self.live.pop(k, 0.0)

    def comm_reads(self, a: Action, r: int, i: int, n: int, refs: tuple) -> None:
        """Reads of non-compute node n (a transfer, collective or memory op): each value read gets
        an edge from its producer, which a transfer then carries (``tx_prod``)."""
        have = self.have
        transfer = self.kind[n] == K_TRANSFER
        # a value of the node that posted n needs no edge of its own: its posting edge (post()) is
        # one from the same node, whose end1 is its end0 (compute-queue nodes have no latency)
        host = self.host if self.q_of[a.op] != 0 else -1
        for wg, uu, release, shard, ku, slots, _ in refs:
            if wg:
                for sl in slots:
                    self.take_wgrad(a, r, i, n, uu, shard, sl)
                continue
            for m in (a.mb if slots is None else slots):
                k = ku | m << SHIFT
                p = have.get(k, MISSING)
                if p >= 0:  # an edge as in use(), without its call
                    if p != host:
                        self.succ[p].append(n << 1 | 1)
                        self.indeg[n] += 1
                    if transfer:
                        self.tx_prod[n] = p
                elif p == MISSING:
                    self.use(r, i, k, n, False)
                    continue
                if release:
                    del have[k]
                    self.mem -= self.live.pop(k, 0.0)

    def apply_writes(self, a: Action, r: int, n: int, refs: tuple) -> None:
        have, live = self.have, self.live
        mb = a.mb
        for wg, uu, _, shard, ku, slots, size in refs:
            if wg:
                for sl in slots:
                    self.add_wgrad(a, r, n, uu, shard, sl)
                continue
            if slots is None:
                for m in mb:
                    k = ku | m << SHIFT
                    have[k] = n
                    if size is not None and k not in live:
                        live[k] = size
                        self.mem += size
                continue
            for m, sz in zip(slots, size):
                k = ku | m << SHIFT
                have[k] = n
                if sz is not None and k not in live:
                    live[k] = sz
                    self.mem += sz

    def apply_frees(self, refs: tuple) -> None:
        have, live = self.have, self.live
        for _, _, _, _, ku, slots, _ in refs:
            for m in slots:
                k = ku | m << SHIFT
                if have.pop(k, None) is not None:
                    self.mem -= live.pop(k, 0.0)

    def use(self, r: int, i: int, key: int, n: int, compute: bool) -> int:
        """Read value ``key`` at node n; returns its producer (MISSING if absent)."""
        p = self.have.get(key, MISSING)
        if p == MISSING:
            if key | HOST in self.have and not key & HOST:
                self.error(r, i, self.s.actions[r][i], "offloaded", f"input {describe_key(key)} is offloaded; "
                           f"PREFETCH it before this action")
            else:
                self.missing.append((r, i, key))
        elif p >= 0 and (not compute or self.kind[p]):
            self.edge(p, n, 1)
            if compute:
                self.comm_in.append((n, p))
            elif self.kind[n] == K_TRANSFER:
                self.tx_prod[n] = p
        return p

    def finish(self) -> None:
        from .checks import finish_checks
        finish_checks(self)


def _out_of_range(acts: list[Action], num_units: int, num_microbatches: int) -> bool:
    """Whether an action of ``acts`` names a unit or micro-batch beyond the schedule's (scans of the
    distinct units and micro-batch tuples, without a Python-level loop; unit 0 and actions without
    micro-batches are skipped as falsy)."""
    return max(filter(None, set(map(_UNIT, acts))), default=-1) >= num_units or \
        max(chain.from_iterable(set(map(_MB, acts))), default=-1) >= num_microbatches


def _names_classes(acts: list[Action]) -> bool:
    """Whether an action of ``acts`` names a ZeRO class or a gathered copy's side (sets of the
    fields' values, built without a Python-level loop). Only an action of a unit's weights or weight
    gradient names either (Action's invariants), so a list without one needs one scan."""
    if _UNIT_PAYLOADS.isdisjoint(map(_PAYLOAD, acts)):
        return False
    return not set(map(_ZCLASS, acts)) <= _NONE or not set(map(_SIDE, acts)) <= _NONE


_OP, _UNIT, _MB = attrgetter("op"), attrgetter("unit"), attrgetter("mb")
_NONE = frozenset({None})
_ZCLASS, _SIDE, _PAYLOAD = attrgetter("zclass"), attrgetter("side"), attrgetter("payload")
_UNIT_PAYLOADS = frozenset({Payload.WEIGHT, Payload.WGRAD})
_UNIT_PAYLOAD_TUPLE = tuple(_UNIT_PAYLOADS)
_P_ACT, _P_GRAD = Payload.ACT, Payload.GRAD


def kept_size(cost: Any, u: int) -> float:
    """Bytes an F keeps for a later RECOMPUTE: the cost model's "kept", else the unit's input
    (the previous unit's activation; unit 0 keeps its token ids, counted as nothing)."""
    try:
        return cost.memory("kept", u)
    except (ValueError, KeyError):
        return cost.memory("act", u - 1) if u > 0 else 0.0
