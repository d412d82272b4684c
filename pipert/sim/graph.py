"""Pass 1 of the engine: walk every rank's list once, build the action DAG, check list rules.

Nodes: one per compute/WAIT/memory action, one per matched SEND/RECV pair (a transfer),
one per collective (joint over its group). Node ``n`` has a duration ``dur[n]`` (for a
transfer: the link occupancy) and a latency ``lat[n]`` (transfers only). Two times leave a
node: ``end0 = start + dur`` frees its queues and its link, ``end1 = end0 + lat`` is when its
data is ready. An edge ``p -> n`` is stored in ``succ[p]`` as ``n << 1 | uses_end1``.
A transfer releases the sender's send queue and the receiver's recv queue at ``end0``: the
next message may be posted while the previous one is still in flight (its latency), which
is what lets back-to-back messages on a link pipeline (docs/semantics.md).

Edges: queue order (each of a rank's three queues is in list order), data (from the node
that produced a consumed value; a compute consuming a compute-produced value needs no edge,
the compute queue orders them), link order (the k-th and k+1-th transfer of a directed
link), weight-grad sources. Values live in a per-rank dict keyed by ``vkey``.
Memory follows docs/semantics.md "Memory", in list order.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..ir.action import Action, Op, Payload
from ..ir.schedule import Schedule
from .effects import BuilderState
from .errors import STRUCTURAL, ScheduleError
from .keys import (INITIAL, MISSING, QUEUES, RECV_Q, SEND_Q, _ACT, _GRAD, _STASH, _STASHW, _WEIGHT,
                   describe_key, vkey)

__all__ = ["Graph", "build_graph", "QUEUES", "vkey", "describe_key"]


@dataclass
class Graph:
    """The action DAG of one schedule plus everything pass 1 learned (see module doc)."""

    schedule: Schedule
    """The schedule this graph was built from."""
    kind: list[int]
    """Node kind: 0 compute-queue action, 1 transfer, 2 collective."""
    dur: list[float]
    """Duration (compute, collective) or link occupancy (transfer) per node."""
    lat: list[float]
    """Latency after the occupancy, per node (0 except transfers)."""
    succ: list[list[int]]
    """Out-edges per node, encoded ``dst << 1 | uses_end1``."""
    indeg: list[int]
    """Number of in-edges per node."""
    node_of: list[list[int]]
    """``node_of[r][i]``: node of rank r's action i (-1: the action is broken)."""
    compute_nodes: list[list[int]]
    """Per rank, its compute-queue nodes in queue order."""
    comm_in: list[tuple[int, int]]
    """(compute-queue node, transfer/collective node whose data it consumes)."""
    tx_prod: dict[int, int]
    """Transfer node -> node that produced the value it sends."""
    link_bytes: dict[tuple[int, int], float]
    """Bytes sent per directed link (src, dst)."""
    collectives: list[tuple[int, Action, float]]
    """(node, first member's action, bytes) per collective."""
    busy: list[float]
    """Per rank, total compute duration."""
    peak_memory: list[float]
    """Per rank, peak of the running memory sum (cost-model units)."""
    errors: list[ScheduleError]
    """Rule violations found by pass 1, in no particular order."""
    wg_parts: dict[int, list[tuple[list[int], list[int]]]] = field(default_factory=dict)
    """Weight-grad node -> parts (local micro-batches, source nodes) whose union it carries."""
    opt_checks: list[tuple] = field(default_factory=list)
    """(node, rank, index, action, unit, local mbs, source nodes, window) per OPT of a unit."""
    queue_of_coll: int = SEND_Q
    """Queue collectives go to on every member."""

    @property
    def num_nodes(self) -> int:
        return len(self.kind)

    @property
    def structural_errors(self) -> bool:
        return any(e.reason in STRUCTURAL for e in self.errors)

class _Builder(BuilderState):
    """Pass 1: ``run`` is the hot loop over every rank's list (F/B/D/W/RECOMPUTE and
    SEND/RECV of activations inline; everything else through BuilderState methods)."""

    # --- the walk -------------------------------------------------------------------
    def run(self) -> Graph:
        s, P, U, M = self.s, self.P, self.U, self.M
        F, B, D, W, RC, SEND, RECV = Op.F, Op.B, Op.D, Op.W, Op.RECOMPUTE, Op.SEND, Op.RECV
        ACT, GRAD = Payload.ACT, Payload.GRAD
        kind, dur, lat, succ, indeg = self.kind, self.dur, self.lat, self.succ, self.indeg
        missing_add, comm_add = self.missing.append, self.comm_in.append
        ctime = self.cost.compute_time
        stash_sz, stashw_sz, act_sz = self.sz["stash"], self.sz["stash_w"], self.sz["act"]
        grad_sz, owner, fwd, bwd, wdone = self.sz["grad"], self.owner, self.fwd, self.bwd, self.wdone
        tx_prod, link_state, new_transfer = self.tx_prod, self.link_state, self.new_transfer
        last_unit = U - 1
        node_of, compute_nodes, busy_all, peaks = [], [], [], []
        for r in range(P):
            acts = s.actions[r]
            have: dict[int, int] = {((u << 35) | _WEIGHT): INITIAL for u in range(U) if owner[u] == r}
            live: dict[int, float] = {}
            wg = {}
            self.have, self.live, self.wg, self.off = have, live, wg, {}
            self.open_sub, self.wait_index, self.opt_count = {}, None, {}
            last = self.last = [-1, -1, -1]
            nodes_r = self.nodes_r = [-1] * len(acts)
            cq: list[int] = []
            mem = peak = busy = 0.0
            limit, over = self.limits[r], False
            for i, a in enumerate(acts):
                op = a.op
                if op is SEND or op is RECV:
                    pl, u, mb, peer = a.payload, a.unit, a.mb, a.peer
                    if peer == r or not 0 <= peer < P:
                        self.error(r, i, a, "bad_peer", f"peer {peer} must be another rank in 0..{P - 1}")
                        continue
                    if u >= U:  # a micro-batch out of range only makes an unmatched value
                        self.error(r, i, a, "bad_index", f"unit out of range (schedule has {U} units)")
                        continue
                    is_send = op is SEND
                    # the k-th SEND on a directed link matches its k-th RECV: one transfer node
                    lk = r * P + peer if is_send else peer * P + r
                    ls = link_state.get(lk)
                    if ls is None:
                        ls = link_state[lk] = [0, 0, [], [], 0.0, None, None]
                    side = 0 if is_send else 1
                    k = ls[side]
                    ls[side] = k + 1
                    tx = ls[2]
                    if k < len(tx):
                        n = tx[k]
                        first = ls[3][k]
                        ls[3][k] = None
                        fa = first[0]
                        if fa.payload is not pl or fa.unit != u or fa.mb != mb or fa.tag != a.tag:
                            self.mismatch(a, r, i, first, k, is_send)
                    else:
                        n = new_transfer(a, r, i, ls, lk)
                    nodes_r[i] = n
                    q = SEND_Q if is_send else RECV_Q
                    p = last[q]
                    if p >= 0:
                        succ[p].append(n << 1)
                        indeg[n] += 1
                    last[q] = n
                    if pl is ACT or pl is GRAD:
                        kd = _ACT if pl is ACT else _GRAD
                        if is_send:
                            for m in mb:
                                k = (u << 32 | m) << 3 | kd
                                p = have.get(k, MISSING)
                                if p >= 0:
                                    succ[p].append(n << 1 | 1); indeg[n] += 1
                                    tx_prod[n] = p
                                    if kind[p]:
                                        mem -= live.pop(k, 0.0)
                                else:
                                    missing_add((r, i, k))
                        else:
                            szu = (act_sz if kd == _ACT else grad_sz)[u]
                            for m in mb:
                                k = (u << 32 | m) << 3 | kd
                                have[k] = n
                                if k not in live:
                                    live[k] = szu
                                    mem += szu
                    else:
                        mem += self.p2p_weights(a, r, i, n, is_send)
                elif op is F or op is B or op is D or op is W or op is RC:
                    u, mb = a.unit, a.mb
                    n = len(kind)
                    d = ctime(a, r)
                    kind.append(0); dur.append(d); lat.append(0.0); succ.append([]); indeg.append(0)
                    busy += d
                    p = last[0]
                    if p >= 0:
                        succ[p].append(n << 1)
                        indeg[n] = 1
                    last[0] = n
                    cq.append(n)
                    nodes_r[i] = n
                    if u >= U or (mb[0] if len(mb) == 1 else max(mb)) >= M:
                        self.error(r, i, a, "bad_index", f"unit or micro-batch out of range "
                                   f"(schedule has {U} units, {M} micro-batches)")
                        continue
                    sub = a.sub
                    first = last_piece = True
                    if sub is not None:
                        first, last_piece = self.sub_block(r, i, a)
                    if op is F or op is RC:
                        if first:
                            p = have.get((u << 35) | _WEIGHT, MISSING)
                            if p == MISSING:
                                missing_add((r, i, (u << 35) | _WEIGHT))
                            elif p >= 0 and kind[p]:
                                succ[p].append(n << 1 | 1); indeg[n] += 1; comm_add((n, p))
                            if u:
                                for m in mb:
                                    k = ((u - 1) << 32 | m) << 3
                                    p = have.get(k, MISSING)
                                    if p >= 0:
                                        if kind[p]:
                                            succ[p].append(n << 1 | 1); indeg[n] += 1; comm_add((n, p))
                                            mem -= live.pop(k, 0.0)
                                    else:
                                        missing_add((r, i, k))
                        if last_piece:
                            for m in mb:
                                k = (u << 32 | m) << 3
                                if op is F:
                                    have[k] = n
                                    fk = u << 32 | m
                                    if fk in fwd:
                                        self.duplicate(r, i, a, fwd[fk], "F")
                                    else:
                                        fwd[fk] = r << 32 | i
                                have[k | _STASH] = n
                            if op is F:
                                mem += stash_sz[u] * len(mb)
                    elif op is W:
                        for m in mb:
                            k = (u << 32 | m) << 3 | _STASHW
                            if first and k not in have:
                                missing_add((r, i, k))
                            if last_piece:
                                fk = u << 32 | m
                                if fk in wdone:
                                    self.duplicate(r, i, a, wdone[fk], "W")
                                else:
                                    wdone[fk] = r << 32 | i
                        if last_piece:
                            mem -= stashw_sz[u] * len(mb)
                            st = wg.get(u)
                            if st is None:
                                self.mem_delta = 0.0
                                st = self.wg_state(u, r)
                                mem += self.mem_delta
                            st[0].extend(mb)
                            st[2] = n
                    else:  # B or D
                        if first:
                            p = have.get((u << 35) | _WEIGHT, MISSING)
                            if p == MISSING:
                                missing_add((r, i, (u << 35) | _WEIGHT))
                            elif p >= 0 and kind[p]:
                                succ[p].append(n << 1 | 1); indeg[n] += 1; comm_add((n, p))
                            for m in mb:
                                k = (u << 32 | m) << 3
                                if (k | _STASH) not in have:
                                    missing_add((r, i, k | _STASH))
                                if u < last_unit:
                                    k |= _GRAD
                                    p = have.get(k, MISSING)
                                    if p >= 0:
                                        if kind[p]:
                                            succ[p].append(n << 1 | 1); indeg[n] += 1; comm_add((n, p))
                                            mem -= live.pop(k, 0.0)
                                    else:
                                        missing_add((r, i, k))
                        if last_piece:
                            is_d = op is D
                            for m in mb:
                                if u:
                                    have[((u - 1) << 32 | m) << 3 | _GRAD] = n
                                if is_d:
                                    have[(u << 32 | m) << 3 | _STASHW] = n
                                fk = u << 32 | m
                                if fk in bwd:
                                    self.duplicate(r, i, a, bwd[fk] >> 1, "B" if bwd[fk] & 1 == 0 else "D")
                                else:
                                    bwd[fk] = (r << 32 | i) << 1 | is_d
                            if is_d:
                                mem -= (stash_sz[u] - stashw_sz[u]) * len(mb)
                            else:
                                mem -= stash_sz[u] * len(mb)
                                st = wg.get(u)
                                if st is None:
                                    self.mem_delta = 0.0
                                    st = self.wg_state(u, r)
                                    mem += self.mem_delta
                                st[0].extend(mb)
                                st[2] = n
                else:
                    n, delta = self.other(a, r, i)
                    nodes_r[i] = n
                    mem += delta
                    if n >= 0 and kind[n] == 0:
                        cq.append(n)
                        busy += dur[n]
                if mem > peak:
                    peak = mem
                    if limit is not None and mem > limit and not over:
                        over = True
                        self.error(r, i, a, "memory", f"memory {mem:g} exceeds the limit {limit:g}")
            for sk, (nxt, j, a) in self.open_sub.items():
                self.error(r, j, a, "sub_block", f"sub-block {nxt - 1}/{a.sub[1]} is never followed by "
                           f"sub-block {nxt}/{a.sub[1]}")
            node_of.append(nodes_r)
            compute_nodes.append(cq)
            busy_all.append(busy)
            peaks.append(peak)
        self.finish()
        link_bytes = {(lk // P, lk % P): ls[4] for lk, ls in link_state.items()}
        return Graph(s, kind, dur, lat, succ, indeg, node_of, compute_nodes, self.comm_in, tx_prod,
                     link_bytes, self.collectives, busy_all, peaks, self.errors, self.wg_parts,
                     self.opt_checks, self.coll_q)




def build_graph(schedule: Schedule, cost: Any, links: Any = None, memory_limit: Any = None) -> Graph:
    """Pass 1: the DAG of ``schedule`` plus the list-order rules (errors in ``Graph.errors``).

    ``memory_limit``: None, one number for every rank, or one per rank.
    """
    return _Builder(schedule, cost, links, memory_limit).run()
