"""Ordering between the streams of two ranks of one process (the local transport on a GPU).

A rank's host thread issues work on its current stream and returns before the device ran it,
so a tensor handed to another rank is only usable there once the other rank's stream waited
for an event recorded after the producer's work. The local transport asks an :class:`Order`
for three things, at fixed points (``pipert.comm.local``):

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

__all__ = ["Order", "CudaOrder", "Unordered"]


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
