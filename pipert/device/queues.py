"""Where the executor's three queues run (docs/semantics.md, "The three queues and time").

- :class:`StreamQueues`: on a StreamSet of ``pipert.device.streams`` (pipert._C worker threads on
  a CPU, the pure-Python threads with ``PIPERT_NO_EXT=1``, a compute stream and high-priority
  send and receive streams on a GPU). The host issues the whole program; a SEND, RECV or
  collective waits for the event the compute queue recorded after the last compute-queue action
  before it (it is posted when the program reaches it), a compute for the events of the receives
  and collectives that bring what it reads. Receives are only posted on the receive stream; the
  compute that reads a value completes its receive, so a receive not yet needed never blocks the
  compute queue.
- :class:`HostQueues`: every action runs on the calling thread in list order (the same timing
  model, one thread); used where a per-action snapshot is taken (memory measurement, recording).

``finish()`` is the host's one wait of a step: the compute queue waits for the other two and the
host for the compute queue. ``after(fn)`` runs ``fn`` on the host once the queues finished, with
the compute queue's stream current (a GPU): stream waits it issues order the next step's work.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable

import torch

__all__ = ["HostQueues", "StreamQueues", "make_queues"]


class HostQueues:
    """All three queues on the calling thread."""

    name = "host"

    def compute(self, fn: Callable[[], None], waits: Iterable[Any] = ()) -> None:
        fn()

    def send(self, fn: Callable[[], None], waits: Iterable[Any] = ()) -> None:
        fn()

    def recv(self, fn: Callable[[], None], waits: Iterable[Any] = ()) -> None:
        fn()

    def finish(self, timeout: float | None = None) -> bool:
        return True

    def after(self, fn: Callable[[], None]) -> None:
        fn()

    def close(self) -> None:
        return None


class StreamQueues:
    """The queues on a StreamSet (module doc). Each ``compute``/``send``/``recv`` returns the
    event recorded after the item."""

    def __init__(self, device: torch.device | str = "cpu", backend: str | None = None, name: str = "") -> None:
        from .streams import StreamSet
        self.set = StreamSet(device, name=name, backend=backend)
        self.name = self.set.backend
        self.last: Any = None  # event after the last compute-queue action issued

    def _on(self, stream: Any, fn: Callable[[], None], waits: Iterable[Any], posted: bool) -> Any:
        if posted and self.last is not None:
            stream.wait(self.last)
        for ev in waits:
            stream.wait(ev)
        stream.enqueue(fn)
        return stream.record()

    def compute(self, fn: Callable[[], None], waits: Iterable[Any] = ()) -> Any:
        self.last = self._on(self.set.compute, fn, waits, posted=False)
        return self.last

    def send(self, fn: Callable[[], None], waits: Iterable[Any] = ()) -> Any:
        return self._on(self.set.send, fn, waits, posted=True)

    def recv(self, fn: Callable[[], None], waits: Iterable[Any] = ()) -> Any:
        return self._on(self.set.recv, fn, waits, posted=True)

    def finish(self, timeout: float | None = None) -> bool:
        """Wait for every queue, with one host wait (module doc); errors of items surface through
        the executor (it keeps the first exception an item raised), so the streams' own error
        text is not needed here. On a GPU, False when the queues have not finished after
        ``timeout`` seconds (the host polls the one event, once per step); CPU streams time out
        their own waits, so there this returns when they have finished."""
        s = self.set
        s.compute.wait(s.send.record())
        s.compute.wait(s.recv.record())
        if timeout is not None and s.backend == "cuda" and not _done_within(s.compute.record(), timeout):
            return False
        try:
            s.compute.synchronize()
        except RuntimeError:  # a failed stream skips its waits: wait for each stream in turn
            try:
                s.synchronize()
            except RuntimeError:
                pass
        self.last = None
        return True

    def after(self, fn: Callable[[], None]) -> None:
        if self.set.backend == "cuda":
            self.set.compute.enqueue(fn)  # on the host now, the compute stream current
        else:
            fn()  # CPU streams: the queues are idle after finish(); the host is the compute queue

    def close(self) -> None:
        self.set.close()


def _done_within(event: Any, timeout: float) -> bool:
    """Whether ``event`` completes within ``timeout`` seconds (polled every millisecond)."""
    import time
    deadline = time.monotonic() + timeout
    while not event.query():
        if time.monotonic() > deadline:
            return False
        time.sleep(1e-3)
    return True


def make_queues(kind: str, device: torch.device | str, name: str = "") -> HostQueues | StreamQueues:
    """``kind``: "host", or "streams" (the device's default stream backend)."""
    if kind == "host":
        return HostQueues()
    if kind == "streams":
        return StreamQueues(device, name=name)
    raise ValueError(f"queues {kind!r} unknown; allowed: 'streams', 'host'")
