"""``LocalTransport``: every rank in one process (threads), for tests and emulation. On a GPU its
messages and collectives are ordered between the ranks' streams by CUDA events
(``pipert.comm.streamorder``): a receiver's stream waits for the sender's copy, every member of
a collective for the others' inputs and for the reduction."""
from __future__ import annotations

import threading
from typing import Sequence

import torch

from ..errors import CommTimeout, PeerFailure
from .base import COLLECTIVES, Done, Future, Handle, alone
from .streamorder import CudaOrder, Order

__all__ = ["LocalHub", "LocalTransport"]


class _Link:
    """One directed link of a LocalHub: message k is matched by the k-th receive posted. A
    message is (the sender's copy, the event after that copy on the sender's stream)."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.messages: dict[int, tuple[torch.Tensor, Any]] = {}
        self.sent = 0
        self.posted = 0


class _RecvHandle:
    def __init__(self, link: _Link, seq: int, tensor: torch.Tensor, hub: "LocalHub") -> None:
        self.link, self.seq, self.tensor, self.hub = link, seq, tensor, hub

    def wait(self, timeout: float) -> None:
        with self.link.cond:
            ok = self.link.cond.wait_for(lambda: self.seq in self.link.messages or bool(self.hub.failed), timeout)
            if self.seq in self.link.messages:
                data, copied = self.link.messages.pop(self.seq)
            elif self.hub.failed:
                raise PeerFailure(self.hub.failed)
            else:
                raise CommTimeout(f"timed out after {timeout:g} s")
        order = self.hub.order
        order.after(copied, self.tensor)  # the sender's copy is done before this stream reads it
        self.tensor.copy_(data)
        order.hold(data)  # the copy's memory outlives this stream's read

    def done(self) -> bool:
        return self.seq in self.link.messages


class _MemberHandle:
    """One member's view of a LocalHub collective: complete once every member posted and the
    reduction was issued; the member's stream then waits for the reduction's event."""

    def __init__(self, future: Future, order: Order, tensor: torch.Tensor) -> None:
        self.future, self.order, self.tensor = future, order, tensor
        self.event: Any = None  # set with the future: after the reduction, on the reducing member's stream

    def wait(self, timeout: float) -> None:
        self.future.wait(timeout)
        self.order.after(self.event, self.tensor)

    def done(self) -> bool:
        return self.future.done()


class LocalHub:
    """Shared state of all ranks of one process: FIFO mailboxes per directed link and tag, and
    rendezvous points for collectives. ``order`` orders the ranks' streams (module doc)."""

    def __init__(self, world_size: int, order: Order | None = None) -> None:
        self.world_size = world_size
        self.order: Order = order if order is not None else CudaOrder()
        self.links = {(s, d, 0): _Link() for s in range(world_size) for d in range(world_size) if s != d}
        self.lock = threading.Lock()
        self.pending: dict[tuple, dict] = {}
        self.counts: dict[tuple[int, tuple[int, ...]], int] = {}
        self.failed: str = ""
        self.on_fail: list = []
        """Callables given the failure message when the run fails (other waits to end)."""

    def link(self, src: int, dst: int, tag: int = 0) -> _Link:
        """The mailbox of messages ``src`` -> ``dst`` with ``tag`` (one FIFO per tag)."""
        key = (src, dst, tag)
        link = self.links.get(key)
        if link is None:
            if src == dst or not (0 <= src < self.world_size and 0 <= dst < self.world_size):
                raise ValueError(f"no link {src}->{dst} among {self.world_size} ranks")
            with self.lock:
                link = self.links.setdefault(key, _Link())
        return link

    def fail(self, message: str) -> None:
        """Mark the run failed: every pending and future receive raises PeerFailure."""
        self.failed = message
        for link in list(self.links.values()):
            with link.cond:
                link.cond.notify_all()
        for fn in self.on_fail:
            fn(message)

    def transport(self, rank: int) -> "LocalTransport":
        return LocalTransport(self, rank)

    def _collective(self, rank: int, op: str, tensor: torch.Tensor, group: tuple[int, ...],
                    root: int | None, out: torch.Tensor | None) -> _MemberHandle:
        """The last member to post reduces on its current stream, after every member's input
        (and output buffer) is ready on that member's stream; each member's stream waits for
        the reduction before it reads or changes its tensors again."""
        order = self.order
        handle = _MemberHandle(Future(), order, tensor)
        with self.lock:
            n = self.counts.get((rank, group), 0)
            self.counts[(rank, group)] = n + 1
            slot = self.pending.setdefault((group, n), {"parts": {}, "outs": {}, "handles": {}, "ready": {}})
            slot["parts"][rank] = tensor
            slot["outs"][rank] = out
            slot["handles"][rank] = handle
            slot["ready"][rank] = order.ready(tensor)
            if len(slot["parts"]) < len(group):
                return handle
            del self.pending[(group, n)]
        parts, outs = slot["parts"], slot["outs"]
        error: Exception | None = None
        try:
            for r in group:
                order.after(slot["ready"][r], tensor)
            _reduce(op, parts, outs, group, root)
        except Exception as e:  # noqa: BLE001 - every member sees the failure
            error = e
        done = order.ready(tensor)
        for r in group:
            order.hold(parts[r])
            if outs[r] is not None:
                order.hold(outs[r])
        for h in slot["handles"].values():
            h.event = done
            h.future.set(error)
        return handle


def _reduce(op: str, parts: dict, outs: dict, group: tuple[int, ...], root: int | None) -> None:
    """Collective ``op`` over the members' tensors ``parts`` (and buffers ``outs``), on the
    calling thread's current stream."""
    if op == "BROADCAST":
        for r, t in parts.items():
            if r != root:
                t.copy_(parts[root])
    elif op in ("REDUCE", "ALLREDUCE"):
        total = sum(parts[r].clone() for r in group)
        for r in ([root] if op == "REDUCE" else list(group)):
            parts[r].copy_(total)
    elif op == "ALLGATHER":
        whole = torch.cat([parts[r].reshape(-1) for r in group])
        for r in group:
            outs[r].copy_(whole.view_as(outs[r]))
    elif op == "REDUCESCATTER":
        total = sum(parts[r].clone() for r in group).reshape(-1)
        for k, r in enumerate(group):
            m = outs[r].numel()
            outs[r].copy_(total[k * m:(k + 1) * m].view_as(outs[r]))
    else:
        raise ValueError(f"collective {op} unknown; allowed: {', '.join(COLLECTIVES)}")


class LocalTransport:
    """One rank's view of a LocalHub. Sends copy the tensor, so the sender may reuse it."""

    def __init__(self, hub: LocalHub, rank: int) -> None:
        self.hub, self.rank, self.world_size = hub, rank, hub.world_size

    def isend(self, tensor: torch.Tensor, peer: int, tag: int = 0) -> Handle:
        link = self.hub.link(self.rank, peer, tag)
        data = tensor.detach().clone()
        copied = self.hub.order.ready(data)  # the receiver's stream waits for this copy
        with link.cond:
            link.messages[link.sent] = (data, copied)
            link.sent += 1
            link.cond.notify_all()
        return Done()

    def irecv(self, tensor: torch.Tensor, peer: int, tag: int = 0) -> Handle:
        link = self.hub.link(peer, self.rank, tag)
        with link.cond:
            seq = link.posted
            link.posted += 1
        return _RecvHandle(link, seq, tensor, self.hub)

    def collective(self, op: str, tensor: torch.Tensor, group: Sequence[int], root: int | None,
                   out: torch.Tensor | None = None) -> Handle:
        key = tuple(sorted(group))
        done = alone(key, tensor, out)
        if done is not None:
            return done
        return self.hub._collective(self.rank, op, tensor, key, root, out)
