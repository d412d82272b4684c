"""Pass-1 rules beyond reads and writes: weight gradients as sets of micro-batch contributions,
OPT, WAIT, one F and one backward per (unit, micro-batch), and the order of sub-blocks. What each
op reads, writes and frees comes from the semantics (``Builder._plan``); these rules check and
account what the plans leave to the walk."""
from __future__ import annotations

import bisect
import dataclasses
from typing import Any

from ..ir.action import Action, Op
from ..ir.ops import Payload
from ..ir.semantics import LOCAL_WGRAD_OPS, Value
from .errors import ScheduleError
from .keys import SHIFT

__all__ = ["OpRules"]

_WGRAD = int(Value.WGRAD)
_F, _D, _W, _RECOMPUTE, _SEND, _RECV, _FREE = Op.F, Op.D, Op.W, Op.RECOMPUTE, Op.SEND, Op.RECV, Op.FREE
_P_WGRAD = Payload.WGRAD
_WHOLE = (1, 1)  # the class fraction of a unit's only slot


class OpRules:
    """Mixed into the walk (``Builder``), which provides the node arrays, ``sem`` (the program's
    Semantics), ``have``/``wg``/``mem`` of the rank being walked and ``use``/``edge``."""

    sem: Any

    # --- weight gradients: sets of micro-batch contributions -------------------------------------
    def wg_state(self, u: int, shard: bool, slot: int) -> list:
        st = self.wg.get((u, shard, slot))
        if st is None:
            # [local micro-batches, source nodes, last local contributor, size held]
            st = self.wg[(u, shard, slot)] = [[], [], -1, 0.0]
        return st

    def wgrad_size(self, u: int, slot: int) -> float:
        num, den = self.sem.units[u].fraction.get(slot, _WHOLE)
        return self.sz["wgrad"][u] * num / den

    def add_wgrad(self, a: Action, r: int, n: int, u: int, shard: bool, slot: int) -> None:
        """A contribution: a local accumulator (B, W) or one more received buffer (RECV,
        collective); each holds one weight gradient until the next reader takes them all."""
        st = self.wg_state(u, shard, slot)
        local = a.op in LOCAL_WGRAD_OPS
        new_buffer = not local or st[2] < 0
        if local:
            st[0].extend(a.mb)
            st[2] = n
        else:
            st[1].append(n)
        if new_buffer and self.sem.counted(Value.WGRAD, u, r, shard, slot):
            sz = self.wgrad_size(u, slot) / (len(self.sem.units[u].holders) if shard else 1)
            st[3] += sz
            self.mem += sz

    def reserve_wgrad(self, u: int, slot: int, n: int) -> None:
        """The local accumulator of unit u exists from node n on (the first piece of a split W)."""
        st = self.wg_state(u, False, slot)
        if st[2] < 0:
            st[2] = n
            if self.sem.counted(Value.WGRAD, u, self.r, False, slot):
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

    # --- OPT ---------------------------------------------------------------------------------------
    def opt(self, a: Action, r: int, i: int, n: int) -> None:
        """OPT's plan (the gradient in, the weights read and written, stale weights freed) on the
        units it steps; each gradient's micro-batches are checked once the graph is complete."""
        sem = self.sem
        units = [a.unit] if a.unit is not None else sem.held_units(r)
        if not units:
            self.error(r, i, a, "wgrad", f"OPT on rank {r}, which holds no unit's weights")
        count: dict[int, int] = {}
        for u in units:
            if not sem.holds(r, u):
                self.error(r, i, a, "wgrad", f"OPT u{u} runs on rank {r}, but unit {u}'s weights are held by "
                           f"rank(s) {list(sem.units[u].holders)}")
                continue
            count[u] = self.opt_count.get(u, 0)
            self.opt_count[u] = count[u] + 1
        reads, writes, frees = self._plan(a, r, False)
        have = self.have
        for wg, u, _, shard, ku, slots, _ in reads:
            if u not in count:
                continue
            for sl in slots:
                if not wg:
                    self.use(r, i, ku | sl << SHIFT, n, True)
                    continue
                parts = self.wg_take(u, shard, sl, n)
                local, sources = parts if parts is not None else ([], [])
                for src in sources:
                    self.comm_in.append((n, src))
                self.opt_checks.append((n, r, i, a, u, local, sources, count[u]))
        for _, u, _, _, ku, slots, _ in writes:
            if u in count:   # the updated weights: later sends and gathers wait for the step
                for sl in slots:
                    have[ku | sl << SHIFT] = n
        for _, u, _, _, ku, slots, _ in frees:
            if u in count:
                for sl in slots:
                    have.pop(ku | sl << SHIFT, None)

    # --- WAIT, once per (unit, micro-batch), sub-blocks ------------------------------------------
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
        if a.waits is _RECV and a.payload is _P_WGRAD:
            self.merge_wgrad(a.unit, n)

    def merge_wgrad(self, u: int, n: int) -> None:
        """A WAIT for a received weight gradient of unit u: what the rank received of it joins its
        local accumulator (the executor adds the buffers into the unit's gradients), which holds
        one weight gradient from node n on."""
        for (uu, shard, slot), st in self.wg.items():
            if uu != u or shard or not st[1]:
                continue
            if st[2] < 0:
                st[2] = n
            size = self.wgrad_size(u, slot) if self.sem.counted(Value.WGRAD, u, self.r, False, slot) else 0.0
            self.mem += size - st[3]
            st[3] = size

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
