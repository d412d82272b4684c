"""Per-device stream scheduler: a compute stream, a send and a recv stream, events.

One API, three backends, chosen per device:

- ``"ext"``    CPU, pipert._C: one C++ worker thread per stream.
- ``"python"`` CPU, pure Python: one thread per stream, events are futures
  (the fallback when pipert._C is missing; same semantics).
- ``"cuda"``   torch.cuda streams (send/recv at high priority) and CUDA events;
  delays are the wait kernels of pipert._C (``torch.cuda._sleep`` without it).

Semantics (all backends)
- A stream runs what is enqueued on it in FIFO order, one item at a time.
- ``stream.record(event)`` makes the event complete when the stream reaches that
  point; re-recording replaces it. ``stream.wait(event)`` makes the stream (not the
  host) wait for the record current at the call; a never-recorded event is complete.
- The host blocks only in ``synchronize()`` (of a stream, event or StreamSet).
- Errors are sticky per stream: after a callable raises, later items are skipped,
  events still complete and ``synchronize()`` raises RuntimeError; a stream that
  waits on an event of a failed stream fails too.
- CPU times and deadlines are seconds of :func:`clock` (``time.perf_counter``).
- CPU streams keep an ideal clock (see csrc/core/stream.h): an item starts, ideally, at
  max(previous item's ideal end, its enqueue time); delays, spins and link transfers count
  from it, so thread wake-ups and hand-offs between timed items do not accumulate. Event
  times are real; a delay may so end up to that overhead (microseconds) less than its
  length after the event recorded just before it, but never before enqueue time + length.
  :func:`ideal_now` / :func:`ideal_done` let a callable on a stream take part.
- On CUDA, ``enqueue(fn)`` calls ``fn`` now, on the host, with the stream current:
  the kernels it launches are what the stream runs in order. The timed kernels of pipert._C
  (delays, link sends) keep the same ideal clock where they follow each other on a stream
  (a chain, csrc/core/delay_kernels.h): a timed item right after another starts, ideally, at
  max(its ideal end, the item's enqueue time), so back-to-back link messages do not add one
  kernel launch each; after any other item it starts when the device reaches it.
"""
from __future__ import annotations

import atexit
import os
import queue
import threading
import time
import weakref
from concurrent.futures import Future
from typing import Any, Callable, Iterable, Protocol, Sequence

import torch

from .. import _ext

__all__ = ["Stream", "Event", "StreamSet", "Device", "PyStream", "PyEvent", "CudaStream", "CudaEvent", "Chain",
           "clock", "sleep_until", "ideal_now", "ideal_done", "default_backend", "BACKENDS", "SPIN_SECONDS"]

BACKENDS = ("ext", "python", "cuda")
SPIN_SECONDS = 100e-6  # python backend: OS sleep until this long before a deadline, then spin
COMM_PRIORITY = -1     # send/recv streams (lower = higher priority, as in CUDA)


def clock() -> float:
    """Seconds of the monotonic clock in which every CPU deadline is expressed."""
    return time.perf_counter()


def sleep_until(deadline: float) -> None:
    """Returns at or after ``deadline`` (:func:`clock` seconds): OS sleep, then a short spin."""
    if _ext.HAVE_EXT:
        _ext.C.sleep_until(deadline)  # releases the GIL for the whole wait
    else:
        _py_sleep_until(deadline)


def _py_sleep_until(deadline: float) -> None:
    """sleep_until in pure Python (the python backend uses it even when pipert._C is loaded)."""
    left = deadline - time.perf_counter()
    if left > SPIN_SECONDS:
        time.sleep(left - SPIN_SECONDS)
    while time.perf_counter() < deadline:
        _yield()  # lets other threads take the GIL


_yield = getattr(os, "sched_yield", lambda: time.sleep(0))


def _precise_timer_slack() -> None:
    """Linux: OS sleeps of the calling thread wake within ~microseconds of their target (timer
    slack 1 ns instead of 50 us), as csrc/core/clock.cpp does for C++ threads. Best effort."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(29, 1, 0, 0, 0)  # PR_SET_TIMERSLACK
    except (OSError, AttributeError):
        pass


_tls = threading.local()  # PyStream workers: .start (ideal start of the item), .end (ideal end or None)


def ideal_now() -> float:
    """Ideal start of the item running on the calling CPU stream worker; clock() elsewhere."""
    start = getattr(_tls, "start", None)
    if start is not None:
        return start
    return _ext.C.stream_ideal_now() if _ext.HAVE_EXT else clock()


def ideal_done(t: float) -> None:
    """Called by a timed item on a CPU stream worker: its ideal end is ``t``."""
    if getattr(_tls, "start", None) is not None:
        _tls.end = t
    elif _ext.HAVE_EXT:
        _ext.C.stream_ideal_done(t)


def _timed_until(t: float) -> None:
    _py_sleep_until(t)
    ideal_done(t)


class Event(Protocol):
    def record(self, stream: "Stream") -> None: ...
    def query(self) -> bool: ...
    def synchronize(self) -> None: ...
    @property
    def time(self) -> float | None: ...
    @property
    def ideal_time(self) -> float | None: ...
    def elapsed_time(self, end: "Event") -> float: ...


class Stream(Protocol):
    name: str
    priority: int

    def enqueue(self, fn: Callable[[], Any]) -> None: ...
    def enqueue_delay(self, seconds: float) -> None: ...
    def enqueue_delay_until(self, deadline: float) -> None: ...
    def enqueue_spin(self, seconds: float) -> None: ...
    def enqueue_copy(self, dst: torch.Tensor, src: torch.Tensor) -> None: ...
    def record(self, event: Event | None = None) -> Event: ...
    def wait(self, event: Event) -> None: ...
    def synchronize(self) -> None: ...
    def query(self) -> bool: ...
    def close(self) -> None: ...


# ----------------------------------------------------------------------------- pure Python CPU

class _Upstream(Exception):
    """Raised by a wait whose event carries an error; its message is that error, unchanged."""


class PyEvent:
    """Completion of the most recent record: a Future of (time, error, ideal time)."""

    __slots__ = ("_fut", "__weakref__")

    def __init__(self) -> None:
        self._fut: Future | None = None

    def record(self, stream: "PyStream") -> None:
        stream.record(self)

    def query(self) -> bool:
        f = self._fut
        return f is None or f.done()

    def synchronize(self) -> None:
        f = self._fut
        if f is None:
            return
        err = f.result()[1]
        if err:
            raise RuntimeError(err)

    @property
    def time(self) -> float | None:
        """Completion time (clock seconds) of the current record; None if pending or never recorded."""
        f = self._fut
        return f.result()[0] if f is not None and f.done() else None

    @property
    def ideal_time(self) -> float | None:
        """Ideal completion time (clock seconds, <= ``time``) of the current record: what the
        stream's ideal clock says, free of thread wake-up overhead; None if pending."""
        f = self._fut
        return f.result()[2] if f is not None and f.done() else None

    def elapsed_time(self, end: "PyEvent") -> float:
        """Seconds from this event's completion to ``end``'s."""
        if self.time is None or end.time is None:
            raise RuntimeError("elapsed_time needs two completed, recorded events")
        return end.time - self.time


class PyStream:
    """A worker thread running callables in FIFO order."""

    def __init__(self, name: str = "stream", priority: int = 0) -> None:
        self.name = name
        self.priority = priority
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._error = ""  # sticky; written only by the worker
        self._ideal = 0.0  # worker only: ideal end of the last item
        self._lock = threading.Lock()
        self._enqueued = 0
        self._finished = 0
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"pipert-{name}", daemon=True)
        self._thread.start()

    @property
    def error(self) -> str:
        return self._error

    def _push(self, fn: Callable[[], Any] | None, fut: Future | None = None) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError(f"stream '{self.name}' is closed")
            self._enqueued += 1
        self._q.put((fn, fut, clock()))

    def enqueue(self, fn: Callable[[], Any]) -> None:
        if not callable(fn):
            raise TypeError("expected a callable")
        self._push(fn)

    def enqueue_delay(self, seconds: float) -> None:
        self._push(lambda: _timed_until(ideal_now() + seconds))

    def enqueue_delay_until(self, deadline: float) -> None:
        self._push(lambda: _timed_until(max(ideal_now(), deadline)))

    def enqueue_spin(self, seconds: float) -> None:
        def spin() -> None:
            end = ideal_now() + seconds
            while clock() < end:
                pass
            ideal_done(end)
        self._push(spin)

    def enqueue_copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        def copy() -> None:
            with torch.no_grad():
                dst.copy_(src)
        self._push(copy)

    def record(self, event: PyEvent | None = None) -> PyEvent:
        event = PyEvent() if event is None else event
        fut: Future = Future()
        event._fut = fut
        self._push(None, fut)
        return event

    def wait(self, event: PyEvent) -> None:
        fut = event._fut  # the record current now
        if fut is None:
            return

        def wait() -> None:
            _, err, ideal = fut.result()
            if err:
                raise _Upstream(err)
            ideal_done(max(ideal_now(), ideal))
        self._push(wait)

    def synchronize(self) -> None:
        self.record().synchronize()

    def query(self) -> bool:
        with self._lock:
            return self._finished == self._enqueued

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._q.put(None)
        if threading.current_thread() is not self._thread:
            self._thread.join()

    def _run(self) -> None:
        _precise_timer_slack()
        if self.priority < 0 and hasattr(os, "setpriority"):  # as csrc/core/clock.cpp; best effort
            try:
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), max(-20, 5 * self.priority))
            except OSError:
                pass
        while True:
            item = self._q.get()
            if item is None:
                return
            fn, fut, stamp = item
            t_pop = clock()  # when the stream reached the item
            start = max(self._ideal, stamp)  # ideal start (<= t_pop)
            if fut is not None:
                self._ideal = start
                with self._lock:  # before waking waiters: query() holds after synchronize()
                    self._finished += 1
                fut.set_result((t_pop, self._error, start))
                item = fn = fut = None
                continue
            elif self._error:
                self._ideal = t_pop  # skipped
            else:
                _tls.start, _tls.end = start, None
                try:
                    fn()
                except _Upstream as e:
                    self._error = f"stream '{self.name}': {e}"
                except BaseException as e:  # noqa: BLE001  (becomes the stream's sticky error)
                    self._error = f"stream '{self.name}': {type(e).__name__}: {e}"
                self._ideal = _tls.end if _tls.end is not None else clock()
                _tls.start = _tls.end = None
            item = fn = fut = None
            with self._lock:
                self._finished += 1


class _PyEventPool:
    def __init__(self) -> None:
        self._free: list[PyEvent] = []
        self.created = 0

    def acquire(self) -> PyEvent:
        if self._free:
            e = self._free.pop()
            e._fut = None  # a reused event starts as never recorded
            return e
        self.created += 1
        return PyEvent()

    def release(self, event: PyEvent) -> None:
        self._free.append(event)

    @property
    def free_count(self) -> int:
        return len(self._free)


# ----------------------------------------------------------------------------- CUDA

class CudaEvent:
    """A torch.cuda.Event with the pipert Event API (times via elapsed_time only)."""

    __slots__ = ("_e", "__weakref__")

    def __init__(self) -> None:
        self._e = torch.cuda.Event(enable_timing=True)

    def record(self, stream: "CudaStream") -> None:
        stream.record(self)

    def query(self) -> bool:
        return self._e.query()

    def synchronize(self) -> None:
        self._e.synchronize()

    @property
    def time(self) -> float | None:
        return None  # device events have no host-clock time; use elapsed_time

    @property
    def ideal_time(self) -> float | None:
        return None  # no ideal clock on a device stream

    def elapsed_time(self, end: "CudaEvent") -> float:
        return self._e.elapsed_time(end._e) * 1e-3


class _DeviceClock:
    """Maps clock() seconds to %globaltimer ns of one device (needs pipert._C with CUDA)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        out = torch.zeros(1, dtype=torch.int64, device=device)
        stream = torch.cuda.current_stream(device)
        best = None
        for _ in range(7):  # keep the tightest host bracket around the device read
            torch.cuda.synchronize(device)
            t0 = clock()
            _ext.C.cuda_globaltimer(stream.cuda_stream, out.data_ptr())
            torch.cuda.synchronize(device)
            t1 = clock()
            offset = int(out.item()) - round((t0 + t1) * 0.5e9)
            if best is None or t1 - t0 < best[0]:
                best = (t1 - t0, offset)
        self.offset_ns = best[1]
        self.uncertainty = best[0] / 2

    def to_device_ns(self, t: float) -> int:
        return round(t * 1e9) + self.offset_ns


_cycles_per_second: dict[int, float] = {}


def _sleep_cycles(device: torch.device, seconds: float) -> int:
    """Cycles for torch.cuda._sleep (fallback without pipert._C CUDA), calibrated once per device."""
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _cycles_per_second:
        with torch.cuda.device(idx):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(1_000_000)
            a.record()
            torch.cuda._sleep(10_000_000)
            b.record()
            b.synchronize()
            _cycles_per_second[idx] = 10_000_000 / (a.elapsed_time(b) * 1e-3)
    return max(0, int(seconds * _cycles_per_second[idx]))


class Chain:
    """Host side of a stream's chain of timed kernels (module doc; csrc/core/delay_kernels.h):
    the device word each timed kernel sets to its ideal end, and whether the item enqueued last
    on the stream was such a kernel. Invariant: ``linked`` only while nothing else was enqueued
    on the stream since the last timed kernel."""

    enabled = True
    """False: every timed kernel starts at the device's now (no chains; benchmarks compare)."""

    def __init__(self, alloc: Callable[[], torch.Tensor]) -> None:
        self._alloc = alloc
        self._word: torch.Tensor | None = None
        self.linked = False

    def timed(self, enqueued_ns: int) -> tuple[int, int]:
        """(address of the word, enqueue time or -1 to start at the device's now) for the timed
        kernel about to be enqueued (``enqueued_ns``: now in the device's clock, -1 if unknown)."""
        if self._word is None:
            self._word = self._alloc()
        args = (self._word.data_ptr(), enqueued_ns if self.linked else -1)
        self.linked = enqueued_ns >= 0 and Chain.enabled
        return args

    def untimed(self) -> None:
        """Anything else was enqueued: the next timed kernel starts when the device reaches it."""
        self.linked = False


class CudaStream:
    """A torch.cuda.Stream with the pipert Stream API."""

    def __init__(self, device: torch.device, name: str = "stream", priority: int = 0,
                 clock_map: _DeviceClock | None = None) -> None:
        self.name = name
        self.priority = priority
        self.device = device
        self.stream = torch.cuda.Stream(device=device, priority=priority)
        self._clock = clock_map
        # no fill: the chain's first kernel writes the word before any kernel reads it
        self.chain = Chain(lambda: torch.empty(1, dtype=torch.int64, device=device))

    @property
    def handle(self) -> int:
        return self.stream.cuda_stream

    def _timed(self) -> tuple[int, int]:
        return self.chain.timed(self._clock.to_device_ns(clock()) if self._clock is not None else -1)

    def enqueue(self, fn: Callable[[], Any]) -> None:
        self.chain.untimed()
        with torch.cuda.device(self.device), torch.cuda.stream(self.stream):
            fn()
        self.chain.untimed()  # whatever fn launched

    def link_send(self, free_at: int, occupancy_ns: int, latency_ns: int, timing: int) -> None:
        """pipert._C's link send kernel (addresses in device memory), in this stream's chain."""
        with torch.cuda.device(self.device):
            _ext.C.cuda_link_send(self.handle, free_at, occupancy_ns, latency_ns, timing, *self._timed())

    def wait_until_ptr(self, deadline: int) -> None:
        """Sleeps the stream until the device word at ``deadline`` (ns), read when it gets there."""
        self.chain.untimed()
        with torch.cuda.device(self.device):
            _ext.C.cuda_wait_until_ptr(self.handle, deadline)

    def enqueue_delay(self, seconds: float) -> None:
        with torch.cuda.device(self.device):
            if _ext.HAVE_EXT_CUDA:
                _ext.C.cuda_sleep_for(self.handle, round(seconds * 1e9), *self._timed())
            else:
                self.chain.untimed()
                with torch.cuda.stream(self.stream):
                    torch.cuda._sleep(_sleep_cycles(self.device, seconds))

    def enqueue_delay_until(self, deadline: float) -> None:
        if self._clock is None:  # no device clock: relative to now (approximate)
            self.enqueue_delay(max(0.0, deadline - clock()))
            return
        self.chain.untimed()
        with torch.cuda.device(self.device):
            _ext.C.cuda_wait_until(self.handle, self._clock.to_device_ns(deadline))

    def enqueue_spin(self, seconds: float, blocks: int = 1) -> None:
        self.chain.untimed()
        with torch.cuda.device(self.device):
            if _ext.HAVE_EXT_CUDA:
                _ext.C.cuda_spin(self.handle, round(seconds * 1e9), blocks)
            else:
                with torch.cuda.stream(self.stream):
                    torch.cuda._sleep(_sleep_cycles(self.device, seconds))

    def enqueue_copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        self.chain.untimed()
        with torch.cuda.device(self.device), torch.cuda.stream(self.stream), torch.no_grad():
            dst.copy_(src, non_blocking=True)
            for t in (dst, src):
                if t.is_cuda:
                    t.record_stream(self.stream)

    def record(self, event: CudaEvent | None = None) -> CudaEvent:
        event = CudaEvent() if event is None else event
        event._e.record(self.stream)
        return event

    def wait(self, event: CudaEvent) -> None:
        self.chain.untimed()  # the wait ends when the event does, which no kernel here reads
        self.stream.wait_event(event._e)

    def synchronize(self) -> None:
        self.stream.synchronize()

    def query(self) -> bool:
        return self.stream.query()

    def close(self) -> None:
        pass


class _CudaEventPool(_PyEventPool):
    def acquire(self) -> CudaEvent:  # type: ignore[override]
        if self._free:
            return self._free.pop()  # CUDA events need no reset: the next record replaces
        self.created += 1
        return CudaEvent()


# ----------------------------------------------------------------------------- per device

def default_backend(device: torch.device | str = "cpu") -> str:
    """``cuda`` for CUDA devices, else ``ext`` when pipert._C loaded, else ``python``."""
    device = torch.device(device)
    if device.type == "cuda":
        return "cuda"
    return "ext" if _ext.HAVE_EXT else "python"


_live: "weakref.WeakSet[StreamSet]" = weakref.WeakSet()


class StreamSet:
    """One device's streams: ``compute`` (priority 0), ``send`` and ``recv`` (high priority).

    ``device`` is a real device ("cpu", "cuda:1") or, for the emulator, any CPU
    stand-in (one StreamSet per virtual device). ``backend`` overrides the default.
    """

    def __init__(self, device: torch.device | str = "cpu", name: str = "", backend: str | None = None) -> None:
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.backend = backend or default_backend(self.device)
        if self.backend not in BACKENDS:
            raise ValueError(f"backend {self.backend!r} unknown; allowed: {', '.join(BACKENDS)}")
        if (self.backend == "cuda") != (self.device.type == "cuda"):
            raise ValueError(f"backend {self.backend!r} does not fit device {self.device}")
        if self.backend == "ext" and not _ext.HAVE_EXT:
            raise RuntimeError(f"backend 'ext' needs pipert._C: {_ext.load_error}")
        self.name = name or str(self.device)
        self.clock_map: _DeviceClock | None = None
        if self.backend == "cuda":
            if _ext.HAVE_EXT_CUDA:
                self.clock_map = _DeviceClock(self.device)
            make = lambda n, p: CudaStream(self.device, n, p, self.clock_map)  # noqa: E731
            self._pool: Any = _CudaEventPool()
        elif self.backend == "ext":
            make = _ext.C.Stream
            self._pool = _ext.C.EventPool()
        else:
            make = PyStream
            self._pool = _PyEventPool()
        self.compute: Stream = make(f"{self.name}/compute", 0)
        self.send: Stream = make(f"{self.name}/send", COMM_PRIORITY)
        self.recv: Stream = make(f"{self.name}/recv", COMM_PRIORITY)
        self._closed = False
        _live.add(self)

    @property
    def streams(self) -> tuple[Stream, Stream, Stream]:
        return (self.compute, self.send, self.recv)

    def event(self) -> Event:
        """An event from this device's pool (never recorded)."""
        return self._pool.acquire()

    def release(self, event: Event) -> None:
        """Returns an event to the pool; the caller must not use it afterwards."""
        self._pool.release(event)

    def issue(self, ops: Iterable[Sequence[Any]]) -> None:
        """Enqueues ops in order, with one call per list: each op is one of
        ``("run", stream, fn)``, ``("record", stream, event)``, ``("wait", stream, event)``,
        ``("delay", stream, seconds)``, ``("delay_until", stream, deadline)``,
        ``("spin", stream, seconds)``, ``("copy", stream, dst, src)``.
        """
        if self.backend == "ext":
            _ext.C.issue(ops if isinstance(ops, (list, tuple)) else list(ops))
            return
        for op in ops:
            kind, stream = op[0], op[1]
            if kind == "run":
                stream.enqueue(op[2])
            elif kind == "record":
                stream.record(op[2])
            elif kind == "wait":
                stream.wait(op[2])
            elif kind == "delay":
                stream.enqueue_delay(op[2])
            elif kind == "delay_until":
                stream.enqueue_delay_until(op[2])
            elif kind == "spin":
                stream.enqueue_spin(op[2])
            elif kind == "copy":
                stream.enqueue_copy(op[2], op[3])
            else:
                raise ValueError(f"unknown op kind '{kind}'")

    def synchronize(self) -> None:
        """Host waits for all three streams; raises the first stream error."""
        errors = []
        for s in self.streams:
            try:
                s.synchronize()
            except RuntimeError as e:
                errors.append(str(e))
        if errors:
            raise RuntimeError("; ".join(errors))

    def close(self) -> None:
        """Lets every stream finish what is enqueued, then stops its worker."""
        if self._closed:
            return
        self._closed = True
        for s in self.streams:
            s.close()

    def __enter__(self) -> "StreamSet":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"StreamSet({self.name!r}, backend={self.backend!r})"


Device = StreamSet


@atexit.register
def _close_all() -> None:
    # C++ workers may need the GIL to run Python callables: stop them before shutdown.
    for ss in list(_live):
        ss.close()
