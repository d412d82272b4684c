"""Link delay injection: latency and bandwidth per directed pair of ranks.

Deadline math (docs/semantics.md; csrc/core/link_math.h is the same for C++ and CUDA), with
the link model of :class:`pipert.cost.LinkSpec` (latency, bandwidth, per_message): a message
of b bytes ready at t on link s->d departs at ``max(t, free_at)``, keeps the link busy for
``per_message + b / bandwidth`` (``free_at`` moves there: FIFO per directed link, full
duplex) and arrives ``latency`` later, so the next message may depart while the previous
one is still in its latency.

Three ways to apply it:

- :meth:`LinkEmulator.schedule_message` - the math only;
- :meth:`LinkEmulator.deliver` - a timer thread calls ``fn`` at the arrival deadline
  (e.g. a real ``torch.distributed`` send: :meth:`LinkEmulator.dist_isend`);
- :meth:`LinkEmulator.enqueue_transfer` - on a sender's send stream and a receiver's
  recv stream (pipert.device.streams), for the local transport: CPU streams sleep to
  absolute deadlines; CUDA streams run one-thread wait kernels that read and update
  ``free_at`` in device memory (``%globaltimer``), so the host never blocks.

Collectives over these links are held for the simulator's price of their ring
(:attr:`LinkEmulator.collectives`, ``pipert.comm.collectivelinks``).
"""
from __future__ import annotations

import heapq
import itertools
import math
import threading
from concurrent.futures import Future
from typing import Any, Callable, Mapping

import torch

from .. import _ext
from ..cost.topology import LinkSpec
from .collectivelinks import CollectiveLinks
from ..device.streams import (CudaStream, Stream, _precise_timer_slack, _py_sleep_until, clock, ideal_done,
                              ideal_now, sleep_until)

__all__ = ["LinkSpec", "LinkEmulator", "Transfer"]


def _as_spec(x: Any) -> LinkSpec:
    """A pipert.cost.LinkSpec from a LinkSpec, a (latency, bandwidth[, per_message]) tuple or any
    object with those fields."""
    if isinstance(x, LinkSpec):
        return x
    if isinstance(x, (tuple, list)):
        return LinkSpec(*(float(v) for v in x))
    return LinkSpec(float(x.latency), float(x.bandwidth), float(getattr(x, "per_message", 0.0)))


class Transfer:
    """One message of :meth:`LinkEmulator.enqueue_transfer`.

    ``sent`` completes on the send stream when the link occupancy ends, ``arrived`` on
    the recv stream at the arrival deadline (each at its own deadline: ideally sent
    first, really within the streams' overhead). ``depart``/``free_at``/``arrive`` (clock
    seconds) are known once the send stream scheduled the message (None before).
    """

    def __init__(self, sent: Any, arrived: Any, timing: Callable[[], tuple[float, float, float] | None]) -> None:
        self.sent = sent
        self.arrived = arrived
        self._timing = timing

    def _get(self, i: int) -> float | None:
        t = self._timing()
        return None if t is None else t[i]

    depart = property(lambda self: self._get(0))
    free_at = property(lambda self: self._get(1))
    arrive = property(lambda self: self._get(2))


class _PyTimer:
    """Runs callbacks at absolute clock() deadlines, earliest first, ties in submission order."""

    def __init__(self) -> None:
        self._heap: list = []
        self._seq = itertools.count()
        self._cv = threading.Condition()
        self._running = False
        self.error = ""
        threading.Thread(target=self._run, name="pipert-link-timer", daemon=True).start()

    def at(self, deadline: float, fn: Callable[[], Any]) -> None:
        with self._cv:
            heapq.heappush(self._heap, (deadline, next(self._seq), fn))
            self._cv.notify_all()

    def drain(self) -> None:
        with self._cv:
            self._cv.wait_for(lambda: not self._heap and not self._running)

    def _run(self) -> None:
        _precise_timer_slack()
        with self._cv:
            while True:
                if not self._heap:
                    self._cv.wait()
                    continue
                deadline = self._heap[0][0]
                coarse = deadline - 2e-3
                if clock() < coarse:
                    self._cv.wait(coarse - clock())  # wakes early for an earlier item
                    continue
                self._cv.release()
                _py_sleep_until(deadline)
                self._cv.acquire()
                deadline, _, fn = heapq.heappop(self._heap)  # the top may be an earlier, due item
                self._running = True
                self._cv.release()
                try:
                    fn()
                except BaseException as e:  # noqa: BLE001  (kept for the owner to raise)
                    self.error = self.error or f"{type(e).__name__}: {e}"
                fn = None
                self._cv.acquire()
                self._running = False
                self._cv.notify_all()


class _PyLinkCore:
    """Pure-Python twin of pipert._C.LinkEmulator (float seconds instead of int ns)."""

    def __init__(self, n: int, latency: float, bandwidth: float, per_message: float = 0.0) -> None:
        if n <= 0:
            raise ValueError("LinkEmulator needs at least one rank")
        self.num_ranks = n
        self._spec = [(latency, bandwidth, per_message)] * (n * n)
        self._free = [0.0] * (n * n)
        self._lock = threading.Lock()
        self._timer: _PyTimer | None = None

    def _i(self, s: int, d: int) -> int:
        n = self.num_ranks
        if not (0 <= s < n and 0 <= d < n):
            raise IndexError(f"link {s}->{d} outside {n} ranks")
        return s * n + d

    def set_link(self, s: int, d: int, latency: float, bandwidth: float, per_message: float = 0.0) -> None:
        self._spec[self._i(s, d)] = (latency, bandwidth, per_message)

    def link(self, s: int, d: int) -> tuple[float, float, float]:
        return self._spec[self._i(s, d)]

    def free_at(self, s: int, d: int) -> float:
        return self._free[self._i(s, d)]

    def reset(self) -> None:
        with self._lock:
            self._free = [0.0] * len(self._free)

    def schedule(self, s: int, d: int, nbytes: float, ready: float) -> tuple[float, float, float]:
        i = self._i(s, d)
        lat, bw, per_message = self._spec[i]
        occ = per_message + (nbytes / bw if nbytes > 0 else 0.0)
        with self._lock:
            depart = max(ready, self._free[i])
            self._free[i] = depart + occ
        return depart, depart + occ, depart + occ + lat

    def deliver(self, s: int, d: int, nbytes: float, ready: float, fn: Callable[[], Any]) -> tuple:
        t = self.schedule(s, d, nbytes, ready)
        if self._timer is None:
            with self._lock:
                self._timer = self._timer or _PyTimer()
        self._timer.at(t[2], fn)
        return t

    def drain(self) -> None:
        if self._timer is not None:
            self._timer.drain()

    @property
    def timer_error(self) -> str:
        return self._timer.error if self._timer is not None else ""


def _copy_fn(copy: Any) -> Callable[[], None] | None:
    if copy is None or callable(copy):
        return copy
    dst, src = copy

    def run() -> None:
        with torch.no_grad():
            dst.copy_(src)
    return run


class _CudaLinkState:
    """free_at per directed link and a ring of per-message timings, in one device's memory.

    Invariant: a link's free_at is read and written only by kernels on its sender's send
    stream, in stream order. A ring slot is reused RING messages later; its recv-side
    wait kernel must have started by then.
    """

    RING = 4096

    def __init__(self, n: int, device: torch.device) -> None:
        self.free_at = torch.zeros(n * n, dtype=torch.int64, device=device)
        self.timing = torch.zeros(self.RING, 3, dtype=torch.int64, device=device)
        self.next = 0


class LinkEmulator:
    """Latency and bandwidth per directed pair of ranks, applied to messages.

    ``backend``: "ext" (pipert._C) or "python"; default "ext" when the extension loaded.
    """

    def __init__(self, num_ranks: int, default: LinkSpec | tuple = LinkSpec(),
                 links: Mapping[tuple[int, int], LinkSpec | tuple] | None = None,
                 backend: str | None = None) -> None:
        self.backend = backend or ("ext" if _ext.HAVE_EXT else "python")
        d = _as_spec(default)
        if self.backend == "ext":
            if not _ext.HAVE_EXT:
                raise RuntimeError(f"backend 'ext' needs pipert._C: {_ext.load_error}")
            self._core: Any = _ext.C.LinkEmulator(num_ranks, d.latency, d.bandwidth, d.per_message)
        elif self.backend == "python":
            self._core = _PyLinkCore(num_ranks, d.latency, d.bandwidth, d.per_message)
        else:
            raise ValueError(f"backend {self.backend!r} unknown; allowed: ext, python")
        self._cuda: dict[torch.device, _CudaLinkState] = {}
        self._delivered = [0] * num_ranks  # per source rank: messages of deliver()
        self.collectives = CollectiveLinks(self)
        """Collectives across these links, held for their price (pipert.comm.collectivelinks)."""
        for (s, t), spec in (links or {}).items():
            self.set_link(s, t, spec)

    @classmethod
    def from_links(cls, links: Any, backend: str | None = None) -> "LinkEmulator":
        """The links of a :class:`pipert.cost.Links` (topology + spec per link class + per-pair
        overrides): the same numbers the simulator uses."""
        n = links.topology.num_ranks
        em = cls(n, backend=backend)
        for s in range(n):
            for t in range(n):
                em.set_link(s, t, links.spec(s, t))
        return em

    @classmethod
    def from_topology(cls, topology: Any, specs: Mapping[str, LinkSpec | tuple],
                      overrides: Mapping[tuple[int, int], LinkSpec | tuple] | None = None,
                      backend: str | None = None) -> "LinkEmulator":
        """Links from ``topology.link_class(src, dst)`` (a pipert.cost Topology) looked up in
        ``specs`` (class name -> LinkSpec; a class missing there is free, as in
        pipert.cost.Links), then ``overrides`` per directed pair."""
        n = topology.num_ranks
        em = cls(n, backend=backend)
        for s in range(n):
            for t in range(n):
                cls_name = topology.link_class(s, t)
                if cls_name in specs:
                    em.set_link(s, t, specs[cls_name])
        for (s, t), spec in (overrides or {}).items():
            em.set_link(s, t, spec)
        return em

    @classmethod
    def from_link_model(cls, link_model: Any, num_ranks: int, probe_bytes: float = 2.0 ** 20,
                        backend: str | None = None) -> "LinkEmulator":
        """Links from any pipert.cost LinkModel, assuming occupancy affine in bytes:
        per_message = transfer(s, d, 0)[0], latency = transfer(s, d, 0)[1],
        bandwidth = probe_bytes / (transfer(s, d, probe_bytes)[0] - per_message)."""
        em = cls(num_ranks, backend=backend)
        for s in range(num_ranks):
            for t in range(num_ranks):
                occ0, lat = link_model.transfer(s, t, 0.0)
                occ = link_model.transfer(s, t, probe_bytes)[0] - occ0
                em.set_link(s, t, LinkSpec(lat, probe_bytes / occ if occ > 0 else math.inf, occ0))
        return em

    # -- parameters and math

    @property
    def num_ranks(self) -> int:
        return self._core.num_ranks

    def link(self, src: int, dst: int) -> LinkSpec:
        return LinkSpec(*self._core.link(src, dst))

    def set_link(self, src: int, dst: int, spec: LinkSpec | tuple) -> None:
        spec = _as_spec(spec)
        self._core.set_link(src, dst, spec.latency, spec.bandwidth, spec.per_message)

    def occupancy(self, src: int, dst: int, nbytes: float) -> float:
        return self.link(src, dst).occupancy(nbytes)

    def free_at(self, src: int, dst: int) -> float:
        """When the link finishes the occupancy of the last scheduled message (CPU paths)."""
        return self._core.free_at(src, dst)

    def reset(self) -> None:
        """Every link and group free from time 0 (CPU paths and device state)."""
        self._core.reset()
        self.collectives.reset()
        for st in self._cuda.values():
            st.free_at.zero_()

    def schedule_message(self, src: int, dst: int, nbytes: float, ready_time: float) -> tuple[float, float]:
        """(depart, arrive) of a message ready at ``ready_time``; updates the link's free_at."""
        depart, _, arrive = self._core.schedule(src, dst, float(nbytes), float(ready_time))
        return depart, arrive

    # -- timer path

    def deliver(self, src: int, dst: int, nbytes: float, fn: Callable[[], Any],
                ready_time: float | None = None) -> tuple[float, float]:
        """Schedules a message ready at ``ready_time`` (default now) and calls ``fn()`` on the
        timer thread at its arrival deadline. Returns (depart, arrive)."""
        ready = clock() if ready_time is None else float(ready_time)
        depart, _, arrive = self._core.deliver(src, dst, float(nbytes), ready, fn)
        self.count_delivered(src)  # only src's sender thread delivers from src
        return depart, arrive

    def delivered(self, src: int) -> int:
        """Messages scheduled from rank ``src`` so far (by :meth:`deliver` or the stream path of
        DelayedTransport, which calls :meth:`count_delivered`)."""
        return self._delivered[src]

    def count_delivered(self, src: int) -> None:
        """One more message scheduled from ``src`` (called by its sender only)."""
        self._delivered[src] += 1

    def device_state(self, device: torch.device) -> _CudaLinkState:
        """free_at per directed link in ``device``'s memory (zero = free), for the wait kernels
        of the senders on that device; :meth:`reset` clears it."""
        state = self._cuda.get(device)
        if state is None:
            state = self._cuda[device] = _CudaLinkState(self.num_ranks, device)
        return state

    def drain(self) -> None:
        """Host waits until every delivered callback and held collective ran; raises the first
        callback error."""
        self._core.drain()
        self.collectives.drain()
        if self._core.timer_error:
            raise RuntimeError(f"link delivery failed: {self._core.timer_error}")

    def dist_isend(self, tensor: torch.Tensor, dst: int, src: int, group: Any = None,
                   send_fn: Callable[..., Any] | None = None) -> Future:
        """In front of a real torch.distributed send: issues ``send_fn(tensor, dst, group=group)``
        (default ``torch.distributed.isend``) when the emulated message arrives. Returns a
        Future of the send's work handle. The receiver posts an ordinary recv."""
        send = send_fn or torch.distributed.isend
        fut: Future = Future()

        def fire() -> None:
            try:
                fut.set_result(send(tensor, dst, group=group))
            except BaseException as e:  # noqa: BLE001
                fut.set_exception(e)
        self.deliver(src, dst, tensor.numel() * tensor.element_size(), fire)
        return fut

    # -- stream path

    def enqueue_transfer(self, src: int, dst: int, nbytes: float, send: Stream, recv: Stream,
                         copy: Callable[[], Any] | tuple[torch.Tensor, torch.Tensor] | None = None,
                         rendezvous: bool = True) -> Transfer | Any:
        """One message from ``src``'s send stream to ``dst``'s recv stream (local transport).

        With ``rendezvous`` the message is ready once the send stream reached it and the
        recv stream posted it (reached it). The send stream then waits for the departure,
        runs ``copy`` (a callable or a ``(dst_tensor, src_tensor)`` pair) and stays busy until
        the occupancy ends; the recv stream waits for the copy, then for the arrival.
        Never blocks the host. Returns a :class:`Transfer` (with pipert._C streams, a
        ``pipert._C.Transfer`` with the same attributes).
        """
        if isinstance(send, CudaStream):
            return self._cuda_transfer(src, dst, nbytes, send, recv, copy, rendezvous)
        if self.backend == "ext" and isinstance(send, _ext.C.Stream) and isinstance(recv, _ext.C.Stream):
            # pipert._C.Transfer: the same attributes as Transfer, without a Python wrapper
            return self._core.enqueue_transfer(send, recv, src, dst, float(nbytes), copy, rendezvous)
        return self._stream_transfer(src, dst, nbytes, send, recv, _copy_fn(copy), rendezvous)

    def _stream_transfer(self, src: int, dst: int, nbytes: float, send: Any, recv: Any,
                         copy: Callable[[], Any] | None, rendezvous: bool) -> Transfer:
        self._core.link(src, dst)  # validates the pair before anything is enqueued
        timing: list = []
        sleep = _py_sleep_until if self.backend == "python" else sleep_until
        if rendezvous:
            send.wait(recv.record())

        def go() -> None:
            # ready at the send stream's ideal time: earlier items' overhead does not delay it
            t = self._core.schedule(src, dst, float(nbytes), ideal_now())
            timing.append(t)
            sleep(t[0])
            if copy is not None:
                copy()
            ideal_done(t[0])

        def until(i: int) -> Callable[[], None]:
            def run() -> None:
                end = max(ideal_now(), timing[0][i])
                sleep(end)
                ideal_done(end)
            return run
        send.enqueue(go)
        copied = send.record()  # the receiver waits for the data, due at depart (see link_emulator.cpp)
        send.enqueue(until(1))
        sent = send.record()
        recv.wait(copied)
        recv.enqueue(until(2))
        arrived = recv.record()
        return Transfer(sent, arrived, lambda: timing[0] if timing else None)

    def _cuda_transfer(self, src: int, dst: int, nbytes: float, send: CudaStream, recv: CudaStream,
                       copy: Any, rendezvous: bool) -> Transfer:
        spec = self.link(src, dst)
        lat = spec.latency
        occ_ns = round(spec.occupancy(max(float(nbytes), 0.0)) * 1e9)
        if rendezvous:
            send.wait(recv.record())
        clock_map = send._clock
        if _ext.HAVE_EXT_CUDA:
            state = self.device_state(send.device)
            slot = state.next % state.RING
            state.next += 1
            row = state.timing[slot]
            send.link_send(state.free_at.data_ptr() + 8 * (src * self.num_ranks + dst), occ_ns, round(lat * 1e9),
                           row.data_ptr())
        else:  # relative delays: exact FIFO when one send stream owns the link, no device clock
            send.enqueue_delay(occ_ns * 1e-9)
        if copy is not None:  # on the GPU the data moves at the end of the occupancy, still before arrive
            if callable(copy):
                send.enqueue(copy)
            else:
                send.enqueue_copy(*copy)
        sent = send.record()
        recv.wait(sent)
        if _ext.HAVE_EXT_CUDA and recv.device == send.device:
            recv.wait_until_ptr(row.data_ptr() + 16)
        else:  # relative: exact while the recv stream is not behind the send side
            recv.enqueue_delay(lat)
        arrived = recv.record()

        def timing() -> tuple[float, float, float] | None:
            if not _ext.HAVE_EXT_CUDA or clock_map is None or not sent.query():
                return None
            vals = row.tolist()  # a small device-to-host read
            return tuple((v - clock_map.offset_ns) * 1e-9 for v in vals)  # type: ignore[return-value]
        return Transfer(sent, arrived, timing)

