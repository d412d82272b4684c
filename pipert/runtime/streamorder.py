"""Ordering between the streams of two ranks of one process (the local transport on a GPU).

A rank's host thread issues work on its current stream and returns before the device ran it,
so a tensor handed to another rank is only usable there once the other rank's stream waited
for an event recorded after the producer's work. The local transport asks an :class:`Order`
for three things, at fixed points (``pipert.runtime.transport``):

- ``ready(t)``: an event after the work queued so far on the current stream of ``t``'s device
  (None when there is nothing to order, e.g. a CPU tensor: the host already ran it);
- ``after(event, t)``: the current stream of ``t``'s device waits for ``event`` (no host wait);
- ``hold(t)``: ``t``'s memory is not reused before the work queued on the current stream so far
  is done (the caching allocator's ``record_stream``), for a tensor that another stream made.

:class:`CudaOrder` does this with CUDA events and is the default: on CPU tensors every call is
a no-op. Tests pass a recording stand-in to check where the transport calls them.
"""
from __future__ import annotations

from typing import Any, Protocol

import torch

__all__ = ["Order", "CudaOrder", "Unordered", "slow_producer_check"]


class Order(Protocol):
    def ready(self, t: torch.Tensor) -> Any: ...

    def after(self, event: Any, t: torch.Tensor) -> None: ...

    def hold(self, t: torch.Tensor) -> None: ...


class CudaOrder:
    """The three steps with CUDA events on the calling thread's current stream."""

    def ready(self, t: torch.Tensor) -> Any:
        if not t.is_cuda:
            return None
        ev = torch.cuda.Event()
        ev.record(torch.cuda.current_stream(t.device))
        return ev

    def after(self, event: Any, t: torch.Tensor) -> None:
        if event is not None:
            torch.cuda.current_stream(t.device).wait_event(event)

    def hold(self, t: torch.Tensor) -> None:
        if t.is_cuda:
            t.record_stream(torch.cuda.current_stream(t.device))


class Unordered:
    """No ordering between streams (a demonstration of the race :class:`CudaOrder` prevents)."""

    def ready(self, t: torch.Tensor) -> Any:
        return None

    def after(self, event: Any, t: torch.Tensor) -> None:
        return None

    def hold(self, t: torch.Tensor) -> None:
        return None


def slow_producer_check(device: torch.device, order: Order | None = None, seconds: float = 0.05,
                        numel: int = 1 << 20) -> tuple[float, float]:
    """Two ranks of one process on two streams of a GPU over a LocalHub with ``order``: the
    sender's stream runs a long kernel (``seconds``) before it writes the tensor it sends; the
    receiver sums what it received on its own stream as soon as its receive completed on the
    host. Returns (the sum sent, the sum received); they differ when the receiver's stream did
    not wait for the sender's."""
    from .streams import _sleep_cycles
    from .transport import LocalHub
    hub = LocalHub(2, order=order)
    sender, receiver = hub.transport(0), hub.transport(1)
    s0, s1 = torch.cuda.Stream(device), torch.cuda.Stream(device)
    x = torch.zeros(numel, device=device)
    out = torch.zeros(numel, device=device)
    cycles = _sleep_cycles(device, seconds)
    torch.cuda.synchronize(device)
    with torch.cuda.stream(s0):
        torch.cuda._sleep(cycles)  # the producer's long kernel
        x.fill_(3.0)
        sender.isend(x, 1)
    with torch.cuda.stream(s1):
        receiver.irecv(out, 0).wait(10.0)
        got = out.sum()
    torch.cuda.synchronize(device)
    return 3.0 * numel, float(got)
