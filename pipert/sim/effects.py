"""Pass-1 state and the effects of the less frequent actions (weights, weight grads, WAIT,
OPT, memory ops) plus the helpers the hot loop in graph.py shares with them."""
from __future__ import annotations

import bisect
import dataclasses
from typing import Any

from ..ir.action import Action, Op, Payload
from ..ir.schedule import Schedule
from .checks import finish_checks
from .collective import collective_effects
from .errors import ScheduleError
from .keys import _ACT, _GRAD, _WEIGHT, COMPUTE_Q, K_COMPUTE, K_TRANSFER, MISSING, QUEUES

__all__ = ["BuilderState"]


class BuilderState:
    """Everything pass 1 accumulates; per-rank fields (``have``, ``live``, ``wg``, ``last``...)
    are reset by ``graph._Builder.run`` at the start of every rank."""

    def __init__(self, s: Schedule, cost: Any, links: Any, memory_limit: Any) -> None:
        self.s, self.cost, self.links = s, cost, links
        self.P, self.U, self.M = s.num_ranks, s.num_units, s.num_microbatches
        self.owner = s.placement.weight_owner
        if memory_limit is None or isinstance(memory_limit, (int, float)):
            self.limits = [memory_limit] * self.P
        else:
            self.limits = list(memory_limit)
            if len(self.limits) != self.P:
                raise ValueError(f"memory_limit has {len(self.limits)} entries for {self.P} ranks")
        mem = cost.memory
        self.sz = {k: [mem(k, u) for u in range(self.U)]
                   for k in ("stash", "stash_w", "act", "grad", "weight", "wgrad")}
        cq = s.meta.get("collective_queue", "send")
        if cq not in QUEUES:
            raise ValueError(f"meta['collective_queue'] must be one of {QUEUES}, got {cq!r}")
        self.coll_q = QUEUES.index(cq)
        self.kind: list[int] = []
        self.dur: list[float] = []
        self.lat: list[float] = []
        self.succ: list[list[int]] = []
        self.indeg: list[int] = []
        self.errors: list[ScheduleError] = []
        self.missing: list[tuple[int, int, int]] = []
        self.comm_in: list[tuple[int, int]] = []
        self.tx_prod: dict[int, int] = {}
        # per directed link src * P + dst: [SENDs posted, RECVs posted, transfer nodes in FIFO
        # order, first-posted side (action, rank, index) per transfer (None once matched),
        # bytes sent, (payload, unit, #mbs) of the last message costed, its (bytes, occ, lat)]
        self.link_state: dict[int, list] = {}
        self.coll_count: dict[tuple, int] = {}
        self.coll_nodes: dict[tuple, list[int]] = {}
        self.coll_members: dict[int, list[tuple[Action, int, int]]] = {}
        self.collectives: list[tuple[int, Action, float]] = []
        self.wg_parts: dict[int, list] = {}
        self.opt_checks: list[tuple] = []
        self.fwd: dict[int, int] = {}   # u << 32 | m -> r << 32 | i of its F
        self.bwd: dict[int, int] = {}   # -> (r << 32 | i) << 1 | is_D
        self.wdone: dict[int, int] = {}

    # --- small helpers ------------------------------------------------------------
    def error(self, r: int, i: int, a: Action | None, reason: str, detail: str) -> None:
        self.errors.append(ScheduleError(r, i, a, reason, detail))

    def node(self, k: int, d: float, lat: float = 0.0) -> int:
        n = len(self.kind)
        self.kind.append(k)
        self.dur.append(d)
        self.lat.append(lat)
        self.succ.append([])
        self.indeg.append(0)
        return n

    def edge(self, p: int, n: int, arrival: int) -> None:
        self.succ[p].append(n << 1 | arrival)
        self.indeg[n] += 1

    def chain(self, q: int, n: int) -> None:
        p = self.last[q]
        if p >= 0:
            self.edge(p, n, 0)
        self.last[q] = n

    def use(self, r: int, i: int, key: int, n: int, compute: bool) -> int:
        """Consume value ``key`` at node n; returns its producer (MISSING if absent)."""
        p = self.have.get(key, MISSING)
        if p == MISSING:
            self.missing.append((r, i, key))
        elif p >= 0 and (not compute or self.kind[p]):
            self.edge(p, n, 1)
            if compute:
                self.comm_in.append((n, p))
        return p

    def wg_state(self, u: int, r: int) -> list:
        st = self.wg.get(u)
        if st is None:
            # [local micro-batches, source nodes, last local contributor, buffer size held]
            st = self.wg[u] = [[], [], -1, 0.0]
            if self.owner[u] != r:
                st[3] = self.sz["wgrad"][u]
                self.mem_delta += st[3]
        return st

    def wg_take(self, u: int, n: int) -> tuple[list[int], list[int]] | None:
        """Move rank's weight-grad of unit u into node n (edges from its contributors)."""
        st = self.wg.pop(u, None)
        if st is None:
            return None
        if st[2] >= 0:
            self.edge(st[2], n, 1)
        for src in st[1]:
            self.edge(src, n, 1)
        self.mem_delta -= st[3]
        return st[0], st[1]

    # --- rules shared by several ops ------------------------------------------------
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

    def new_transfer(self, a: Action, r: int, i: int, ls: list, lk: int) -> int:
        """Node of a transfer whose first side (SEND or RECV) is ``a``; see ``link_state``."""
        ck = (a.payload, a.unit, len(a.mb) or 1)
        if ck == ls[5]:
            nbytes, occ, l = ls[6]
        else:
            nbytes = self.cost.message_bytes(*ck)
            occ, l = self.links.transfer(lk // self.P, lk % self.P, nbytes) if self.links is not None \
                else (0.0, 0.0)
            ls[5], ls[6] = ck, (nbytes, occ, l)
        n = len(self.kind)
        self.kind.append(K_TRANSFER)
        self.dur.append(occ)
        self.lat.append(l)
        self.succ.append([])
        self.indeg.append(0)
        ls[4] += nbytes
        tx = ls[2]
        if tx:  # link FIFO: this transfer starts after the previous one frees the link
            self.succ[tx[-1]].append(n << 1)
            self.indeg[n] = 1
        tx.append(n)
        ls[3].append((a, r, i))
        return n

    def mismatch(self, a: Action, r: int, i: int, first: tuple[Action, int, int], k: int, is_send: bool) -> None:
        s_a, s_r, s_i = (a, r, i) if is_send else first
        r_a, r_r, r_i = first if is_send else (a, r, i)
        self.error(r_r, r_i, r_a, "mismatch", f"message #{k} on link {s_r}->{r_r} is sent as {s_a} (rank {s_r}, "
                   f"action {s_i}); payload, unit, micro-batches and tag must agree")

    def p2p_weights(self, a: Action, r: int, i: int, n: int, is_send: bool) -> float:
        """Data effects of SEND/RECV weight|wgrad; returns the memory change."""
        u = a.unit
        self.mem_delta = 0.0
        if a.payload is Payload.WEIGHT:
            key = (u << 35) | _WEIGHT
            if is_send:
                p = self.use(r, i, key, n, False)
                if p >= 0:
                    self.tx_prod[n] = p
            else:
                self.have[key] = n
                if self.owner[u] != r and key not in self.live:
                    self.live[key] = self.sz["weight"][u]
                    self.mem_delta += self.live[key]
        elif is_send:
            parts = self.wg_take(u, n)
            if parts is None:
                self.error(r, i, a, "missing_input", f"no weight-grad contribution of unit {u} on rank {r} "
                           f"before this SEND")
                parts = ([], [])
            self.wg_parts[n] = [parts]
        else:
            self.wg_state(u, r)[1].append(n)
        return self.mem_delta

    def other(self, a: Action, r: int, i: int) -> tuple[int, float]:
        """WAIT, OPT, memory ops, collectives: returns (node, memory change)."""
        op = a.op
        self.mem_delta = 0.0
        if a.unit is not None and a.unit >= self.U or any(m >= self.M for m in a.mb):
            self.error(r, i, a, "bad_index", f"unit or micro-batch out of range (schedule has {self.U} units, "
                       f"{self.M} micro-batches)")
            return -1, 0.0
        if op in (Op.ALLGATHER, Op.REDUCESCATTER, Op.ALLREDUCE, Op.BROADCAST, Op.REDUCE):
            n = collective_effects(self, a, r, i)
            return n, self.mem_delta
        n = self.node(K_COMPUTE, self.cost.compute_time(a, r) if op is Op.OPT else 0.0)
        self.chain(COMPUTE_Q, n)
        if op is Op.WAIT:
            self.wait(a, r, i, n)
        elif op is Op.OPT:
            self.opt(a, r, i, n)
        else:
            self.memory_op(a, n)
        return n, self.mem_delta

    def wait(self, a: Action, r: int, i: int, n: int) -> None:
        if self.wait_index is None:
            self.wait_index = {}
            for j, b in enumerate(self.s.actions[r]):
                if b.op is Op.SEND or b.op is Op.RECV:
                    self.wait_index.setdefault(b, []).append(j)
        target = dataclasses.replace(a, op=a.waits, waits=None)
        idx = self.wait_index.get(target, [])
        k = bisect.bisect_left(idx, i) - 1
        if k < 0:
            self.error(r, i, a, "wait", f"no earlier {target} on this rank to wait for")
            return
        p = self.nodes_r[idx[k]]
        if p >= 0:
            self.edge(p, n, 1 if a.waits is Op.RECV else 0)
            self.comm_in.append((n, p))

    def opt(self, a: Action, r: int, i: int, n: int) -> None:
        units = [a.unit] if a.unit is not None else [u for u in range(self.U) if self.owner[u] == r]
        if not units:
            self.error(r, i, a, "wgrad", f"OPT on rank {r}, which owns no unit")
        for u in units:
            if self.owner[u] != r:
                self.error(r, i, a, "wgrad", f"OPT u{u} runs on rank {r}, but rank {self.owner[u]} owns unit {u}")
                continue
            self.use(r, i, (u << 35) | _WEIGHT, n, True)
            self.have[(u << 35) | _WEIGHT] = n  # the updated weights: later sends wait for the step
            parts = self.wg_take(u, n)
            local, sources = parts if parts is not None else ([], [])
            for src in sources:
                self.comm_in.append((n, src))
            j = self.opt_count.get(u, 0)
            self.opt_count[u] = j + 1
            self.opt_checks.append((n, r, i, a, u, local, sources, j))

    def memory_op(self, a: Action, n: int) -> None:
        u, pl = a.unit, a.payload
        if pl is Payload.WGRAD:
            st = self.wg.get(u)
            if st is not None and a.op is Op.FREE:
                self.mem_delta -= st[3]
                st[3] = 0.0
            return
        keys = [(u << 35) | _WEIGHT] if pl is Payload.WEIGHT else \
            [((u << 32 | m) << 3) | (_ACT if pl is Payload.ACT else _GRAD) for m in a.mb]
        for k in keys:
            if a.op is Op.FREE:
                self.have.pop(k, None)
                self.mem_delta -= self.live.pop(k, 0.0)
            elif a.op is Op.OFFLOAD:
                sz = self.live.pop(k, 0.0)
                self.off[k] = sz
                self.mem_delta -= sz
            else:  # PREFETCH
                sz = self.off.pop(k, 0.0)
                if sz:
                    self.live[k] = sz
                self.mem_delta += sz

    # --- rules checked after the walk -------------------------------------------------
    def finish(self) -> None:
        finish_checks(self)
