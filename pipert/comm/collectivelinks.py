"""Collectives across emulated links: each one is held for the time the simulator prices it.

The price is :func:`pipert.cost.topology.collective_time` of the collective's op, group (its
ring, in the action's order) and bytes (the full buffer on one member, as the member holds it:
a ZeRO buffer padded to a multiple of the group) on the emulator's links: the same function
``Links.collective`` gives the simulator. A group whose ring links are all
free (its members in one datacenter, or one node, where only the links between them are
emulated) is not held at all.

Timing, per member r of a group, collective k of that group (FIFO, as the simulator chains one
group's collectives): ``release(r, k) = max(post(r, k), release(r, k-1)) + price(k)``; at its
release the member hands the collective to the inner transport, which completes it once every
member handed it over. So the collective completes at ``max over members of post`` (its start in
the simulator, the later of every member's post and the end of the group's previous one) plus
its price, plus the real exchange. Every member computes the same price from the same numbers
and makes the same decision (held or not), and each group's collectives reach the inner
transport in posting order on every member (NCCL's rule): releases of one group never decrease
and the timer runs ties in submission order.
"""
from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ..cost.topology import collective_time, ring_links
from ..device.streams import clock

__all__ = ["HeldCollective", "CollectiveLinks"]


@dataclass(frozen=True)
class HeldCollective:
    """One collective a member held (times in :func:`pipert.device.streams.clock` seconds)."""

    rank: int
    """The member that held it."""
    op: str
    """ALLREDUCE, ALLGATHER, REDUCESCATTER, BROADCAST or REDUCE."""
    group: tuple[int, ...]
    """The group in the action's order (its ring)."""
    nbytes: float
    """Bytes of the full buffer on one member."""
    delay: float
    """The price: ``collective_time(op, group, nbytes)`` on the emulated links."""
    ready: float
    """When the member posted it."""
    release: float
    """When it is handed to the inner transport: ``max(ready, previous release) + delay``."""


class CollectiveLinks:
    """The held collectives of every rank of one :class:`pipert.comm.links.LinkEmulator`
    (``emulator.collectives``), their records and the timer that releases them."""

    KEEP = 4096
    """Records kept per rank (the latest)."""

    def __init__(self, emulator: Any) -> None:
        self.emulator = emulator
        self._lock = threading.Lock()
        self._free: dict[tuple[int, tuple[int, ...]], float] = {}
        self._records: dict[int, deque[HeldCollective]] = {}
        self._held: dict[int, int] = {}  # per rank: collectives held since the start
        self._timer: Any = None

    def crosses(self, group: Sequence[int]) -> bool:
        """Whether a collective over ``group`` pays anything: some link of its ring is emulated
        (latency, per-message time or finite bandwidth). The same on every member."""
        for s, d in ring_links(group):
            spec = self.emulator.link(s, d)
            if spec.latency > 0 or spec.per_message > 0 or spec.bandwidth != float("inf"):
                return True
        return False

    def price(self, op: str, group: Sequence[int], nbytes: float) -> float:
        """Seconds collective ``op`` over ``group`` of ``nbytes`` takes on the emulated links."""
        return collective_time(op, group, nbytes, self.emulator.link)

    def hold(self, rank: int, op: str, group: Sequence[int], nbytes: float, fn: Callable[[], Any],
             ready: float | None = None) -> HeldCollective:
        """Member ``rank`` posts collective ``op`` at ``ready`` (default now): ``fn()`` runs on the
        timer thread at its release (module doc). Returns its record."""
        group = tuple(group)
        delay = self.price(op, group, nbytes)
        ready = clock() if ready is None else float(ready)
        key = (rank, tuple(sorted(group)))
        with self._lock:
            release = max(ready, self._free.get(key, 0.0)) + delay
            self._free[key] = release
            held = HeldCollective(rank, op.upper(), group, float(nbytes), delay, ready, release)
            self._records.setdefault(rank, deque(maxlen=self.KEEP)).append(held)
            self._held[rank] = self._held.get(rank, 0) + 1
            if self._timer is None:
                from .links import _PyTimer
                self._timer = _PyTimer()
            timer = self._timer
        timer.at(release, fn)
        return held

    def held(self, rank: int) -> int:
        """Collectives member ``rank`` held since the start."""
        with self._lock:
            return self._held.get(rank, 0)

    def records(self, rank: int, since: int = 0) -> list[HeldCollective]:
        """The collectives member ``rank`` held from its ``since``-th on (of the latest
        :attr:`KEEP`), in posting order."""
        with self._lock:
            kept = list(self._records.get(rank, ()))
            first = self._held.get(rank, 0) - len(kept)
        return kept[max(since - first, 0):]

    def drain(self) -> None:
        """Host waits until every held collective was released; raises the first release error."""
        timer = self._timer
        if timer is not None:
            timer.drain()
            if timer.error:
                raise RuntimeError(f"collective release failed: {timer.error}")

    def reset(self) -> None:
        """Every group free from time 0; the records stay."""
        with self._lock:
            self._free.clear()
