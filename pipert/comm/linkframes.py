"""Link delays applied on the queues of both ends of a message (the stream path of
:class:`pipert.comm.delayed.DelayedTransport`).

A delayed message travels as a *frame*: its payload bytes, padded to 8, then three int64
words (depart, free_at, arrive) of its link timing in the sender's clock (ns). The frame
carries the departure, so no clock has to be shared for the FIFO rule, only for the arrival.

- Sender, in order on its send queue: ``link_send`` schedules the message on its directed
  link (``link_schedule`` of csrc/core/link_math.h: FIFO per link, the link's ``free_at``
  kept on the sender, which alone sends on it), writes the words into the frame and holds
  the queue until ``free_at``; then the inner transport sends the frame. The next message
  may depart while this one is in its latency.
- Receiver: the inner transport receives the frame; on the receive queue, ``link_recv``
  waits until ``link_read_at(arrive, offset)`` (the arrival in the receiver's clock) and the
  payload is copied out. Latency the receiver spent computing before it reads is not paid
  again (CrossPipe's receiver-side rule): the wait ends at once when that time has passed.

Two implementations of the same two steps (:class:`HostOps`, :class:`CudaOps`):

- on a GPU, one-thread kernels of pipert._C read ``%globaltimer``; ``free_at`` lives in device
  memory of the sender. The host never blocks: the receive side waits for the inner receive as
  stream work (``Work.wait()`` of NCCL). Each directed link has its own streams (high priority)
  on both ends: a sender's stream per peer runs the frame copy, the occupancy and the inner
  send after the send queue reached the message; a receiver's stream per peer runs the wait for
  the frame, the arrival and the copy out after the receive queue posted it. So a link held by
  a delay never holds back another link's messages, and each link stays FIFO (one stream);
- on a CPU (the mirror the tests run), the same math on :func:`pipert.device.streams.clock`
  with the link core of the emulator, sleeping on the calling thread.

Clocks: ``%globaltimer`` of the GPUs in one host is one clock (as CLOCK_MONOTONIC is for the
processes of one host), so ``offset`` is 0 there. Across hosts it is not: :func:`clock_offsets`
estimates each peer's offset by ping-pong over the transport (error within half the round trip
of the best of ``rounds``; estimated once, so the clocks' drift, some ppm, adds up over a long
job), and :func:`link_clock_offsets` picks one or the other.

Host-staged gloo (a :class:`pipert.comm.staging.StagedTransport` inner): the send stream
copies the frame into a pinned buffer after the occupancy, and a poster thread (one per rank,
in send order, so FIFO per link holds) posts the gloo send once that copy is done, so the
host of the send queue does not wait for the occupancy either; the receiver's reader waits
for gloo as every staged receive does, then the copy in and ``link_recv`` run on its stream.
"""
from __future__ import annotations

import queue
import socket
import threading
import time
from typing import Any, Callable, Iterable, Mapping

import torch

from .. import _ext
from ..device.streams import COMM_PRIORITY, clock, sleep_until
from ..errors import CommTimeout, PeerFailure
from .base import stream_waits

__all__ = ["WORDS", "frame_size", "link_read_at", "HostOps", "CudaOps", "FramedLinks", "clock_offsets",
           "link_clock_offsets", "dist_clock_offsets"]

WORDS = 3
"""int64 words after the payload: depart, free_at, arrive (sender's clock, ns)."""


def link_read_at(arrive: int, clock_offset: int) -> int:
    """When a message may be read in the receiver's clock (ns): its arrival in the sender's clock
    plus ``clock_offset`` = receiver clock - sender clock (csrc/core/link_math.h, the same)."""
    return arrive + clock_offset


def _padded(nbytes: int) -> int:
    return (nbytes + 7) // 8 * 8


def frame_size(nbytes: int) -> int:
    """Bytes of the frame of a payload of ``nbytes``."""
    return _padded(nbytes) + 8 * WORDS


def _bytes_of(t: torch.Tensor) -> torch.Tensor:
    if not t.is_contiguous():
        raise ValueError(f"a delayed message needs a contiguous tensor; got shape {tuple(t.shape)} "
                         f"with strides {t.stride()}")
    return t.detach().reshape(-1).view(torch.uint8)


def _words(frame: torch.Tensor, nbytes: int) -> torch.Tensor:
    return frame[_padded(nbytes):].view(torch.int64)


class HostOps:
    """The two link steps on the host clock (CPU mirror of :class:`CudaOps`)."""

    def __init__(self, emulator: Any) -> None:
        self.emulator = emulator

    def link_send(self, src: int, dst: int, nbytes: int, words: torch.Tensor) -> None:
        t = self.emulator._core.schedule(src, dst, float(nbytes), clock())  # link_schedule, seconds
        words.copy_(torch.tensor([round(v * 1e9) for v in t], dtype=torch.int64))
        sleep_until(t[1])

    def link_recv(self, words: torch.Tensor, clock_offset: int) -> None:
        sleep_until(link_read_at(int(words[2]), clock_offset) * 1e-9)

    def stamp(self, out: torch.Tensor) -> None:
        out.fill_(round(clock() * 1e9))


class CudaOps:
    """The two link steps as one-thread kernels on the current stream of ``device``."""

    def __init__(self, emulator: Any, device: torch.device) -> None:
        if not _ext.HAVE_EXT_CUDA:
            raise RuntimeError(f"link delays on CUDA streams need pipert._C built with CUDA: {_ext.load_error}")
        self.emulator, self.device = emulator, device
        self.state = emulator.device_state(device)

    def _stream(self) -> int:
        return torch.cuda.current_stream(self.device).cuda_stream

    def link_send(self, src: int, dst: int, nbytes: int, words: torch.Tensor) -> None:
        spec = self.emulator.link(src, dst)
        free_at = self.state.free_at.data_ptr() + 8 * (src * self.emulator.num_ranks + dst)
        with torch.cuda.device(self.device):  # a kernel launches on its stream's device
            _ext.C.cuda_link_send(self._stream(), free_at, round(spec.occupancy(float(nbytes)) * 1e9),
                                  round(spec.latency * 1e9), words.data_ptr())

    def link_recv(self, words: torch.Tensor, clock_offset: int) -> None:
        with torch.cuda.device(self.device):
            _ext.C.cuda_link_recv(self._stream(), words.data_ptr(), clock_offset)

    def stamp(self, out: torch.Tensor) -> None:
        with torch.cuda.device(self.device):
            _ext.C.cuda_globaltimer(self._stream(), out.data_ptr())


class _Sent:
    """Keeps the frame alive until the inner send is done."""

    def __init__(self, inner: Any, frame: torch.Tensor) -> None:
        self.inner, self.frame = inner, frame
        self.stream_waits = stream_waits(inner)

    def wait(self, timeout: float) -> None:
        self.inner.wait(timeout)

    def wait_stream(self) -> None:
        self.inner.wait_stream()

    def done(self) -> bool:
        return self.inner.done()


class _Posted:
    """A staged frame the poster thread hands to gloo later: complete once posted and the gloo send
    completed; its pinned buffer goes back to the pool then."""

    def __init__(self, buf: Any) -> None:
        self.buf, self.inner, self.error = buf, None, None
        self._posted = threading.Event()

    def hand_over(self, post: Callable[[], Any]) -> None:
        try:
            self.inner = post()
        except BaseException as e:  # noqa: BLE001 - raised by wait()
            self.error = e if isinstance(e, (CommTimeout, PeerFailure)) else PeerFailure(str(e))
        self._posted.set()

    def _free(self) -> None:
        if self.buf is not None:
            self.buf.release()
            self.buf = None

    def wait(self, timeout: float) -> None:
        t0 = time.monotonic()
        if not self._posted.wait(timeout):
            raise CommTimeout(f"timed out after {timeout:g} s")
        if self.error is not None:
            raise self.error
        self.inner.wait(max(timeout - (time.monotonic() - t0), 0.0))
        self._free()

    def done(self) -> bool:
        if self._posted.is_set() and (self.error is not None or self.inner.done()):
            self._free()
            return True
        return False


class _Poster:
    """One thread that posts staged frames in the order they were sent, each once its copy out
    (a CUDA event; None on a CPU) is done."""

    def __init__(self) -> None:
        self.todo: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._run, name="pipert-link-poster", daemon=True).start()

    def _run(self) -> None:
        while True:
            ready, post, handle = self.todo.get()
            if ready is not None:
                ready.synchronize()
            handle.hand_over(post)


class _Received:
    """A framed receive. With a stream-ordered inner handle (NCCL: ``wait_stream()`` orders the
    current stream only) the wait, the arrival and the copy are queued on ``stream`` (the link's
    own) when posted, after what the current stream holds, and the handle has stream semantics:
    ``wait_stream()`` makes the reader's stream wait for them. Otherwise they run in ``wait``."""

    def __init__(self, inner: Any, frame: torch.Tensor, tensor: torch.Tensor, ops: Any, offset: int,
                 stream: Any = None) -> None:
        self.inner, self.frame, self.tensor, self.ops, self.offset = inner, frame, tensor, ops, offset
        self.event: Any = None
        self.stream_waits = False
        if tensor.is_cuda and stream is not None and stream_waits(inner):
            stream.wait_stream(torch.cuda.current_stream(tensor.device))
            with torch.cuda.stream(stream):
                inner.wait_stream()  # the link's stream waits for the frame; the host does not
                frame.record_stream(stream)
                tensor.record_stream(stream)
                self._read()
                self.event = torch.cuda.Event()
                self.event.record(stream)
            self.stream_waits = True

    def _read(self) -> None:
        n = self.tensor.numel() * self.tensor.element_size()
        self.ops.link_recv(_words(self.frame, n), self.offset)
        _bytes_of(self.tensor).copy_(self.frame[:n], non_blocking=True)
        self.frame = None

    def wait_stream(self) -> None:
        torch.cuda.current_stream(self.tensor.device).wait_event(self.event)

    def wait(self, timeout: float) -> None:
        if self.event is not None:
            self.wait_stream()
            return
        self.inner.wait(timeout)
        if self.frame is not None:
            self._read()

    def done(self) -> bool:
        if self.event is not None:
            return self.event.query()
        return self.frame is None


class FramedLinks:
    """The stream path of one rank's delayed messages (module doc). ``clock_offsets``: per peer,
    this rank's clock minus the peer's in ns (missing: 0, one clock)."""

    def __init__(self, emulator: Any, rank: int, ops: Any, clock_offsets: Mapping[int, int] | None = None) -> None:
        self.emulator, self.rank, self.ops = emulator, rank, ops
        self.clock_offsets = clock_offsets if clock_offsets is not None else {}  # may be filled later
        self._poster: _Poster | None = None
        self._streams: dict[tuple[str, int], Any] = {}

    def link_stream(self, side: str, peer: int, device: torch.device) -> Any:
        """The CUDA stream of this rank's ``side`` ("send" or "recv") of its link with ``peer``
        (high priority, made at first use)."""
        s = self._streams.get((side, peer))
        if s is None:
            s = self._streams[(side, peer)] = torch.cuda.Stream(device, priority=COMM_PRIORITY)
        return s

    def isend(self, inner: Any, tensor: torch.Tensor, peer: int) -> Any:
        if not tensor.is_cuda:
            return self._send(inner, tensor, peer)
        stream = self.link_stream("send", peer, tensor.device)
        stream.wait_stream(torch.cuda.current_stream(tensor.device))  # the message is ready there
        with torch.cuda.stream(stream):
            tensor.record_stream(stream)
            return self._send(inner, tensor, peer)

    def _send(self, inner: Any, tensor: torch.Tensor, peer: int) -> Any:
        data = _bytes_of(tensor)
        n = data.numel()
        frame = torch.empty(frame_size(n), dtype=torch.uint8, device=tensor.device)
        frame[:n].copy_(data)  # the sender may change its tensor while the message travels
        self.ops.link_send(self.rank, peer, n, _words(frame, n))
        self.emulator.count_delivered(self.rank)
        from .staging import StagedTransport
        if isinstance(inner, StagedTransport):
            return self._post_staged(inner, frame, peer)
        return _Sent(inner.isend(frame, peer), frame)

    def _post_staged(self, staged: Any, frame: torch.Tensor, peer: int) -> _Posted:
        buf = staged.pool.acquire(frame.numel())
        host = buf.view(torch.uint8, frame.shape)
        host.copy_(frame, non_blocking=True)  # on the send stream, after the occupancy
        ready = None
        if frame.is_cuda:
            ready = torch.cuda.Event()
            ready.record()
        handle = _Posted(buf)
        if self._poster is None:
            self._poster = _Poster()
        self._poster.todo.put((ready, lambda: staged.inner.isend(host, peer), handle))
        return handle

    def irecv(self, inner: Any, tensor: torch.Tensor, peer: int) -> Any:
        n = tensor.numel() * tensor.element_size()
        _bytes_of(tensor)  # fails fast on a tensor the payload cannot be copied into
        frame = torch.empty(frame_size(n), dtype=torch.uint8, device=tensor.device)
        stream = self.link_stream("recv", peer, tensor.device) if tensor.is_cuda else None
        return _Received(inner.irecv(frame, peer), frame, tensor, self.ops, self.clock_offsets.get(peer, 0), stream)


def clock_offsets(transport: Any, ops: Any, device: torch.device | str, rounds: int = 8,
                  timeout: float = 60.0) -> tuple[dict[int, int], dict[int, int]]:
    """Per peer, this rank's clock minus the peer's (ns), by ping-pong over ``transport`` (every
    rank calls this; pairs in one order). For a < b: a stamps t0, sends; b stamps tb on receipt
    and sends it back; a stamps t1 on receipt. b - a = tb - (t0 + t1) / 2 from the round of the
    shortest t1 - t0 (error at most half of it); a sends that to b. Returns the offsets and, per
    peer, that bound (ns)."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1; got {rounds}")
    me, world = transport.rank, transport.world_size
    out: dict[int, int] = {}
    bound: dict[int, int] = {}
    for a in range(world):
        for b in range(a + 1, world):
            if me not in (a, b):
                continue
            stamps = torch.zeros(rounds, 3, dtype=torch.int64, device=device)
            for k in range(rounds):
                if me == a:
                    ops.stamp(stamps[k, 0:1])
                    transport.isend(stamps[k, 0:1], b).wait(timeout)
                    transport.irecv(stamps[k, 1:2], b).wait(timeout)
                    ops.stamp(stamps[k, 2:3])
                else:
                    transport.irecv(stamps[k, 0:1], a).wait(timeout)
                    ops.stamp(stamps[k, 1:2])
                    transport.isend(stamps[k, 1:2], a).wait(timeout)
            result = torch.zeros(2, dtype=torch.int64, device=device)
            if me == a:
                t0, tb, t1 = min(stamps.tolist(), key=lambda r: r[2] - r[0])
                result.copy_(torch.tensor([tb - (t0 + t1) // 2, (t1 - t0 + 1) // 2 + 1]))
                transport.isend(result, b).wait(timeout)
                out[b], bound[b] = -int(result[0]), int(result[1])
            else:
                transport.irecv(result, a).wait(timeout)
                out[a], bound[a] = int(result[0]), int(result[1])
    return out, bound


def link_clock_offsets(transport: Any, ops: Any, device: torch.device | str, hosts: Iterable[str],
                       clock: str = "auto") -> dict[int, int]:
    """Clock offsets of the stream path: ``clock`` "shared" (one clock: none), "estimate"
    (:func:`clock_offsets`) or "auto" (shared when every rank's ``hosts`` entry, its host name,
    is the same: GPUs of one host share %globaltimer, processes of one host CLOCK_MONOTONIC)."""
    if clock not in ("auto", "shared", "estimate"):
        raise ValueError(f"clock {clock!r} unknown; allowed: auto, shared, estimate")
    if clock == "shared" or (clock == "auto" and len(set(hosts)) == 1):
        return {}
    return clock_offsets(transport, ops, device)[0]


def dist_clock_offsets(transport: Any, ops: Any, device: torch.device, clock: str = "auto") -> dict[int, int]:
    """:func:`link_clock_offsets` of a torch.distributed job (every rank calls it)."""
    import torch.distributed as dist
    hosts: list = [None] * dist.get_world_size()
    dist.all_gather_object(hosts, socket.gethostname())
    return link_clock_offsets(transport, ops, device, hosts, clock)
