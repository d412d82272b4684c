"""The interface every transport gives (``isend``/``irecv``/``collective`` return a handle whose
``wait(timeout)`` completes the operation or raises ``CommTimeout``) and the handles shared by
the transports (docs/architecture.md).

Point-to-point messages on one directed link are matched in posting order (FIFO), the rule the
validator enforces, so gloo, NCCL, nccl-sim and the local transport agree.

Stream semantics: a handle whose ``stream_waits`` is True also has ``wait_stream()``, which
orders the operation before whatever the calling thread issues next on its current CUDA
stream and returns without waiting on the host (NCCL's ``Work.wait()`` without a timeout).
A hang is then caught by the process group's timeout (NCCL's watchdog), not by the caller.
The executor completes such handles with ``wait_stream()`` (:func:`stream_waits`) and every
other handle with ``wait(timeout)``, which on a CPU is the wait of the worker thread that
plays the stream.
"""
from __future__ import annotations

import threading
from typing import Any, Protocol, Sequence

import torch

from ..errors import CommTimeout

__all__ = ["Handle", "Transport", "COLLECTIVES", "stream_waits", "Done", "Then", "Future", "alone"]


class Handle(Protocol):
    def wait(self, timeout: float) -> None: ...

    def done(self) -> bool: ...


def stream_waits(handle: Any) -> bool:
    """Whether ``handle`` completes on the stream: ``handle.wait_stream()`` (module doc)."""
    return getattr(handle, "stream_waits", False) is True


class Transport(Protocol):
    rank: int
    world_size: int

    def isend(self, tensor: torch.Tensor, peer: int) -> Handle: ...

    def irecv(self, tensor: torch.Tensor, peer: int) -> Handle: ...

    def collective(self, op: str, tensor: torch.Tensor, group: Sequence[int], root: int | None,
                   out: torch.Tensor | None = None) -> Handle: ...


COLLECTIVES = ("ALLREDUCE", "BROADCAST", "REDUCE", "ALLGATHER", "REDUCESCATTER")
"""Every transport runs these. ALLGATHER and REDUCESCATTER write ``out`` (the gathered whole,
or this member's share of the sum: share k for the k-th rank of the sorted group); the others
work in place on ``tensor``."""


class Done:
    stream_waits = False

    def wait(self, timeout: float) -> None:
        return None

    def done(self) -> bool:
        return True


class Then:
    """A handle that runs ``fn`` once ``inner`` completed (a collective emulated in two steps)."""

    def __init__(self, inner: Handle, fn) -> None:
        self.inner, self.fn, self.ran = inner, fn, False
        self.stream_waits = stream_waits(inner)

    def wait(self, timeout: float) -> None:
        self.inner.wait(timeout)
        self._then()

    def wait_stream(self) -> None:
        self.inner.wait_stream()
        self._then()  # queued on the current stream after its wait

    def _then(self) -> None:
        if not self.ran:
            self.ran = True
            self.fn()

    def done(self) -> bool:
        return self.ran or self.inner.done()


# --------------------------------------------------------------------------- torch.distributed


class Future:
    def __init__(self) -> None:
        self._event = threading.Event()
        self.error: BaseException | None = None

    def set(self, error: BaseException | None = None) -> None:
        self.error = error
        self._event.set()

    def wait(self, timeout: float) -> None:
        if not self._event.wait(timeout):
            raise CommTimeout(f"timed out after {timeout:g} s")
        if self.error is not None:
            raise self.error

    def done(self) -> bool:
        return self._event.is_set()


def alone(group: Sequence[int], tensor: torch.Tensor, out: torch.Tensor | None) -> Handle | None:
    """A collective over this rank alone, done at once (``out``, if any, gets ``tensor``); None
    when the group has other members."""
    if len(set(group)) > 1:
        return None
    if out is not None:
        out.copy_(tensor)
    return Done()
