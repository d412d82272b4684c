"""The walk of pass 1: every action's node, edges, value effects and memory, read from
``pipert.ir.semantics.TABLE`` (see graph.py for the DAG and docs/semantics.md for the rules).

Per rank the walk keeps ``have`` (value key -> node that produced it; INITIAL for values present
from the start), ``live`` (counted value key -> its size), ``wg`` (weight-gradient contribution
sets per (unit, shard, class slot)) and ``host`` (the rank's last compute-queue node: where its program is).
"""
from __future__ import annotations

import bisect
import dataclasses
from itertools import chain
from operator import attrgetter
from typing import Any

from ..ir.action import COLLECTIVE_OPS, Action, Op, Payload
from ..ir.semantics import BWD_COPY_READERS, MEMORY_KIND, PAYLOAD_VALUE, TABLE, Role, Value, op_queue, recomputed
from .comm import CommState
from .errors import ScheduleError
from .keys import BWD, HOST, INITIAL, K_COMPUTE, K_TRANSFER, MISSING, QUEUES, SHARD, SHIFT, describe_key

__all__ = ["Builder"]

_ACT, _STASH, _STASHW, _GRAD, _WEIGHT, _KEPT, _WGRAD = (int(v) for v in Value)
_COMPUTE_OPS = frozenset({Op.F, Op.B, Op.D, Op.W, Op.RECOMPUTE})
# members as module constants: on Python 3.11 each ``Op.X`` goes through EnumType.__getattr__
_F, _B, _D, _W, _OPT, _RECOMPUTE, _SEND, _RECV, _WAIT, _FREE = (
    Op.F, Op.B, Op.D, Op.W, Op.OPT, Op.RECOMPUTE, Op.SEND, Op.RECV, Op.WAIT, Op.FREE)
_ROLE = {Role.ALL: 0, Role.ROOT: 1, Role.OTHERS: 2, Role.NONE: 3}


def _compile(refs: tuple) -> tuple:
    """Refs as flat tuples: (kind or -1 for the payload, du, edge 0/1 prev/2 next, release, role,
    shard|host bits)."""
    out = []
    for r in refs:
        kind = -1 if r.value is None else int(r.value)
        edge = {None: 0, "prev": 1, "next": 2}[r.edge]
        out.append((kind, r.du, edge, r.release, _ROLE[r.role], (SHARD if r.shard else 0) | (HOST if r.host else 0)))
    return tuple(out)


_READS = {op: _compile(s.reads) for op, s in TABLE.items()}
_WRITES = {op: _compile(s.writes) for op, s in TABLE.items()}
_F_KEEPS = _compile((TABLE[Op.F].writes[0],)) + ((_KEPT, 0, 0, False, 0, 0),)
_TIMED = {op: s.timed for op, s in TABLE.items()}


class Builder(CommState):
    """Pass 1 (see module doc). ``run`` fills the node arrays and the per-rank results."""

    fast = True
    """Plain computes through :meth:`plain_compute`; False: every action through :meth:`effects`
    (the same graph, tested)."""

    def __init__(self, s: Any, cost: Any, links: Any, memory_limit: Any) -> None:
        super().__init__(s, cost, links)
        self.limits = self._limits(memory_limit)
        pl = s.placement
        self.holders = [pl.holders(u) for u in range(self.U)]
        # per unit: its value slots (0: the whole unit; k+1: ZeRO class k of a mixed unit), the
        # stage and the share of the unit's bytes of each slot
        self.slots = [(0,) if not pl.mixed(u) else tuple(k + 1 for k in pl.zero_classes(u)) for u in range(self.U)]
        self.stage = [{sl: (pl.zero_classes(u)[0] if sl == 0 else sl - 1) for sl in self.slots[u]}
                      for u in range(self.U)]
        self.share = [{sl: pl.class_fraction(u, None if sl == 0 else sl - 1) for sl in self.slots[u]}
                      for u in range(self.U)]
        self.mixed = [pl.mixed(u) for u in range(self.U)]
        # separate ZeRO-3 buffers: B, D and RECOMPUTE read the backward copy (slot + BWD)
        self.split = pl.zero3_buffers == 2
        self.bslots = [tuple(sl + BWD if self.split and self.stage[u][sl] == 3 else sl for sl in self.slots[u])
                       for u in range(self.U)]
        for u in range(self.U):
            for sl, b in zip(self.slots[u], self.bslots[u]):
                self.stage[u][b], self.share[u][b] = self.stage[u][sl], self.share[u][sl]
        mem = cost.memory
        kinds = [k for k in MEMORY_KIND.values() if k != "kept"]
        self.sz = {k: [mem(k, u) for u in range(self.U)] for k in kinds}
        self.sz["kept"] = [_kept_size(cost, u) for u in range(self.U)]
        self.size_of = [self.sz[MEMORY_KIND[Value(k)]] for k in range(7)]
        cq = s.meta.get("collective_queue", "group")
        if cq not in ("compute", "group", "send", "recv"):
            raise ValueError(f"meta['collective_queue'] must be 'compute' or 'group', got {cq!r}")
        self.cq = "compute" if cq == "compute" else "group"
        self.q_of = {op: QUEUES.index(op_queue(op, self.cq).value) for op in Op}
        self._plan_cache: dict[tuple, tuple] = {}
        self.fwd: dict[int, int] = {}   # u << 32 | m -> r << 32 | i of its F
        self.bwd: dict[int, int] = {}   # -> (r << 32 | i) << 1 | is_D
        self.wdone: dict[int, int] = {}
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
        placed = self.split or any(self.mixed)  # the placement gives some unit ZeRO classes or copies
        for r in range(self.P):
            acts = s.actions[r]
            self.r = r
            self.have = self._initial(r)
            self._plan_cache = {}
            self.ends = {}
            self._compute_plans: dict[tuple, tuple] = {}
            messages = self.message_plans = {}
            live = self.live = {}
            have = self.have
            self.wg: dict[tuple[int, int], list] = {}
            self.open_sub: dict[tuple, tuple] = {}
            self.wait_index = None
            self.opt_count: dict[int, int] = {}
            ops = list(map(_OP, acts))
            self.recomputed = recomputed(acts) if _RECOMPUTE in ops else set()
            self.host = -1
            self.mem = 0.0
            nodes_r = self.nodes_r = [-1] * len(acts)
            cq: list[int] = []
            trace: list[float] = []
            peak = busy = 0.0
            limit, over = self.limits[r], False
            check = _out_of_range(acts, U, M)   # indices are checked per action only where one is bad
            classes = placed or _names_classes(acts)  # likewise ZeRO classes
            for i, a in enumerate(acts):
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
                        d = ctime(a, r) if _TIMED[op] else 0.0
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
                        if fast and a.sub is None and op in _COMPUTE_OPS:
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
                        self.error(r, i, a, "memory", f"memory {peak:g} exceeds the limit {limit:g}")
            for (op, u, mb), (nxt, j, a) in self.open_sub.items():
                self.error(r, j, a, "sub_block", f"sub-block {nxt - 1}/{a.sub[1]} is never followed by "
                           f"sub-block {nxt}/{a.sub[1]}")
            self.node_of.append(nodes_r)
            self.compute_nodes.append(cq)
            self.busy.append(busy)
            self.peaks.append(peak)
            self.queues.append(list(map(qname.__getitem__, ops)))
            self.memory_trace.append(trace)
        self.finish()

    def _initial(self, r: int) -> dict[int, int]:
        have: dict[int, int] = {}
        for u in range(self.U):
            if r in self.holders[u]:
                for sl in self.slots[u]:
                    z = self.stage[u][sl]
                    if z <= 2:
                        have[(u << 32 | sl) << SHIFT | _WEIGHT] = INITIAL
                    if z >= 1:
                        have[(u << 32 | sl) << SHIFT | _WEIGHT | SHARD] = INITIAL
        return have

    def _bad_class(self, r: int, i: int, a: Action) -> bool:
        """A ZeRO class must name a class of a mixed unit; a mixed unit's weight or gradient
        messages, collectives and memory ops must name one."""
        u, z = a.unit, a.zclass
        classes = [sl - 1 for sl in self.slots[u]] if self.mixed[u] else []
        stage = self.stage[u].get(0 if z is None else z + 1)
        gathered = self.split and stage == 3 and a.payload is Payload.WEIGHT and a.op in (Op.ALLGATHER, Op.FREE)
        if z is None and self.mixed[u]:
            detail = f"unit {u} has ZeRO classes {classes}: name one (z{classes[0]}..)"
        elif z is not None and z not in classes:
            detail = (f"unit {u} has ZeRO classes {classes}" if classes else
                      f"unit {u} has one ZeRO stage ({self.stage[u][0]}): its actions name no class") + f", not z{z}"
        elif gathered and a.side is None:
            detail = (f"the schedule keeps separate forward and backward copies of gathered ZeRO-3 weights "
                      f"(placement zero3_buffers=2): name one (fwd or bwd)")
        elif a.side is not None and not gathered:
            detail = (f"side {a.side} names a copy of gathered ZeRO-3 weights, which this schedule does not keep "
                      f"apart (placement zero3_buffers={2 if self.split else 1}, stage {stage})")
        else:
            return False
        self.error(r, i, a, "zero_class", detail)
        return True

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
        compute = op in _COMPUTE_OPS
        first = last = True
        if a.sub is not None and compute:
            first, last = self.sub_block(r, i, a)
        u = a.unit
        keeps = op is _F and bool(self.recomputed) and any((u, m) in self.recomputed for m in a.mb)
        got = self._plan_cache.get((op, a.payload, u, r == a.root, keeps, a.zclass, a.side))
        reads, writes = got if got is not None else self._plan(a, r, keeps)
        if reads and (first or last):  # a split compute reads at its first piece, frees what it read at its last
            if compute:
                self.compute_reads(a, r, i, n, reads, use=first, free=last)
            else:
                self.comm_reads(a, r, i, n, reads)
        if op is _W and first and not last:  # its pieces fill the gradient from the first one on
            for sl in self.slots[u]:
                self.reserve_wgrad(u, sl, n)
        if last:
            if compute:
                self.mark_done(a, r, i)
            if writes:
                self.apply_writes(a, r, n, writes)

    def message_effects(self, a: Action, r: int, i: int, n: int) -> None:
        """The effects of SEND/RECV ``a`` (transfer node n): its plan's, which are all of its effects.
        A message of an activation or gradient whose plan is one per-micro-batch value read or
        written has it recorded as (is read, key of micro-batch 0, release, size) in
        ``message_plans``, which the walk applies inline (``fast``) the next time."""
        got = self._plan_cache.get((a.op, a.payload, a.unit, r == a.root, False, a.zclass, a.side))
        reads, writes = got if got is not None else self._plan(a, r, False)
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
            got = self._compute_plans[(op, u, keeps)] = self._compute_plan(a, r, keeps)
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
        reads, writes = self._plan(a, r, keeps)
        if any(ref[0] for ref in reads) or any(ref[0] for ref in writes[:-1]) or \
                writes and writes[-1][0] and a.op is not _B and a.op is not _W:
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

    def _role_ok(self, role: int, a: Action, r: int) -> bool:
        return role == 0 or (role == 1) == (r == a.root) and role != 3

    def _plan(self, a: Action, r: int, keeps: bool) -> tuple[tuple, tuple]:
        """(reads, writes) of ``a`` on rank r, ``keeps``: an F that keeps its input for a later
        RECOMPUTE. That depends only on the cache key's fields, so each key is planned once per rank."""
        key = (a.op, a.payload, a.unit, r == a.root, keeps, a.zclass, a.side)
        got = self._plan_cache.get(key)
        if got is None:
            op = a.op
            got = self._plan_cache[key] = (self._applied(a, r, _READS[op]),
                                           self._applied(a, r, _F_KEEPS if keeps else _WRITES[op]))
        return got

    def _applied(self, a: Action, r: int, refs: tuple) -> tuple:
        """Each ref of ``refs`` that applies to ``a`` on rank r (edges and roles applied, the
        payload's kind filled in; a SEND keeps a unit's weights) as (is weight grad, unit,
        release, shard, key of the unit's value (micro-batch 0), slots, size a write adds to the
        running sum (None for model state and host copies)). ``slots`` is None for a value per
        micro-batch; for a per-unit value, the class slots it covers (the action's ZeRO class for a
        payload, every class of the unit for a compute's weights and gradient), and its size is
        then one per slot."""
        u = a.unit
        out = []
        for kind, du, edge, release, role, bits in refs:
            if edge == 1 and u == 0 or edge == 2 and u == self.U - 1:
                continue
            if role and not self._role_ok(role, a, r):
                continue
            payload = kind < 0
            if payload:
                kind = _payload_kind(a)
                if a.op is _SEND and kind == _WEIGHT:
                    release = False
            uu = u + du
            shard = bool(bits & SHARD)
            base = (uu << 32) << SHIFT | kind | bits
            if kind != _WEIGHT and kind != _WGRAD:
                size = None
                if not bits & HOST and not self.static(kind, uu, shard):
                    size = self.size_of[kind][uu]
                out.append((False, uu, release, shard, base, None, size))
                continue
            if payload:
                # the shard is one per class; the side names one of its gathered copies
                slots = ((0 if a.zclass is None else a.zclass + 1) + (BWD if a.side == "bwd" and not shard else 0),)
            else:
                slots = self.bslots[uu] if kind == _WEIGHT and a.op in BWD_COPY_READERS else self.slots[uu]
            sizes = []
            for sl in slots:
                size = None
                if kind != _WGRAD and not bits & HOST and not self.static(kind, uu, shard, sl):
                    num, den = self.share[uu].get(sl, _WHOLE)
                    size = self.size_of[kind][uu] * num / den / (len(self.holders[uu]) if shard else 1)
                sizes.append(size)
            out.append((kind == _WGRAD, uu, release, shard, base, tuple(slots), tuple(sizes)))
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

    def static(self, kind: int, u: int, shard: bool, slot: int = 0) -> bool:
        """Model state a rank keeps across steps (not part of the running sum)."""
        if self.r not in self.holders[u]:
            return False
        if kind == _WEIGHT:
            return shard or self.stage[u][slot] <= 2
        if kind == _WGRAD:
            return shard or self.stage[u][slot] <= 1
        return False

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

    # --- weight gradients: sets of micro-batch contributions -------------------------------------
    def wg_state(self, u: int, shard: bool, slot: int) -> list:
        st = self.wg.get((u, shard, slot))
        if st is None:
            # [local micro-batches, source nodes, last local contributor, size held]
            st = self.wg[(u, shard, slot)] = [[], [], -1, 0.0]
        return st

    def wgrad_size(self, u: int, slot: int) -> float:
        num, den = self.share[u].get(slot, _WHOLE)
        return self.sz["wgrad"][u] * num / den

    def add_wgrad(self, a: Action, r: int, n: int, u: int, shard: bool, slot: int) -> None:
        """A contribution: a local accumulator (B, W) or one more received buffer (RECV,
        collective); each holds one weight gradient until the next reader takes them all."""
        st = self.wg_state(u, shard, slot)
        local = a.op is _B or a.op is _W
        new_buffer = not local or st[2] < 0
        if local:
            st[0].extend(a.mb)
            st[2] = n
        else:
            st[1].append(n)
        if new_buffer and not self.static(_WGRAD, u, shard, slot):
            sz = self.wgrad_size(u, slot) / (len(self.holders[u]) if shard else 1)
            st[3] += sz
            self.mem += sz

    def reserve_wgrad(self, u: int, slot: int, n: int) -> None:
        """The local accumulator of unit u exists from node n on (the first piece of a split W)."""
        st = self.wg_state(u, False, slot)
        if st[2] < 0:
            st[2] = n
            if not self.static(_WGRAD, u, False, slot):
                st[3] += self.wgrad_size(u, slot)
                self.mem += self.wgrad_size(u, slot)

    def wg_take(self, u: int, shard: bool, slot: int, n: int) -> tuple[list[int], list[int]] | None:
        """Move the rank's weight gradient of unit u into node n (edges from its contributors)."""
        st = self.wg.pop((u, shard, slot), None)
        if st is None:
            return None
        if st[2] >= 0 and st[2] != n:
            self.edge(st[2], n, 1)
        for src in st[1]:
            self.edge(src, n, 1)
        self.mem -= st[3]
        return st[0], st[1]

    def take_wgrad(self, a: Action, r: int, i: int, n: int, u: int, shard: bool, slot: int) -> None:
        parts = self.wg_take(u, shard, slot, n)
        if a.op is _SEND:
            if parts is None:
                self.error(r, i, a, "missing_input", f"no weight-grad contribution of unit {u} on rank {r} "
                           f"before this SEND")
                parts = ([], [])
            self.wg_parts[n] = [parts]
        elif a.op is _FREE:
            return
        elif parts is not None:  # a collective: the joint node carries every member's parts
            self.wg_parts.setdefault(n, []).append(parts)
        else:
            self.wg_parts.setdefault(n, [])

    # --- ops with rules beyond reads and writes --------------------------------------------------
    def opt(self, a: Action, r: int, i: int, n: int) -> None:
        units = [a.unit] if a.unit is not None else [u for u in range(self.U) if r in self.holders[u]]
        if not units:
            self.error(r, i, a, "wgrad", f"OPT on rank {r}, which holds no unit's weights")
        for u in units:
            if r not in self.holders[u]:
                self.error(r, i, a, "wgrad", f"OPT u{u} runs on rank {r}, but unit {u}'s weights are held by "
                           f"rank(s) {list(self.holders[u])}")
                continue
            j = self.opt_count.get(u, 0)
            self.opt_count[u] = j + 1
            for sl in self.slots[u]:
                z = self.stage[u][sl]
                shard = z >= 1
                bit = SHARD if shard else 0
                wkey = (u << 32 | sl) << SHIFT | _WEIGHT | bit
                self.use(r, i, wkey, n, True)
                self.have[wkey] = n  # the updated weights: later sends and gathers wait for the step
                if shard and z <= 2:
                    self.have.pop((u << 32 | sl) << SHIFT | _WEIGHT, None)  # whole weights stale until ALLGATHER
                parts = self.wg_take(u, shard, sl, n)
                local, sources = parts if parts is not None else ([], [])
                for src in sources:
                    self.comm_in.append((n, src))
                self.opt_checks.append((n, r, i, a, u, local, sources, j))

    def wait(self, a: Action, r: int, i: int, n: int) -> None:
        if self.wait_index is None:
            self.wait_index = {}
            for j, b in enumerate(self.s.actions[r]):
                if b.op is _SEND or b.op is _RECV:
                    self.wait_index.setdefault(b, []).append(j)
        target = dataclasses.replace(a, op=a.waits, waits=None)
        idx = self.wait_index.get(target, [])
        k = bisect.bisect_left(idx, i) - 1
        if k < 0:
            self.error(r, i, a, "wait", f"no earlier {target} on this rank to wait for")
            return
        p = self.nodes_r[idx[k]]
        if p >= 0:
            self.edge(p, n, 1 if a.waits is _RECV else 0)
            self.comm_in.append((n, p))

    def mark_done(self, a: Action, r: int, i: int) -> None:
        """Exactly one F, one B or D, and a W after a D per (unit, micro-batch)."""
        op, u = a.op, a.unit
        if op is _RECOMPUTE:
            return
        table = self.fwd if op is _F else self.wdone if op is _W else self.bwd
        for m in a.mb:
            fk = u << 32 | m
            prev = table.get(fk)
            if prev is not None:
                loc = prev >> 1 if table is self.bwd else prev
                what = op.value if table is not self.bwd else ("B" if prev & 1 == 0 else "D")
                self.duplicate(r, i, a, loc, what)
            elif table is self.bwd:
                table[fk] = (r << 32 | i) << 1 | (op is _D)
            else:
                table[fk] = r << 32 | i

    def duplicate(self, r: int, i: int, a: Action, prev: int, what: str) -> None:
        self.error(r, i, a, "duplicate", f"{what} of unit {a.unit} for these micro-batches already runs at "
                   f"rank {prev >> 32}, action {prev & 0xFFFFFFFF}")

    def sub_block(self, r: int, i: int, a: Action) -> tuple[bool, bool]:
        """Check piece order; returns (is first piece, is last piece)."""
        j, cnt = a.sub
        key = (a.op, a.unit, a.mb)
        nxt = self.open_sub.get(key, (0, i, a))[0]
        if j != nxt:
            self.error(r, i, a, "sub_block", f"expected sub-block {nxt}/{cnt} of {a.op} u{a.unit} next")
        if j == cnt - 1:
            self.open_sub.pop(key, None)
        else:
            self.open_sub[key] = (j + 1, i, a)
        return j == 0, j == cnt - 1

    def error(self, r: int, i: int, a: Action | None, reason: str, detail: str) -> None:
        self.errors.append(ScheduleError(r, i, a, reason, detail))

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
_P_ACT, _P_GRAD = Payload.ACT, Payload.GRAD
_WHOLE = (1, 1)  # the class fraction of a unit's only slot


def _payload_kind(a: Action) -> int:
    return int(PAYLOAD_VALUE[a.payload])


def _kept_size(cost: Any, u: int) -> float:
    """Bytes an F keeps for a later RECOMPUTE: the cost model's "kept", else the unit's input
    (the previous unit's activation; unit 0 keeps its token ids, counted as nothing)."""
    try:
        return cost.memory("kept", u)
    except (ValueError, KeyError):
        return cost.memory("act", u - 1) if u > 0 else 0.0
