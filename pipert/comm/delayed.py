"""``DelayedTransport``: messages and collectives across emulated links (docs/semantics.md)."""
from __future__ import annotations

import time
from typing import Any, Sequence

import torch

from ..errors import CommTimeout, PeerFailure
from .base import Future, Handle, Transport

__all__ = ["DelayedTransport"]


class _Deferred:
    """The handle of a message the link emulator hands to the inner transport later: complete
    once it was handed over (the emulated arrival) and the inner send completed."""

    def __init__(self) -> None:
        self._handed = Future()
        self.inner: Handle | None = None

    def hand_over(self, post) -> None:
        try:
            self.inner = post()
        except BaseException as e:  # noqa: BLE001 - raised by wait()
            self._handed.set(e if isinstance(e, (CommTimeout, PeerFailure)) else PeerFailure(str(e)))
            return
        self._handed.set()

    def wait(self, timeout: float) -> None:
        t0 = time.monotonic()
        self._handed.wait(timeout)
        self.inner.wait(max(timeout - (time.monotonic() - t0), 0.0))

    def done(self) -> bool:
        return self._handed.done() and (self._handed.error is not None or self.inner.done())


def _copied_event(t: torch.Tensor) -> Any:
    """A CUDA event after the work queued so far on the current stream (None on a CPU)."""
    if t.device.type != "cuda":
        return None
    ev = torch.cuda.Event()
    ev.record()
    return ev


class DelayedTransport:
    """A transport whose point-to-point messages cross emulated links (``emulator``: a
    ``pipert.comm.links.LinkEmulator``, the numbers of ``pipert.cost.Links``).

    A send is the message's ready time: the message occupies its directed link for
    ``bytes / bandwidth`` after the previous message of that link (FIFO per link, kept by the
    sender, which alone sends on it) and arrives one latency after its occupancy ends. Latency
    the receiver's own compute already covered is not paid again (CrossPipe's receiver-side
    rule). A free link (no latency, unlimited bandwidth) sends at once. The payload is copied at
    the send, so the sender may change or free its tensor (weights after an OPT) while the
    message travels. A collective over a group whose ring crosses an emulated link is held for
    its price (``pipert.comm.collectivelinks``: the simulator's ring time, FIFO per group) and
    then handed to the inner transport; a group inside one datacenter or node goes straight
    through. Two paths for messages (``path``):

    - "timer": the message is handed to the inner transport at its arrival by the emulator's
      timer thread (C++ with pipert._C, Python without); the receiver posts an ordinary receive
      and no clock is shared between processes. GPU tensors wait for their copy's CUDA event.
    - "stream" (``pipert.comm.linkframes``): the sender's send queue holds the occupancy and
      sends a frame that carries the message's timing; the receiver's receive queue waits for
      the arrival, moved into its own clock by ``clock_offsets[peer]`` (ns, this rank's clock
      minus the peer's; none: one clock). On a GPU both waits are one-thread kernels on the
      send and receive streams and the host never blocks; on a CPU the same steps sleep on the
      calling thread (the mirror the tests run).
      Under host-staged gloo a poster thread hands each frame to gloo once its copy out is done.
    - "auto" (default): "stream" for CUDA tensors when pipert._C has CUDA (NCCL, or gloo with
      host staging), else "timer". Both ends decide alike, so frames match."""

    PATHS = ("auto", "timer", "stream")

    def __init__(self, inner: Transport, emulator: Any, path: str = "auto",
                 clock_offsets: dict[int, int] | None = None) -> None:
        if emulator.num_ranks != inner.world_size:
            raise ValueError(f"the link emulator has {emulator.num_ranks} ranks, the transport {inner.world_size}")
        if path not in self.PATHS:
            raise ValueError(f"path {path!r} unknown; allowed: {', '.join(self.PATHS)}")
        self.inner, self.emulator, self.path = inner, emulator, path
        self.rank, self.world_size = inner.rank, inner.world_size
        self.clock_offsets = dict(clock_offsets or {})
        self._frames: dict[torch.device, Any] = {}

    def takes_stream_path(self, device: torch.device) -> bool:
        """Whether messages of tensors on ``device`` take the stream path (class doc)."""
        from .. import _ext
        if self.path != "auto":
            return self.path == "stream"
        return device.type == "cuda" and _ext.HAVE_EXT_CUDA

    def ops(self, device: torch.device) -> Any:
        """The link steps of the stream path on ``device`` (pipert.comm.linkframes)."""
        from .linkframes import CudaOps, HostOps
        return CudaOps(self.emulator, device) if device.type == "cuda" else HostOps(self.emulator)

    def _stream_path(self, tensor: torch.Tensor) -> Any:
        """The FramedLinks of ``tensor``'s device on the stream path, else None."""
        if not self.takes_stream_path(tensor.device):
            return None
        links = self._frames.get(tensor.device)
        if links is None:
            from .linkframes import FramedLinks
            links = FramedLinks(self.emulator, self.rank, self.ops(tensor.device), self.clock_offsets)
            self._frames[tensor.device] = links
        return links

    def isend(self, tensor: torch.Tensor, peer: int) -> Handle:
        spec = self.emulator.link(self.rank, peer)
        nbytes = tensor.numel() * tensor.element_size()
        if spec.latency == 0 and spec.occupancy(nbytes) == 0:
            return self.inner.isend(tensor, peer)
        framed = self._stream_path(tensor)
        if framed is not None:
            return framed.isend(self.inner, tensor, peer)
        data = tensor.detach().clone()
        copied = _copied_event(data)
        handle = _Deferred()

        def post() -> Handle:
            if copied is not None:  # the timer thread's stream waits for the copy on the send stream
                torch.cuda.current_stream(data.device).wait_event(copied)
            return self.inner.isend(data, peer)
        self.emulator.deliver(self.rank, peer, nbytes, lambda: handle.hand_over(post))
        return handle

    def irecv(self, tensor: torch.Tensor, peer: int) -> Handle:
        spec = self.emulator.link(peer, self.rank)
        framed = self._stream_path(tensor)
        if framed is None or (spec.latency == 0 and spec.occupancy(tensor.numel() * tensor.element_size()) == 0):
            return self.inner.irecv(tensor, peer)
        return framed.irecv(self.inner, tensor, peer)

    def collective(self, op: str, tensor: torch.Tensor, group: Sequence[int], root: int | None,
                   out: torch.Tensor | None = None) -> Handle:
        """``group`` in the action's order: its ring is what the collective is priced on."""
        links = self.emulator.collectives
        if not links.crosses(group):
            return self.inner.collective(op, tensor, group, root, out)
        whole = out if op == "ALLGATHER" else tensor
        nbytes = whole.numel() * whole.element_size()
        # a tensor this member only gives is copied at the post: its owner may change it meanwhile
        gives = out is not None or (op == "BROADCAST" and self.rank == root) or (op == "REDUCE" and self.rank != root)
        data = tensor.detach().clone() if gives else tensor
        copied = _copied_event(data)
        handle = _Deferred()

        def post() -> Handle:
            if copied is not None:  # the timer thread's stream waits for the work queued before the post
                torch.cuda.current_stream(data.device).wait_event(copied)
            return self.inner.collective(op, data, group, root, out)
        links.hold(self.rank, op, group, nbytes, lambda: handle.hand_over(post))
        return handle
