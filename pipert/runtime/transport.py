"""Transports: how one rank's tensors reach another.

Both transports give the same non-blocking interface: ``isend``/``irecv``/``collective``
return a handle whose ``wait(timeout)`` completes the operation or raises ``CommTimeout``.
Point-to-point messages on one directed link are matched in posting order (FIFO), which is
the rule the validator enforces, so gloo, NCCL and the local transport agree.

Stream semantics: a handle whose ``stream_waits`` is True also has ``wait_stream()``, which
orders the operation before whatever the calling thread issues next on its current CUDA
stream and returns without waiting on the host (NCCL's ``Work.wait()`` without a timeout).
A hang is then caught by the process group's timeout (NCCL's watchdog), not by the caller.
The executor completes such handles with ``wait_stream()`` (:func:`stream_waits`) and every
other handle with ``wait(timeout)``, which on a CPU is the wait of the worker thread that
plays the stream. ``DistTransport`` gives stream semantics to NCCL operations on CUDA tensors.

- ``DistTransport``: torch.distributed (gloo on CPU, NCCL on GPUs). Messages to a higher
  rank and to a lower rank travel in two separate process groups, so the two directions
  never serialise behind each other (NCCL runs each communicator on its own stream).
- ``LocalTransport``: every rank in one process (threads), for tests and emulation. On a GPU
  its messages and collectives are ordered between the ranks' streams by CUDA events
  (``pipert.runtime.streamorder``): a receiver's stream waits for the sender's copy, every
  member of a collective for the others' inputs and for the reduction.
"""
from __future__ import annotations

import datetime
import functools
import threading
import time
from typing import Any, Protocol, Sequence

import torch
import torch.distributed as dist

from .streamorder import CudaOrder, Order

__all__ = ["CommTimeout", "PeerFailure", "Handle", "Transport", "DistTransport", "LocalHub", "LocalTransport",
           "DelayedTransport", "COLLECTIVES", "stream_waits", "comm_group"]


class CommTimeout(RuntimeError):
    """A communication wait did not complete in time."""


class PeerFailure(RuntimeError):
    """A communication failed because a peer went away."""


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


class _Done:
    stream_waits = False

    def wait(self, timeout: float) -> None:
        return None

    def done(self) -> bool:
        return True


class _Then:
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
class _DistHandle:
    def __init__(self, work: dist.Work, stream: bool = False) -> None:
        self.work = work
        self.stream_waits = stream

    def wait(self, timeout: float) -> None:
        try:
            self.work.wait(datetime.timedelta(seconds=timeout))
        except RuntimeError as e:
            text = str(e)
            if "Timed out" in text or "timed out" in text or "Timeout" in text:
                raise CommTimeout(text) from None
            raise PeerFailure(text) from None

    def wait_stream(self) -> None:
        """NCCL: the current stream waits for the operation; the host does not (no timeout
        argument: with one, torch polls on the host until the operation is done)."""
        try:
            self.work.wait()
        except RuntimeError as e:
            raise PeerFailure(str(e)) from None

    def done(self) -> bool:
        return self.work.is_completed()


def _posted(post, stream: bool = False) -> _DistHandle:
    """Post a torch.distributed operation; a broken connection surfaces as PeerFailure.
    ``stream``: the handle has stream semantics (module doc)."""
    try:
        return _DistHandle(post(), stream)
    except RuntimeError as e:
        raise PeerFailure(str(e)) from None


def _nccl_options() -> Any:
    """Options of NCCL process groups whose communicators run on high-priority streams (None
    where torch has no ProcessGroupNCCL)."""
    pg = getattr(dist, "ProcessGroupNCCL", None)
    if pg is None or not hasattr(pg, "Options"):
        return None
    opts = pg.Options()
    opts.is_high_priority_stream = True
    return opts


def comm_group(ranks: Sequence[int]) -> Any:
    """``dist.new_group(ranks)``; on NCCL its communicators run on high-priority streams, as
    pipert's own send and receive streams do (every rank makes the same groups in one order)."""
    options = _nccl_options() if dist.get_backend() == "nccl" else None
    if options is None:
        return dist.new_group(list(ranks))
    return dist.new_group(list(ranks), pg_options=options)


class DistTransport:
    """Point-to-point and collectives over an initialised default process group."""

    def __init__(self, groups: Sequence[Sequence[int]] = (), emulate_reduce_scatter: bool | None = None,
                 process_groups: dict[tuple[int, ...], Any] | None = None) -> None:
        """``groups``: the rank sets collectives run over (every rank must pass the same list);
        ``process_groups``: ones already made for some of them (e.g. a DeviceMesh's "dp" groups),
        used as they are."""
        if not dist.is_initialized():
            raise RuntimeError("DistTransport needs torch.distributed initialised (torchrun or pipert's launcher)")
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        # reduce-scatter as all-reduce plus this rank's slice where torch has no native one
        native = hasattr(dist, "reduce_scatter_single") or hasattr(dist, "reduce_scatter_tensor")
        self.emulate_reduce_scatter = (not native) if emulate_reduce_scatter is None else emulate_reduce_scatter
        # Every rank must create the same groups in the same order.
        self.up = comm_group(range(self.world_size))
        self.down = comm_group(range(self.world_size))
        # every rank makes the same groups in the same order; those given are made already
        self.groups: dict[tuple[int, ...], Any] = {k: v for k, v in (process_groups or {}).items() if v is not None}
        made = set(process_groups or {})
        for g in groups:
            key = tuple(sorted(g))
            if key not in made:
                made.add(key)
                self.groups[key] = comm_group(key)
        self.connected: set = set()

    def _pg(self, src: int, dst: int) -> dist.ProcessGroup:
        return self.up if src < dst else self.down

    @functools.cached_property
    def _nccl(self) -> bool:
        """Whether CUDA tensors travel over NCCL, whose ``Work.wait()`` is stream-ordered."""
        return "nccl" in str(dist.get_backend()).lower()

    def _on_stream(self, tensor: torch.Tensor) -> bool:
        """Whether the operation on ``tensor`` has stream semantics (module doc)."""
        return tensor.is_cuda and self._nccl

    def isend(self, tensor: torch.Tensor, peer: int, tag: int = 0) -> Handle:
        return _posted(lambda: dist.isend(tensor, peer, group=self._pg(self.rank, peer), tag=tag),
                       self._on_stream(tensor))

    def irecv(self, tensor: torch.Tensor, peer: int, tag: int = 0) -> Handle:
        return _posted(lambda: dist.irecv(tensor, peer, group=self._pg(peer, self.rank), tag=tag),
                       self._on_stream(tensor))

    @property
    def lazy(self) -> bool:
        """Whether communicators are created at first use (NCCL; pipert.comm.nccl): then
        :meth:`connect` creates one, and ``Pipeline`` warms them all up in one global order."""
        return self._nccl

    def is_connected(self, comm: Any) -> bool:
        return not self.lazy or comm in self.connected

    def connect(self, comm: Any, where: str = "", timeout: float | None = None) -> None:
        """Create NCCL's communicator ``comm`` (a ``pipert.comm.nccl.Comm`` this rank belongs to)
        by a one-element exchange on it, blocking until its members took part; nothing to create
        on gloo. ``where`` and ``timeout`` are the process group's (NCCL's own init timeout)."""
        if self.is_connected(comm):
            return
        device = torch.device("cuda", torch.cuda.current_device())
        one = torch.zeros(1, device=device)
        if comm.kind == "group":
            dist.all_reduce(one, group=self.groups[comm.ranks])
        else:
            low, high = comm.ranks
            src, dst = (low, high) if comm.kind == "up" else (high, low)
            if self.rank == src:
                dist.send(one, dst, group=self._pg(src, dst))
            else:
                dist.recv(one, src, group=self._pg(src, dst))
        torch.cuda.current_stream(device).synchronize()
        self.connected.add(comm)

    def collective(self, op: str, tensor: torch.Tensor, group: Sequence[int], root: int | None,
                   out: torch.Tensor | None = None) -> Handle:
        key = tuple(sorted(group))
        if len(key) == 1:
            if out is not None:
                out.copy_(tensor)
            return _Done()
        pg = self.groups.get(key)
        if pg is None:
            raise RuntimeError(f"group {key} was not created up front; pass it to DistTransport(groups=...)")
        st = self._on_stream(tensor)
        if op == "BROADCAST":
            return _posted(lambda: dist.broadcast(tensor, root, group=pg, async_op=True), st)
        if op == "REDUCE":
            return _posted(lambda: dist.reduce(tensor, root, op=dist.ReduceOp.SUM, group=pg, async_op=True), st)
        if op == "ALLREDUCE":
            return _posted(lambda: dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=pg, async_op=True), st)
        if op == "ALLGATHER":
            gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
            return _posted(lambda: gather(out, tensor, group=pg, async_op=True), st)
        if op == "REDUCESCATTER":
            if self.emulate_reduce_scatter:
                return self._reduce_scatter_by_all_reduce(tensor, out, key, pg)
            scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
            return _posted(lambda: scatter(out, tensor, op=dist.ReduceOp.SUM, group=pg, async_op=True), st)
        raise ValueError(f"collective {op} unknown; allowed: {', '.join(COLLECTIVES)}")

    def _reduce_scatter_by_all_reduce(self, tensor: torch.Tensor, out: torch.Tensor, key: tuple[int, ...],
                                      pg: Any) -> Handle:
        """Reduce-scatter for backends without it: all-reduce a copy, keep this rank's share."""
        total = tensor.clone()
        k, n = key.index(self.rank), out.numel()
        work = _posted(lambda: dist.all_reduce(total, op=dist.ReduceOp.SUM, group=pg, async_op=True),
                       self._on_stream(tensor))
        return _Then(work, lambda: out.copy_(total[k * n:(k + 1) * n]))


# --------------------------------------------------------------------------- one process
class _Future:
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


class _Link:
    """One directed link of a LocalHub: message k is matched by the k-th receive posted. A
    message is (the sender's copy, the event after that copy on the sender's stream)."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.messages: dict[int, tuple[torch.Tensor, Any]] = {}
        self.sent = 0
        self.posted = 0


class _RecvHandle:
    def __init__(self, link: _Link, seq: int, tensor: torch.Tensor, hub: "LocalHub") -> None:
        self.link, self.seq, self.tensor, self.hub = link, seq, tensor, hub

    def wait(self, timeout: float) -> None:
        with self.link.cond:
            ok = self.link.cond.wait_for(lambda: self.seq in self.link.messages or bool(self.hub.failed), timeout)
            if self.seq in self.link.messages:
                data, copied = self.link.messages.pop(self.seq)
            elif self.hub.failed:
                raise PeerFailure(self.hub.failed)
            else:
                raise CommTimeout(f"timed out after {timeout:g} s")
        order = self.hub.order
        order.after(copied, self.tensor)  # the sender's copy is done before this stream reads it
        self.tensor.copy_(data)
        order.hold(data)  # the copy's memory outlives this stream's read

    def done(self) -> bool:
        return self.seq in self.link.messages


class _MemberHandle:
    """One member's view of a LocalHub collective: complete once every member posted and the
    reduction was issued; the member's stream then waits for the reduction's event."""

    def __init__(self, future: _Future, order: Order, tensor: torch.Tensor) -> None:
        self.future, self.order, self.tensor = future, order, tensor
        self.event: Any = None  # set with the future: after the reduction, on the reducing member's stream

    def wait(self, timeout: float) -> None:
        self.future.wait(timeout)
        self.order.after(self.event, self.tensor)

    def done(self) -> bool:
        return self.future.done()


class LocalHub:
    """Shared state of all ranks of one process: FIFO mailboxes per directed link and tag, and
    rendezvous points for collectives. ``order`` orders the ranks' streams (module doc)."""

    def __init__(self, world_size: int, order: Order | None = None) -> None:
        self.world_size = world_size
        self.order: Order = order if order is not None else CudaOrder()
        self.links = {(s, d, 0): _Link() for s in range(world_size) for d in range(world_size) if s != d}
        self.lock = threading.Lock()
        self.pending: dict[tuple, dict] = {}
        self.counts: dict[tuple[int, tuple[int, ...]], int] = {}
        self.failed: str = ""
        self.on_fail: list = []
        """Callables given the failure message when the run fails (other waits to end)."""

    def link(self, src: int, dst: int, tag: int = 0) -> _Link:
        """The mailbox of messages ``src`` -> ``dst`` with ``tag`` (one FIFO per tag)."""
        key = (src, dst, tag)
        link = self.links.get(key)
        if link is None:
            if src == dst or not (0 <= src < self.world_size and 0 <= dst < self.world_size):
                raise ValueError(f"no link {src}->{dst} among {self.world_size} ranks")
            with self.lock:
                link = self.links.setdefault(key, _Link())
        return link

    def fail(self, message: str) -> None:
        """Mark the run failed: every pending and future receive raises PeerFailure."""
        self.failed = message
        for link in list(self.links.values()):
            with link.cond:
                link.cond.notify_all()
        for fn in self.on_fail:
            fn(message)

    def transport(self, rank: int) -> "LocalTransport":
        return LocalTransport(self, rank)

    def _collective(self, rank: int, op: str, tensor: torch.Tensor, group: tuple[int, ...],
                    root: int | None, out: torch.Tensor | None) -> _MemberHandle:
        """The last member to post reduces on its current stream, after every member's input
        (and output buffer) is ready on that member's stream; each member's stream waits for
        the reduction before it reads or changes its tensors again."""
        order = self.order
        handle = _MemberHandle(_Future(), order, tensor)
        with self.lock:
            n = self.counts.get((rank, group), 0)
            self.counts[(rank, group)] = n + 1
            slot = self.pending.setdefault((group, n), {"parts": {}, "outs": {}, "handles": {}, "ready": {}})
            slot["parts"][rank] = tensor
            slot["outs"][rank] = out
            slot["handles"][rank] = handle
            slot["ready"][rank] = order.ready(tensor)
            if len(slot["parts"]) < len(group):
                return handle
            del self.pending[(group, n)]
        parts, outs = slot["parts"], slot["outs"]
        error: Exception | None = None
        try:
            for r in group:
                order.after(slot["ready"][r], tensor)
            _reduce(op, parts, outs, group, root)
        except Exception as e:  # noqa: BLE001 - every member sees the failure
            error = e
        done = order.ready(tensor)
        for r in group:
            order.hold(parts[r])
            if outs[r] is not None:
                order.hold(outs[r])
        for h in slot["handles"].values():
            h.event = done
            h.future.set(error)
        return handle


def _reduce(op: str, parts: dict, outs: dict, group: tuple[int, ...], root: int | None) -> None:
    """Collective ``op`` over the members' tensors ``parts`` (and buffers ``outs``), on the
    calling thread's current stream."""
    if op == "BROADCAST":
        for r, t in parts.items():
            if r != root:
                t.copy_(parts[root])
    elif op in ("REDUCE", "ALLREDUCE"):
        total = sum(parts[r].clone() for r in group)
        for r in ([root] if op == "REDUCE" else list(group)):
            parts[r].copy_(total)
    elif op == "ALLGATHER":
        whole = torch.cat([parts[r].reshape(-1) for r in group])
        for r in group:
            outs[r].copy_(whole.view_as(outs[r]))
    elif op == "REDUCESCATTER":
        total = sum(parts[r].clone() for r in group).reshape(-1)
        for k, r in enumerate(group):
            m = outs[r].numel()
            outs[r].copy_(total[k * m:(k + 1) * m].view_as(outs[r]))
    else:
        raise ValueError(f"collective {op} unknown; allowed: {', '.join(COLLECTIVES)}")


class LocalTransport:
    """One rank's view of a LocalHub. Sends copy the tensor, so the sender may reuse it."""

    def __init__(self, hub: LocalHub, rank: int) -> None:
        self.hub, self.rank, self.world_size = hub, rank, hub.world_size

    def isend(self, tensor: torch.Tensor, peer: int, tag: int = 0) -> Handle:
        link = self.hub.link(self.rank, peer, tag)
        data = tensor.detach().clone()
        copied = self.hub.order.ready(data)  # the receiver's stream waits for this copy
        with link.cond:
            link.messages[link.sent] = (data, copied)
            link.sent += 1
            link.cond.notify_all()
        return _Done()

    def irecv(self, tensor: torch.Tensor, peer: int, tag: int = 0) -> Handle:
        link = self.hub.link(peer, self.rank, tag)
        with link.cond:
            seq = link.posted
            link.posted += 1
        return _RecvHandle(link, seq, tensor, self.hub)

    def collective(self, op: str, tensor: torch.Tensor, group: Sequence[int], root: int | None,
                   out: torch.Tensor | None = None) -> Handle:
        key = tuple(sorted(group))
        if len(key) == 1:
            if out is not None:
                out.copy_(tensor)
            return _Done()
        return self.hub._collective(self.rank, op, tensor, key, root, out)


class _Deferred:
    """The handle of a message the link emulator hands to the inner transport later: complete
    once it was handed over (the emulated arrival) and the inner send completed."""

    def __init__(self) -> None:
        self._handed = _Future()
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
    ``pipert.runtime.links.LinkEmulator``, the numbers of ``pipert.cost.Links``).

    A send is the message's ready time: the message occupies its directed link for
    ``bytes / bandwidth`` after the previous message of that link (FIFO per link, kept by the
    sender, which alone sends on it) and arrives one latency after its occupancy ends. Latency
    the receiver's own compute already covered is not paid again (CrossPipe's receiver-side
    rule). A free link (no latency, unlimited bandwidth) sends at once. The payload is copied at
    the send, so the sender may change or free its tensor (weights after an OPT) while the
    message travels. Collectives are not delayed. Two paths (``path``):

    - "timer": the message is handed to the inner transport at its arrival by the emulator's
      timer thread (C++ with pipert._C, Python without); the receiver posts an ordinary receive
      and no clock is shared between processes. GPU tensors wait for their copy's CUDA event.
    - "stream" (``pipert.runtime.linkframes``): the sender's send queue holds the occupancy and
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
        """The link steps of the stream path on ``device`` (pipert.runtime.linkframes)."""
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
        return self.inner.collective(op, tensor, group, root, out)
