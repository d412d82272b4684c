"""A pool of page-locked host buffers for staging weights and activations.

Buffers are allocated once per size class (powers of two, >= 4 KiB) and reused:
``acquire`` serves a free block of the class when there is one. ``release(after=event)``
returns a block only once ``event`` completed, so an asynchronous copy that still reads
or writes it is never overlapped by the next user. :class:`DoubleBuffer` keeps two
blocks and hands them out in turn (fill one while the other is consumed).

With a CUDA build of torch the memory is page-locked (pipert._C's cudaHostAlloc pool, or
``pin_memory=True`` tensors without it). On CPU-only torch there is no page-locked memory:
the pool then gives ordinary host buffers with the same pooling, reuse and double
buffering, and says so in ``pool.pinned`` (False) and ``pool.backing``.
"""
from __future__ import annotations

import logging
from typing import Any

import torch

from .. import _ext

__all__ = ["PinnedPool", "PinnedBuffer", "DoubleBuffer", "size_class"]

_log = logging.getLogger("pipert")
MIN_BLOCK = 4096


def size_class(nbytes: int) -> int:
    """Capacity of the block that serves ``nbytes``: the next power of two, at least 4 KiB."""
    c = MIN_BLOCK
    while c < nbytes:
        c <<= 1
    return c


class PinnedBuffer:
    """A block held from a pool. ``tensor`` is a uint8 view of exactly ``nbytes`` bytes
    (None once released; views taken earlier keep their memory alive, but the pool may hand
    the block out again)."""

    __slots__ = ("pool", "id", "nbytes", "capacity", "tensor", "_held")

    def __init__(self, pool: "PinnedPool", block_id: int, nbytes: int, block: torch.Tensor) -> None:
        self.pool = pool
        self.id = block_id
        self.nbytes = nbytes
        self.capacity = block.numel()
        self.tensor = block[:nbytes]
        self._held = True

    def view(self, dtype: torch.dtype, shape: tuple[int, ...] | torch.Size) -> torch.Tensor:
        """The first bytes of the buffer as a tensor of ``dtype`` and ``shape``."""
        n = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
        if n > self.nbytes:
            raise ValueError(f"{dtype} {tuple(shape)} needs {n} bytes; buffer has {self.nbytes}")
        return self.tensor[:n].view(dtype).view(shape)

    def release(self, after: Any = None) -> None:
        """Back to the pool now, or once the event ``after`` completed."""
        self.pool.release(self, after)

    def __enter__(self) -> "PinnedBuffer":
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._held:
            self.release()


class PinnedPool:
    """Host staging buffers, allocated once per size class and reused.

    ``backend``: "ext" (pipert._C pool) or "python" (torch tensors); default "ext" when
    the extension can give the wanted kind of memory. ``page_locked``: default True when
    torch has CUDA; True without CUDA is an error.
    """

    def __init__(self, backend: str | None = None, page_locked: bool | None = None) -> None:
        cuda = torch.cuda.is_available()
        self.pinned = cuda if page_locked is None else page_locked
        if self.pinned and not cuda:
            raise RuntimeError("page-locked memory needs a CUDA build of torch and a GPU")
        ext_ok = _ext.HAVE_EXT and (not self.pinned or _ext.HAVE_EXT_CUDA)
        self.backend = backend or ("ext" if ext_ok else "python")
        if self.backend == "ext":
            if not ext_ok:
                raise RuntimeError("backend 'ext' cannot give this memory: "
                                   f"pipert._C loaded={_ext.HAVE_EXT}, with CUDA={_ext.HAVE_EXT_CUDA}")
            self._c = _ext.C.PinnedPool(self.pinned)
        elif self.backend == "python":
            self._c = None
            self._blocks: dict[int, torch.Tensor] = {}
            self._free: dict[int, list[int]] = {}
            self._held: set[int] = set()
            self._stats = {"allocations": 0, "reuses": 0, "bytes_reserved": 0, "in_use": 0}
        else:
            raise ValueError(f"backend {self.backend!r} unknown; allowed: ext, python")
        self.backing = ("page-locked host memory" if self.pinned else
                        "ordinary host memory (not page-locked: " +
                        ("torch has no CUDA)" if not cuda else "page_locked=False)"))
        if not self.pinned:
            _log.info("pipert PinnedPool: %s", self.backing)
        self._pending: list[tuple[Any, PinnedBuffer]] = []  # (event, buffer) awaiting release

    # -- blocks

    def _acquire_block(self, nbytes: int) -> tuple[int, torch.Tensor]:
        if self._c is not None:
            return self._c.acquire(nbytes)
        cap = size_class(nbytes)
        free = self._free.setdefault(cap, [])
        if free:
            bid = free.pop()
            self._stats["reuses"] += 1
        else:
            bid = len(self._blocks)
            while bid in self._blocks:
                bid += 1
            self._blocks[bid] = torch.empty(cap, dtype=torch.uint8, pin_memory=self.pinned)
            self._stats["allocations"] += 1
            self._stats["bytes_reserved"] += cap
        self._held.add(bid)
        self._stats["in_use"] += 1
        return bid, self._blocks[bid]

    def _release_block(self, bid: int) -> None:
        if self._c is not None:
            self._c.release(bid)
            return
        if bid not in self._held:
            raise ValueError(f"pinned block {bid} is not held")
        self._held.discard(bid)
        self._stats["in_use"] -= 1
        self._free[self._blocks[bid].numel()].append(bid)

    def _reap(self) -> None:
        still = []
        for ev, buf in self._pending:
            if ev.query():
                self._release_block(buf.id)
            else:
                still.append((ev, buf))
        self._pending = still

    # -- public

    def acquire(self, nbytes: int) -> PinnedBuffer:
        """A buffer of at least ``nbytes`` (a block of its size class, reused when free)."""
        if nbytes < 0:
            raise ValueError("nbytes must be >= 0")
        self._reap()
        bid, block = self._acquire_block(nbytes)
        return PinnedBuffer(self, bid, nbytes, block)

    def release(self, buf: PinnedBuffer, after: Any = None) -> None:
        """Returns ``buf`` now, or once the event ``after`` completed (checked on later acquires)."""
        if not buf._held:
            raise ValueError(f"pinned block {buf.id} released twice")
        buf._held = False
        buf.tensor = None  # a released buffer is not to be used; views taken before stay valid
        if after is not None and not after.query():
            self._pending.append((after, buf))
        else:
            self._release_block(buf.id)

    def stage_out(self, tensor: torch.Tensor, stream: Any = None) -> PinnedBuffer:
        """A host buffer holding ``tensor``'s bytes (e.g. a GPU tensor crossing gloo).

        The copy runs on ``stream`` when given (CUDA: asynchronous from page-locked memory;
        synchronize or wait on an event before reading), else now on the host."""
        buf = self.acquire(tensor.numel() * tensor.element_size())
        dst = buf.view(tensor.dtype, tensor.shape)
        if stream is not None:
            stream.enqueue_copy(dst, tensor)
        else:
            dst.copy_(tensor)
        return buf

    def double_buffer(self, nbytes: int) -> "DoubleBuffer":
        return DoubleBuffer(self, nbytes)

    def stats(self) -> dict[str, int]:
        """allocations (blocks ever allocated), reuses, bytes_reserved, in_use (blocks held)."""
        self._reap()
        return dict(self._c.stats()) if self._c is not None else dict(self._stats)

    def trim(self) -> int:
        """Frees every free block; returns the bytes freed."""
        self._reap()
        if self._c is not None:
            return self._c.trim()
        freed = 0
        for cap, ids in self._free.items():
            for bid in ids:
                del self._blocks[bid]
                freed += cap
            ids.clear()
        self._stats["bytes_reserved"] -= freed
        return freed

    def __repr__(self) -> str:
        return f"PinnedPool(backend={self.backend!r}, {self.backing})"


class DoubleBuffer:
    """Two blocks of ``nbytes`` handed out in turn; reused, never reallocated.

    ``next(stream)`` returns the next slot once its previous consumer is done: the stream
    (or the host, without one) waits for the event given to ``done`` for that slot.
    """

    def __init__(self, pool: PinnedPool, nbytes: int) -> None:
        self.pool = pool
        self.slots = [pool.acquire(nbytes), pool.acquire(nbytes)]
        self._done: list[Any] = [None, None]
        self._i = 1  # the first next() gives slot 0

    def next(self, stream: Any = None) -> PinnedBuffer:
        self._i ^= 1
        ev = self._done[self._i]
        if ev is not None:
            if stream is not None:
                stream.wait(ev)
            else:
                ev.synchronize()
        return self.slots[self._i]

    def done(self, event: Any) -> None:
        """The current slot is free again once ``event`` completes."""
        self._done[self._i] = event

    def close(self) -> None:
        for slot, ev in zip(self.slots, self._done):
            slot.release(ev)
