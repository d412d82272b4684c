"""NCCL's rules as pipert's transports meet them (docs/semantics.md, "NCCL's rules").

These decide whether a program can hang on NCCL where gloo forgives it; the validator
(``validate(..., transport="nccl")``), the CPU backend that behaves like NCCL
(:mod:`pipert.comm.ncclsim`) and the real NCCL transport all read them from here.

- **Communicators.** A message s->d travels on process group "up" when s < d, else "down"
  (``DistTransport``), and NCCL gives every (group, pair) a communicator of its own:
  ``Comm("up", (a, b))`` carries the messages a->b, ``Comm("down", (a, b))`` those b->a
  (a < b). A collective over two or more ranks runs on its group's communicator
  ``Comm("group", ranks)``.
- **Creation.** A communicator is created at its first use by a blocking rendezvous of its
  members: each member's host blocks there until every member has reached its own first use.
  The host issues a rank's actions in program order and blocks nowhere else, so without
  warm-up a program hangs at start-up exactly when :func:`startup_hang` finds ranks stuck.
- **Warm-up.** Creating every communicator a program uses in one global order
  (:func:`warmup_order`), each rank taking those it belongs to, cannot hang: the first
  communicator of the order not yet created has every member waiting on it.
- **Streams.** Per rank, the operations of one communicator complete in posting order; a send
  completes only when its receive runs, a collective when every member has posted it.

Importing this module loads neither torch nor the simulator.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

from ..ir.action import COLLECTIVE_OPS, Op
from ..ir.semantics import COMM_OPS

if TYPE_CHECKING:
    from ..ir.action import Action
    from ..ir.schedule import Schedule

__all__ = ["Comm", "p2p_comm", "comm_of", "first_uses", "warmup_order", "startup_hang", "describe_hang"]

KINDS = ("up", "down", "group")


@dataclass(frozen=True, order=True)
class Comm:
    """One NCCL communicator: ``kind`` "up" or "down" (a pair's messages to the higher or the
    lower rank) or "group" (a collective group), over ``ranks`` (sorted)."""

    kind: str
    ranks: tuple[int, ...]

    def __str__(self) -> str:
        return f"{self.kind}({','.join(map(str, self.ranks))})"


def p2p_comm(src: int, dst: int) -> Comm:
    """The communicator of messages ``src`` -> ``dst``."""
    return Comm("up", (src, dst)) if src < dst else Comm("down", (dst, src))


def comm_of(a: "Action", rank: int) -> Comm | None:
    """The communicator action ``a`` of ``rank`` runs on (None: no communication, or a
    collective over this rank alone)."""
    op = a.op
    if op is Op.SEND:
        return p2p_comm(rank, a.peer)
    if op is Op.RECV:
        return p2p_comm(a.peer, rank)
    if op in COLLECTIVE_OPS:
        ranks = tuple(sorted(set(a.group)))
        return Comm("group", ranks) if len(ranks) > 1 else None
    return None


def first_uses(actions: Iterable["Action"], rank: int) -> list[tuple[int, Comm]]:
    """(action index, communicator) of each communicator's first use in ``rank``'s program."""
    seen: set[Comm] = set()
    out = []
    for i, a in enumerate(actions):
        if a.op in COMM_OPS:
            c = comm_of(a, rank)
            if c is not None and c not in seen:
                seen.add(c)
                out.append((i, c))
    return out


def warmup_order(program: "Schedule") -> list[Comm]:
    """Every communicator ``program`` uses, in the one order all ranks create them."""
    comms = {c for r, acts in enumerate(program.actions) for _, c in first_uses(acts, r)}
    return sorted(comms, key=lambda c: (c.ranks, KINDS.index(c.kind)))


def startup_hang(program: "Schedule") -> dict[int, tuple[int, Comm]]:
    """Ranks whose host stays blocked creating a communicator when every rank runs its program
    without warm-up: {rank: (action index, communicator)}; empty when start-up completes.

    Each host walks its first uses in order; a communicator is created once every member is
    at it. The walk stops when no communicator at the head of its members can be created."""
    heads = {r: first_uses(acts, r) for r, acts in enumerate(program.actions)}
    pos = dict.fromkeys(heads, 0)
    moved = True
    while moved:
        moved = False
        at = {r: heads[r][pos[r]][1] for r in heads if pos[r] < len(heads[r])}
        for c in set(at.values()):
            if all(at.get(m) == c for m in c.ranks):
                for m in c.ranks:
                    pos[m] += 1
                moved = True
    return {r: heads[r][pos[r]] for r in heads if pos[r] < len(heads[r])}


def describe_hang(program: "Schedule", blocked: dict[int, tuple[int, Comm]]) -> str:
    """One sentence per blocked rank: where its host waits, on which communicator, for whom."""
    parts = []
    for r, (i, c) in sorted(blocked.items()):
        others = [m for m in c.ranks if m != r]
        where = []
        for m in others:
            if m in blocked:
                j, d = blocked[m]
                where.append(f"rank {m} is blocked creating {d} at its action {j} ({program.actions[m][j]})")
            else:
                where.append(f"rank {m} never uses {c}" if all(cc != c for _, cc in first_uses(program.actions[m], m))
                             else f"rank {m} has not reached it")
        parts.append(f"rank {r} blocks at action {i} ({program.actions[r][i]}) creating communicator {c}, "
                     f"while {'; '.join(where)}")
    return "; ".join(parts)
