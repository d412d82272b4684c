"""Pass-1 state shared by the walk: node arrays, and the matching of messages and collectives.

Messages: the k-th SEND of rank s to rank d matches the k-th RECV of d from s (FIFO per directed
link); the pair is one transfer node, whichever side the walk meets first creates it. A transfer
waits for both sides to be posted, for the value it sends, and for the previous transfer of its
link (the link is busy for the occupancy; the data is ready one latency later).

Collectives: the k-th collective of a group (its ranks, sorted) is the same action on every
member and one joint node; it waits for every member to post it and for the previous collective
of the group; it takes the link model's collective time.
"""
from __future__ import annotations

from typing import Any

from .. import native
from ..ir.action import Action, Op
from .keys import K_COLLECTIVE, K_TRANSFER

__all__ = ["CommState", "message_bytes"]

_SEND = Op.SEND   # a module constant: on Python 3.11 each ``Op.X`` goes through EnumType.__getattr__


def message_bytes(cost: Any, placement: Any, a: Action) -> float:
    """Bytes message or collective ``a`` moves: the cost model's message, times its ZeRO class's
    share of the unit."""
    nbytes = cost.message_bytes(a.payload, a.unit, len(a.mb) or 1)
    if a.zclass is None:
        return nbytes
    num, den = placement.class_fraction(a.unit, a.zclass)
    return nbytes * num / den


class CommState:
    """Node arrays, error and missing-input lists, link and group matching state. The walk that
    extends it provides ``host`` (the posting rank's last compute-queue node), ``post(n)``,
    ``chain_compute(n)`` and ``error(...)``."""

    def __init__(self, s: Any, cost: Any, links: Any) -> None:
        self.s, self.cost, self.links = s, cost, links
        self.P, self.U, self.M = s.num_ranks, s.num_units, s.num_microbatches
        self.kind, self.dur, self.lat, self.succ, self.indeg = native.node_arrays()
        self.errors: list = []
        self.missing: list[tuple[int, int, int]] = []
        self.comm_in: list[tuple[int, int]] = []
        self.tx_prod = native.int_map()   # a dict, or the C-owned map the compiled walk fills
        # per directed link src * P + dst: [SENDs posted, RECVs posted, transfer nodes in FIFO
        # order, first-posted side (action, rank, index) per transfer (None once matched),
        # bytes sent, (payload, unit, #mbs) of the last message costed, its (bytes, occ, lat), the
        # link's key]
        self.link_state: dict[int, list] = {}
        # the walked rank's link ends (the walk resets them per rank): peer << 1 | is SEND -> (its
        # link's state, side 0 for SENDs or 1 for RECVs)
        self.ends: dict[int, tuple[list, int]] = {}
        self.coll_count: dict[tuple, int] = {}
        self.coll_nodes: dict[tuple, list[int]] = {}
        self.coll_members: dict[int, list[tuple[Action, int, int]]] = {}
        self.collectives: list[tuple[int, Action, float]] = []

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

    # --- point to point ---------------------------------------------------------------------
    def p2p(self, a: Action, r: int, i: int) -> int:
        """The transfer node of SEND/RECV ``a`` (posting edge added); -1 if broken. The first side
        the walk meets creates the node (see ``link_state``), the second is checked against it."""
        is_send = a.op is _SEND
        end = self.ends.get(a.peer << 1 | is_send)
        if end is None:
            end = self.link_end(a, r, i, is_send)
            if end is None:
                return -1
        ls, side = end
        k = ls[side]
        ls[side] = k + 1
        tx = ls[2]
        succ = self.succ
        if k < len(tx):
            n = tx[k]
            first = ls[3][k]
            ls[3][k] = None
            fa = first[0]
            if fa.payload is not a.payload or fa.unit != a.unit or fa.mb != a.mb or fa.tag != a.tag \
                    or fa.zclass != a.zclass:
                self.mismatch(a, r, i, first, k, is_send)
            p = self.host
            if p >= 0:  # post(n) without its call: one per message
                succ[p].append(n << 1)
                self.indeg[n] += 1
            return n
        ck = (a.payload, a.unit, len(a.mb) or 1, a.zclass)
        if ck == ls[5]:
            nbytes, occ, lat = ls[6]
        else:
            nbytes = self.message_bytes(a)
            lk = ls[7]
            occ, lat = self.links.transfer(lk // self.P, lk % self.P, nbytes) if self.links is not None \
                else (0.0, 0.0)
            ls[5], ls[6] = ck, (nbytes, occ, lat)
        n = len(self.kind)  # node(K_TRANSFER, occ, lat) without its call: one per transfer
        self.kind.append(K_TRANSFER)
        self.dur.append(occ)
        self.lat.append(lat)
        succ.append([])
        ls[4] += nbytes
        if tx:  # link FIFO: this transfer starts after the previous one frees the link
            succ[tx[-1]].append(n << 1)
        tx.append(n)
        ls[3].append((a, r, i))
        p = self.host
        if p >= 0:  # post(n) without its call: one per message
            succ[p].append(n << 1)
        self.indeg.append((len(tx) > 1) + (p >= 0))
        return n

    def link_end(self, a: Action, r: int, i: int, is_send: bool) -> tuple[list, int] | None:
        """(link state, 0 for the sending side or 1 for the receiving one) of message ``a`` on rank r,
        kept in ``ends`` for the rank's later messages to the same peer and side; None (an error)
        if the peer is no other rank."""
        peer, P = a.peer, self.P
        if peer == r or not 0 <= peer < P:
            self.error(r, i, a, "bad_peer", f"peer {peer} must be another rank in 0..{P - 1}")
            return None
        lk = r * P + peer if is_send else peer * P + r
        ls = self.link_state.get(lk)
        if ls is None:
            ls = self.link_state[lk] = [0, 0, [], [], 0.0, None, None, lk]
        end = self.ends[peer << 1 | is_send] = (ls, 0 if is_send else 1)
        return end

    def message_bytes(self, a: Action) -> float:
        return message_bytes(self.cost, self.s.placement, a)

    def mismatch(self, a: Action, r: int, i: int, first: tuple[Action, int, int], k: int, is_send: bool) -> None:
        s_a, s_r, s_i = (a, r, i) if is_send else first
        r_a, r_r, r_i = first if is_send else (a, r, i)
        self.error(r_r, r_i, r_a, "mismatch", f"message #{k} on link {s_r}->{r_r} is sent as {s_a} (rank {s_r}, "
                   f"action {s_i}); payload, unit, micro-batches and tag must agree")

    # --- collectives ------------------------------------------------------------------------
    def collective(self, a: Action, r: int, i: int, chained: bool) -> int:
        """The joint node of collective ``a`` (posting or chain edge added); -1 if broken."""
        g = a.group
        if r not in g or len(set(g)) != len(g) or not all(0 <= x < self.P for x in g):
            self.error(r, i, a, "collective", f"rank {r} posts a collective over group {list(g)}, which must "
                       f"contain it and name each member (a rank in 0..{self.P - 1}) once")
            return -1
        gk = tuple(sorted(g))
        ck = (gk, r)
        k = self.coll_count.get(ck, 0)
        self.coll_count[ck] = k + 1
        lst = self.coll_nodes.setdefault(gk, [])
        if k < len(lst):
            n = lst[k]
            members = self.coll_members[n]
            fa, fr, fi = members[0]
            if fa != a:
                self.error(r, i, a, "collective", f"collective #{k} of group {list(gk)} is {fa} on rank {fr} "
                           f"(action {fi}); every member must post the same collective in the same order")
            members.append((a, r, i))
        else:
            nbytes = self.message_bytes(a)
            d = self.links.collective(a.op.value.lower(), g, nbytes) if self.links is not None else 0.0
            n = self.node(K_COLLECTIVE, d)
            if lst:  # one group's collectives progress in order
                self.edge(lst[-1], n, 0)
            lst.append(n)
            self.coll_members[n] = [(a, r, i)]
            self.collectives.append((n, a, nbytes))
        if chained:
            self.chain_compute(n)
        else:
            self.post(n)
        return n
