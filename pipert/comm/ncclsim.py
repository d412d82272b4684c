"""``nccl-sim``: NCCL's rules (:mod:`pipert.comm.nccl`) on CPU, on top of gloo or the local hub.

gloo forgives what hangs NCCL: it has no communicators to create, and a send may complete
before its receive is posted. :class:`NcclSim` wraps a transport that lacks these rules
(``DistTransport`` on gloo, or a ``LocalHub``'s transport) and adds them:

- **creation**: :meth:`NcclSim.connect` blocks until every member of the communicator has
  connected (through the job's store across processes, a condition within one), or fails after
  ``timeout`` naming the members missing and where each of them is blocked. A communicator used
  before it was connected is connected then, on the calling thread, as NCCL does inside the call.
- **streams**: one worker thread per communicator runs its operations in posting order. A send
  hands its message to the inner transport and then waits for the receiver's acknowledgement,
  sent once the matching receive ran: it completes only when its receive runs and holds back the
  communicator's later operations until then. A collective runs on the inner transport.

Handles complete when the worker has finished the operation. An operation that waits longer than
``timeout`` fails, with every later one of its communicator, naming the communicator, the
operation's position on it and the peer.
"""
from __future__ import annotations

import datetime
import itertools
import queue
import threading
from typing import Any, Callable, Sequence

import torch

from ..errors import CommTimeout
from .base import Handle, Transport, Future
from .nccl import Comm, p2p_comm

__all__ = ["NcclSim", "StoreRendezvous", "LocalRendezvous", "CommInitTimeout"]

DATA, ACK = 0, 1  # inner tags: messages, and the receivers' acknowledgements


class CommInitTimeout(CommTimeout):
    """A communicator was not created in time: a member never reached its first use."""

    @property
    def detail(self) -> str:
        return str(self)


class _OpTimeout(CommTimeout):
    """An operation of a communicator's stream did not complete in time."""

    @property
    def detail(self) -> str:
        return str(self)


class StoreRendezvous:
    """Creation of communicators across processes, through a ``torch.distributed`` store (every
    rank must build its transports in the same order: keys are numbered per instance)."""

    _instances = itertools.count()

    def __init__(self, store: Any = None) -> None:
        import torch.distributed as dist
        if store is None:
            store = dist.distributed_c10d._get_default_store()
        self.store = dist.PrefixStore(f"pipert/ncclsim/{next(self._instances)}/", store)

    def join(self, comm: Comm, rank: int, where: str, timeout: float) -> None:
        st = self.store
        st.set(f"at/{rank}", f"blocked creating {comm} at {where}")
        st.set(f"{comm}/{rank}", "1")
        others = [m for m in comm.ranks if m != rank]
        try:
            st.wait([f"{comm}/{m}" for m in others], datetime.timedelta(seconds=timeout))
        except Exception:  # noqa: BLE001 - the store's timeout error type differs between versions
            missing = [m for m in others if not st.check([f"{comm}/{m}"])]
            raise CommInitTimeout(_init_message(comm, rank, where, timeout, missing, self._at)) from None
        st.set(f"at/{rank}", f"running (created {comm})")

    def _at(self, m: int) -> str:
        return self.store.get(f"at/{m}").decode() if self.store.check([f"at/{m}"]) else "not started"


class LocalRendezvous:
    """Creation of communicators among the ranks (threads) of one process."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.arrived: dict[Comm, set[int]] = {}
        self.at: dict[int, str] = {}
        self.failed = ""

    def fail(self, message: str) -> None:
        with self.cond:
            self.failed = message
            self.cond.notify_all()

    def join(self, comm: Comm, rank: int, where: str, timeout: float) -> None:
        with self.cond:
            self.at[rank] = f"blocked creating {comm} at {where}"
            here = self.arrived.setdefault(comm, set())
            here.add(rank)
            self.cond.notify_all()
            ok = self.cond.wait_for(lambda: here >= set(comm.ranks) or bool(self.failed), timeout)
            if self.failed and not here >= set(comm.ranks):
                from ..errors import PeerFailure
                raise PeerFailure(self.failed)
            if not ok:
                missing = sorted(set(comm.ranks) - here)
                raise CommInitTimeout(_init_message(comm, rank, where, timeout, missing,
                                                    lambda m: self.at.get(m, "not started")))
            self.at[rank] = f"running (created {comm})"


def _init_message(comm: Comm, rank: int, where: str, timeout: float, missing: list[int],
                  at: Callable[[int], str]) -> str:
    return (f"communicator {comm} not created after {timeout:g} s: rank {rank} waits at {where} for "
            + "; ".join(f"rank {m} ({at(m)})" for m in missing))


class _OpFuture(Future):
    """The handle of one operation of a communicator's stream; its timeout names the operation."""

    def __init__(self, what: str) -> None:
        super().__init__()
        self.what = what

    def wait(self, timeout: float) -> None:
        try:
            super().wait(timeout)
        except CommTimeout as e:
            if e is self.error:
                raise
            raise _OpTimeout(f"{self.what} did not complete in {timeout:g} s") from None


class _Stream:
    """One communicator's operations on this rank, run in posting order by one thread."""

    def __init__(self, comm: Comm, rank: int, timeout: float) -> None:
        self.comm, self.timeout = comm, timeout
        self.items: queue.SimpleQueue = queue.SimpleQueue()
        self.error: BaseException | None = None
        self.count = 0
        self.thread = threading.Thread(target=self._run, daemon=True, name=f"pipert-nccl-r{rank}-{comm}")
        self.thread.start()

    def put(self, fn: Callable[[float], None], what: str) -> Handle:
        self.count += 1
        fut = _OpFuture(f"operation #{self.count} on communicator {self.comm} ({what})")
        self.items.put((fn, fut.what, fut))
        return fut

    def _run(self) -> None:
        while True:
            item = self.items.get()
            if item is None:
                return
            fn, what, fut = item
            if self.error is None:
                try:
                    fn(self.timeout)
                except CommTimeout:
                    self.error = _OpTimeout(f"{what} did not complete in {self.timeout:g} s")
                except BaseException as e:  # noqa: BLE001 - handed to whoever waits on the operation
                    self.error = e
            fut.set(self.error)

    def close(self) -> None:
        self.items.put(None)

    def join(self, timeout: float) -> None:
        """Wait (up to ``timeout``) for the thread to end: a thread still running at interpreter
        exit that frees a tensor is ended mid-free by Python's finalization, which aborts the
        process."""
        if self.thread is not threading.current_thread():
            self.thread.join(timeout)


class NcclSim:
    """``inner`` with NCCL's rules (module doc). ``rendezvous``: a :class:`StoreRendezvous`
    (processes) or :class:`LocalRendezvous` (threads of one process)."""

    lazy = True
    """Communicators are created at first use (``Pipeline`` warms them up first)."""

    def __init__(self, inner: Transport, rendezvous: Any, timeout: float) -> None:
        self.inner, self.rendezvous, self.timeout = inner, rendezvous, timeout
        self.rank, self.world_size = inner.rank, inner.world_size
        self.connected: set[Comm] = set()
        self.streams: dict[Comm, _Stream] = {}
        self._lock = threading.Lock()

    def is_connected(self, comm: Comm) -> bool:
        return comm in self.connected

    def connect(self, comm: Comm, where: str = "its first use", timeout: float | None = None) -> None:
        """Create ``comm``: block until every member connected (CommInitTimeout after ``timeout``)."""
        if comm in self.connected:
            return
        self.rendezvous.join(comm, self.rank, where, self.timeout if timeout is None else timeout)
        self.connected.add(comm)

    def _stream(self, comm: Comm, what: str) -> _Stream:
        if comm not in self.connected:
            self.connect(comm, what)
        with self._lock:
            s = self.streams.get(comm)
            if s is None:
                s = self.streams[comm] = _Stream(comm, self.rank, self.timeout)
        return s

    def isend(self, tensor: torch.Tensor, peer: int) -> Handle:
        inner, ack = self.inner, torch.empty(1)

        def send(timeout: float) -> None:
            inner.isend(tensor, peer, tag=DATA).wait(timeout)
            inner.irecv(ack, peer, tag=ACK).wait(timeout)
        return self._stream(p2p_comm(self.rank, peer), f"send to {peer}").put(send, f"send to rank {peer}")

    def irecv(self, tensor: torch.Tensor, peer: int) -> Handle:
        inner, ack = self.inner, torch.ones(1)

        def recv(timeout: float) -> None:
            inner.irecv(tensor, peer, tag=DATA).wait(timeout)
            inner.isend(ack, peer, tag=ACK).wait(timeout)
        return self._stream(p2p_comm(peer, self.rank), f"receive from {peer}").put(recv, f"receive from rank {peer}")

    def collective(self, op: str, tensor: torch.Tensor, group: Sequence[int], root: int | None,
                   out: torch.Tensor | None = None) -> Handle:
        ranks = tuple(sorted(set(group)))
        if len(ranks) == 1:
            return self.inner.collective(op, tensor, group, root, out)
        inner = self.inner

        def run(timeout: float) -> None:
            inner.collective(op, tensor, group, root, out).wait(timeout)
        return self._stream(Comm("group", ranks), op).put(run, f"{op} over {list(ranks)}")

    def close(self) -> None:
        """End the communicators' threads (after the last operation was waited for) and wait for
        them (each operation is bounded by the timeout)."""
        streams, self.streams = list(self.streams.values()), {}
        for s in streams:
            s.close()
        for s in streams:
            s.join(self.timeout + 1.0)
