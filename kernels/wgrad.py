"""Deferred weight gradients: the split of a backward into D (input grad) and W (weight grad).

A zero-bubble schedule runs D for a micro-batch as soon as the next stage's
gradient arrives and W later, in a bubble. A chunked MLP whose forward ran with
a :class:`WeightGradQueue` attached computes only ``dx`` in its backward and
puts one closure into the queue; ``queue.flush()`` runs those closures, which
accumulate into ``param.grad`` (creating it when it is ``None``), chunk by chunk.

Invariants:
- The queue is chosen at forward time and travels with the autograd graph, so
  it does not matter which thread runs the backward (CUDA backward runs on an
  autograd worker thread).
- Closures run in the order their backwards ran; each runs at most once.
- Between D and W the queue holds the tensors W needs (see docs/kernels.md).
"""
from __future__ import annotations

import threading
from collections import deque
from contextlib import contextmanager
from typing import Callable, Iterator

import torch

__all__ = [
    "WeightGradQueue",
    "defer_weight_grads",
    "current_weight_grad_queue",
    "GradSink",
]


class WeightGradQueue:
    """FIFO of deferred weight-gradient work.

    ``deque.append``/``popleft`` are atomic, so backwards on autograd worker
    threads may put while another thread flushes. Copying or pickling a queue
    (e.g. ``copy.deepcopy`` of a module that owns one) gives an empty queue:
    pending work belongs to the original's graph.
    """

    def __init__(self) -> None:
        self._items: deque[Callable[[], None]] = deque()

    def __getstate__(self) -> dict:
        return {}

    def __setstate__(self, state: dict) -> None:
        self._items = deque()

    def put(self, work: Callable[[], None]) -> None:
        """Appends one closure; called from a backward."""
        self._items.append(work)

    def __len__(self) -> int:
        return len(self._items)

    def flush(self) -> int:
        """Runs every queued closure in FIFO order; returns how many ran."""
        ran = 0
        while True:
            try:
                work = self._items.popleft()
            except IndexError:
                return ran
            with torch.no_grad():
                work()
            ran += 1

    def clear(self) -> int:
        """Drops the queued work (and the tensors it holds) without running it."""
        n = len(self._items)
        self._items.clear()
        return n


_local = threading.local()


def current_weight_grad_queue() -> WeightGradQueue | None:
    """The queue of the innermost :func:`defer_weight_grads` block on this thread, or None."""
    stack = getattr(_local, "stack", None)
    return stack[-1] if stack else None


@contextmanager
def defer_weight_grads(queue: WeightGradQueue) -> Iterator[WeightGradQueue]:
    """Chunked MLP forwards run inside this block defer their weight grads into ``queue``.

    Wrap the *forward*; the later backward of those outputs computes only input
    gradients, and ``queue.flush()`` is the W pass.
    """
    if not isinstance(queue, WeightGradQueue):
        raise TypeError(f"defer_weight_grads needs a WeightGradQueue, got {type(queue).__name__}")
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    stack.append(queue)
    try:
        yield queue
    finally:
        stack.pop()


class GradSink:
    """Accumulates chunk contributions to one parameter's gradient.

    ``into_param=False``: a fresh tensor, returned by :meth:`finish` (the
    autograd path; autograd then adds it into ``.grad``).
    ``into_param=True``: the deferred path; products go straight into an existing
    ``param.grad`` (no extra full-size buffer), or into a fresh tensor that
    :meth:`finish` installs as ``param.grad``.
    Matrix products accumulate in the parameter dtype, one rounding per chunk;
    row sums (bias gradients) accumulate in float32 (float64 for float64) and are
    rounded once.
    """

    def __init__(self, param: torch.Tensor, into_param: bool) -> None:
        self.param = param
        self.into_param = into_param
        self.buf: torch.Tensor | None = None
        self.sum32: torch.Tensor | None = None

    def addmm(self, a: torch.Tensor, b: torch.Tensor) -> None:
        """Adds ``a @ b`` (shaped like the parameter)."""
        if self.buf is None:
            if self.into_param and self.param.grad is not None:
                self.buf = self.param.grad
                self.buf.addmm_(a, b)
            else:
                self.buf = torch.mm(a, b)
        else:
            self.buf.addmm_(a, b)

    def add_row_sum(self, t: torch.Tensor) -> None:
        """Adds ``t.sum(0)`` (shaped like the parameter)."""
        acc = torch.float64 if t.dtype == torch.float64 else torch.float32
        s = t.sum(0, dtype=acc)
        self.sum32 = s if self.sum32 is None else self.sum32.add_(s)

    def finish(self) -> torch.Tensor:
        """The gradient of this call; in the deferred path also ``param.grad`` updated."""
        p = self.param
        if self.sum32 is not None:
            self.buf = self.sum32.to(p.dtype)
            if self.into_param and p.grad is not None:
                p.grad.add_(self.buf)
                return p.grad
        if self.buf is None:  # no rows: the gradient is zero
            self.buf = torch.zeros_like(p)
            if self.into_param and p.grad is not None:
                return p.grad
        if self.into_param and p.grad is None:
            p.grad = self.buf
        return self.buf
