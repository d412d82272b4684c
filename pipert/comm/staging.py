"""Host staging of point-to-point messages through the pinned pool (``pipert.device.pinned``).

A transport that carries only host memory (gloo) moves GPU tensors through page-locked
buffers of a :class:`PinnedPool`: a send copies the tensor into a buffer on the stream it is
issued on (the send stream of the executor's queues) and posts the buffer once the copy is
done; a receive posts a buffer and, when completed, copies it into the tensor on the stream
of its reader. Each buffer goes back to the pool when its message is done with it (a send:
when the transport completed it; a receive: once the copy out of it completed), so a step
holds at most its messages in flight and the next step reuses the same blocks.
The same pool serves OFFLOAD/PREFETCH (``UnitState.stage``).
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from ..device.pinned import PinnedBuffer, PinnedPool
from .base import Handle, Transport

__all__ = ["StagedTransport", "needs_staging"]


def needs_staging(backend: str, device: torch.device) -> bool:
    """Whether messages of tensors on ``device`` must be staged in host memory for ``backend``
    (a torch.distributed backend name): gloo cannot read GPU memory."""
    return backend == "gloo" and device.type == "cuda"


def _event() -> Any:
    """An event after the work queued so far on the current CUDA stream (None on a CPU)."""
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    ev = torch.cuda.Event()
    ev.record()
    return ev


class _StagedSend:
    def __init__(self, inner: Handle, buf: PinnedBuffer) -> None:
        self.inner, self.buf = inner, buf

    def _free(self) -> None:
        if self.buf is not None:
            self.buf.release()
            self.buf = None

    def wait(self, timeout: float) -> None:
        self.inner.wait(timeout)
        self._free()

    def done(self) -> bool:
        if self.inner.done():
            self._free()
            return True
        return False


class _StagedRecv:
    def __init__(self, inner: Handle, buf: PinnedBuffer, tensor: torch.Tensor) -> None:
        self.inner, self.buf, self.tensor = inner, buf, tensor

    def wait(self, timeout: float) -> None:
        self.inner.wait(timeout)
        if self.buf is None:
            return
        src = self.buf.view(self.tensor.dtype, self.tensor.shape)
        self.tensor.copy_(src, non_blocking=True)  # on the reader's stream; the buffer waits for it
        self.buf.release(after=_event())
        self.buf = None

    def done(self) -> bool:
        return self.inner.done()


class StagedTransport:
    """``inner`` for messages of tensors that ``stage(tensor)`` selects, through buffers of
    ``pool`` (module doc); every other tensor, and every collective, goes straight to ``inner``."""

    def __init__(self, inner: Transport, pool: PinnedPool,
                 stage: Callable[[torch.Tensor], bool] = lambda t: True) -> None:
        self.inner, self.pool, self.stage = inner, pool, stage
        self.rank, self.world_size = inner.rank, inner.world_size

    def isend(self, tensor: torch.Tensor, peer: int) -> Handle:
        if not self.stage(tensor):
            return self.inner.isend(tensor, peer)
        buf = self.pool.acquire(tensor.numel() * tensor.element_size())
        host = buf.view(tensor.dtype, tensor.shape)
        host.copy_(tensor.detach(), non_blocking=True)  # on the send stream
        ev = _event()
        if ev is not None:
            ev.synchronize()  # the host transport reads the buffer as soon as the send is posted
        return _StagedSend(self.inner.isend(host, peer), buf)

    def irecv(self, tensor: torch.Tensor, peer: int) -> Handle:
        if not self.stage(tensor):
            return self.inner.irecv(tensor, peer)
        buf = self.pool.acquire(tensor.numel() * tensor.element_size())
        return _StagedRecv(self.inner.irecv(buf.view(tensor.dtype, tensor.shape), peer), buf, tensor)

    def collective(self, op: str, tensor: torch.Tensor, group: Sequence[int], root: int | None,
                   out: torch.Tensor | None = None) -> Handle:
        return self.inner.collective(op, tensor, group, root, out)
