"""``DistTransport``: torch.distributed (gloo on CPU, NCCL on GPUs). Messages to a higher rank and
to a lower rank travel in two separate process groups, so the two directions never serialise
behind each other (NCCL gives each (group, pair) its own communicator: ``pipert.comm.nccl``).
NCCL operations on CUDA tensors have stream semantics (``pipert.comm.base``)."""
from __future__ import annotations

import datetime
import functools
from typing import Any, Sequence

import torch
import torch.distributed as dist

from ..errors import CommTimeout, PeerFailure
from .base import COLLECTIVES, Handle, Then, alone
from .mesh import ProcessLayout

__all__ = ["DistTransport", "comm_group"]


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
                 process_groups: dict[tuple[int, ...], Any] | None = None, layout: ProcessLayout | None = None) -> None:
        """``groups``: the rank sets collectives run over (every rank must pass the same list);
        ``process_groups``: ones already made for some of them (e.g. a DeviceMesh's "dp" groups),
        used as they are. ``layout``: which global rank runs which program rank at which tp
        coordinate (``pipert.comm.mesh.ProcessLayout``; default: one process per rank, rank =
        global rank); this process reaches program rank r at ``layout.process(r, t)``, its own tp
        coordinate t; ranks and groups given to this transport are program ranks."""
        if not dist.is_initialized():
            raise RuntimeError("DistTransport needs torch.distributed initialised (torchrun or pipert's launcher)")
        self.layout = layout or ProcessLayout(dist.get_world_size())
        if self.layout.size != dist.get_world_size():
            raise ValueError(f"DistTransport: the layout has {self.layout.size} processes, the job "
                             f"{dist.get_world_size()}")
        self.tp, self.tp_rank = self.layout.tp, self.layout.tp_rank(dist.get_rank())
        self.rank = self.layout.program_rank(dist.get_rank())
        self.world_size = self.layout.program_ranks
        # reduce-scatter as all-reduce plus this rank's slice where torch has no native one
        native = hasattr(dist, "reduce_scatter_single") or hasattr(dist, "reduce_scatter_tensor")
        self.emulate_reduce_scatter = (not native) if emulate_reduce_scatter is None else emulate_reduce_scatter
        # Every rank must create the same groups in the same order.
        self.up = self._group(range(self.world_size), point_to_point=True)
        self.down = self._group(range(self.world_size), point_to_point=True)
        # every rank makes the same groups in the same order; those given are made already
        self.groups: dict[tuple[int, ...], Any] = {k: v for k, v in (process_groups or {}).items() if v is not None}
        made = set(process_groups or {})
        for g in groups:
            key = tuple(sorted(g))
            if key not in made:
                made.add(key)
                self.groups[key] = self._group(key)
        self.connected: set = set()

    def _peer(self, rank: int) -> int:
        """The global rank of program rank ``rank`` at this process's tp coordinate."""
        return self.layout.process(rank, self.tp_rank)

    def _group(self, ranks: Sequence[int], point_to_point: bool = False) -> Any:
        """The process group of program ranks ``ranks`` at this process's tp coordinate; every
        process makes the group of every tp coordinate, in one order."""
        own = None
        for t in range(self.tp):
            members = self.layout.group(ranks, t, ordered=not point_to_point)
            pg = comm_group(sorted(members))
            own = pg if t == self.tp_rank else own
        return own

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
        return _posted(lambda: dist.isend(tensor, self._peer(peer), group=self._pg(self.rank, peer), tag=tag),
                       self._on_stream(tensor))

    def irecv(self, tensor: torch.Tensor, peer: int, tag: int = 0) -> Handle:
        return _posted(lambda: dist.irecv(tensor, self._peer(peer), group=self._pg(peer, self.rank), tag=tag),
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
                dist.send(one, self._peer(dst), group=self._pg(src, dst))
            else:
                dist.recv(one, self._peer(src), group=self._pg(src, dst))
        torch.cuda.current_stream(device).synchronize()
        self.connected.add(comm)

    def collective(self, op: str, tensor: torch.Tensor, group: Sequence[int], root: int | None,
                   out: torch.Tensor | None = None) -> Handle:
        key = tuple(sorted(group))
        done = alone(key, tensor, out)
        if done is not None:
            return done
        pg = self.groups.get(key)
        if pg is None:
            raise RuntimeError(f"group {key} was not created up front; pass it to DistTransport(groups=...)")
        st = self._on_stream(tensor)
        if op == "BROADCAST":
            return _posted(lambda: dist.broadcast(tensor, self._peer(root), group=pg, async_op=True), st)
        if op == "REDUCE":
            dst = self._peer(root)
            return _posted(lambda: dist.reduce(tensor, dst, op=dist.ReduceOp.SUM, group=pg, async_op=True), st)
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
        return Then(work, lambda: out.copy_(total[k * n:(k + 1) * n]))


# --------------------------------------------------------------------------- one process
