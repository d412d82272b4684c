"""The chunked MLPs on tensor-parallel weight shards (HelixPipe §4.4.2).

The first linear(s) are column-parallel (``w_fc``/``w_gate``/``w_up``: this rank's ``f/T`` rows,
``b_fc`` its slice), the last row-parallel (``w_proj``/``w_down``: ``[h, f/T]``; its bias
replicated and added once, after the sum). ``tp`` is any object with ``size``, ``group`` (a
``torch.distributed`` process group) and ``sequence_parallel`` (``pipert.models.tp.TensorParallel``).

With sequence parallelism the input is this rank's sequence shard ``[..., s/T, h]``:

- forward: all-gather the token rows of every shard into one buffer ``[T*n, h]``, run the chunked
  MLP ``chunk`` rows at a time into a second buffer, reduce-scatter it: each rank gets the sum
  over the group of its own rows;
- backward: all-gather the output gradient and the input again, sweep the chunks (input
  gradient into a third buffer, weight gradients summed over chunks), reduce-scatter the input
  gradient.

The MLP acts on each token row alone, so rows are gathered rank-major along dim 0 (what
``all_gather_single`` writes) and reduce-scattered back in the same order; no permutation.
Without sequence parallelism the input is replicated: chunks run on the local rows, the output
and the input gradient are all-reduced in place.

Buffers: the three ``[T*n, h]`` communication buffers are allocated once per (role, shape,
dtype, device) and thread, and reused by every call (only one call uses them at a time: a
forward or backward runs to its end before the next starts on the thread, and the forward that
a checkpoint recomputes runs when the backward first reads its saved tensors, before that
backward touches a buffer). Only the local shard of the input is saved for backward, so the
saved input is 1/T of the gathered one; ``recompute=False`` also saves the pre-activations
``[T*n, f/T]``.

Invariant: every member of the group makes the same calls in the same order (the same program
on graphs of the same shape), so the collectives match (NCCL's rule).
"""
from __future__ import annotations

import threading
from typing import Any

import torch
import torch.distributed as dist
from torch.autograd.function import once_differentiable

from .chunked_mlp import (_check_inputs, _defer, _gelu_chunk_loop, _resolve_queue, _sinks,
                          _swiglu_chunk_loop, gelu_forward_into, swiglu_forward_into)
from .wgrad import WeightGradQueue

__all__ = ["tp_chunked_swiglu_mlp", "tp_chunked_gelu_mlp", "comm_buffer"]

_pool = threading.local()


def comm_buffer(role: str, rows: int, like: torch.Tensor) -> torch.Tensor:
    """This thread's buffer ``[rows, like.shape[-1]]`` for ``role`` ("gathered", "gathered_grad"
    or "reduced"), allocated on the first request of its shape, dtype and device, then reused."""
    buffers = getattr(_pool, "buffers", None)
    if buffers is None:
        buffers = _pool.buffers = {}
    key = (role, rows, like.shape[-1], like.dtype, like.device)
    buf = buffers.get(key)
    if buf is None:
        buf = buffers[key] = like.new_empty(rows, like.shape[-1])
    return buf


def _gather_rows(x: torch.Tensor, tp: Any, role: str) -> torch.Tensor:
    """The rows of every rank's ``x`` (SP), rank-major, in the ``role`` buffer; else ``x``."""
    if not tp.sequence_parallel:
        return x
    out = comm_buffer(role, tp.size * x.shape[0], x)
    dist.all_gather_single(out, x, group=tp.group)
    return out


def _sum_rows(y: torch.Tensor, tp: Any) -> torch.Tensor:
    """The sum over the group of the partial rows ``y``: this rank's block of them (SP, a new
    tensor), or all of them (``y`` reduced in place)."""
    if not tp.sequence_parallel:
        dist.all_reduce(y, group=tp.group)
        return y
    out = y.new_empty(y.shape[0] // tp.size, y.shape[1])
    dist.reduce_scatter_single(out, y, group=tp.group)
    return out


class _SwiGLU:
    """params ``(w_gate, w_up, w_down)``; extras: ``()`` or the pre-activations ``(g, u)``."""

    @staticmethod
    def forward_into(x, params, y, chunk, recompute) -> tuple:
        return swiglu_forward_into(x, *params, chunk, recompute, y)

    @staticmethod
    def sweep(x, params, extras, dy, chunk, dx, sinks) -> None:
        g, u = extras if extras else (None, None)
        _swiglu_chunk_loop(x, *params, g, u, dy, chunk, dx, *sinks)


class _GeLU:
    """params ``(w_fc, b_fc, w_proj)`` (the replicated proj bias is added outside); extras:
    ``()`` or the pre-activations ``(z,)``."""

    def __init__(self, approximate: str) -> None:
        self.approximate = approximate

    def forward_into(self, x, params, y, chunk, recompute) -> tuple:
        w1, b1, w2 = params
        z = gelu_forward_into(x, w1, b1, w2, None, self.approximate, chunk, recompute, y)
        return () if z is None else (z,)

    def sweep(self, x, params, extras, dy, chunk, dx, sinks) -> None:
        w1, b1, w2 = params
        z = extras[0] if extras else None
        _gelu_chunk_loop(x, w1, b1, w2, z, dy, chunk, self.approximate, dx, *sinks, None)


class _TPChunkedMLP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, tp: Any, act: Any, chunk: int, recompute: bool,
                queue: WeightGradQueue | None, *params: torch.Tensor | None) -> torch.Tensor:
        xf = _gather_rows(x, tp, "gathered")
        rows, out_cols = xf.shape[0], params[-1].shape[0]
        yf = comm_buffer("reduced", rows, x) if tp.sequence_parallel else x.new_empty(rows, out_cols)
        extras = act.forward_into(xf, params, yf, chunk, recompute)
        ctx.save_for_backward(x, *params, *extras)
        ctx.tp, ctx.act, ctx.chunk, ctx.queue, ctx.nparams = tp, act, chunk, queue, len(params)
        return _sum_rows(yf, tp)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy: torch.Tensor):
        saved = ctx.saved_tensors  # first: a checkpoint's recomputed forward uses the buffers here
        k = ctx.nparams
        x, params, extras = saved[0], saved[1:1 + k], saved[1 + k:]
        tp, act, chunk, queue = ctx.tp, ctx.act, ctx.chunk, ctx.queue
        need_x, needs = ctx.needs_input_grad[0], tuple(ctx.needs_input_grad[6:6 + k])
        dy_in, dy = dy, dy.contiguous()
        dx = None
        if need_x or (queue is None and any(needs)):
            xf, dyf = _gather_rows(x, tp, "gathered"), _gather_rows(dy, tp, "gathered_grad")
            dxf = None
            if need_x:
                dxf = comm_buffer("reduced", xf.shape[0], x) if tp.sequence_parallel else torch.empty_like(xf)
            sinks = _sinks(params, needs, into_param=False) if queue is None else [None] * k
            act.sweep(xf, params, extras, dyf, chunk, dxf, sinks)
            grads = [s.finish() if s is not None else None for s in sinks]
            dx = _sum_rows(dxf, tp) if need_x else None
        else:
            grads = [None] * k
        if queue is not None and any(needs):
            # the W pass gathers again when it runs (the same order on every member)
            _defer(queue, dy_in, dy, params, needs,
                   lambda dy_w, sinks: act.sweep(_gather_rows(x, tp, "gathered"), params, extras,
                                                 _gather_rows(dy_w, tp, "gathered_grad"), chunk, None, sinks))
        return (dx, None, None, None, None, None, *grads)


def _apply(fn: str, x: torch.Tensor, tp: Any, act: Any, chunk_size: int | None, recompute: bool,
           queue: WeightGradQueue | None, params: tuple[torch.Tensor | None, ...],
           shapes: dict) -> torch.Tensor:
    h = x.shape[-1]
    if tp.size > 1 and tp.group is None and not x.is_meta:
        raise ValueError(f"{fn}: tp of size {tp.size} has no process group (shapes only); allowed: a "
                         f"TensorParallel with the TP group, or the meta device")
    chunk = _check_inputs(fn, x, chunk_size, shapes)
    if x.is_meta:  # boundary shapes: the output is shaped like the input
        return x.new_empty(x.shape)
    queue = _resolve_queue(fn, queue, params)
    recompute = bool(recompute) or not (torch.is_grad_enabled()
                                        and any(t is not None and t.requires_grad for t in (x, *params)))
    y = _TPChunkedMLP.apply(x.reshape(-1, h).contiguous(), tp, act, chunk, recompute, queue, *params)
    return y.view(*x.shape[:-1], h)


def tp_chunked_swiglu_mlp(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor,
                          tp: Any, *, chunk_size: int | None = 4096, recompute: bool = False,
                          weight_grad_queue: WeightGradQueue | None = None) -> torch.Tensor:
    """``chunked_swiglu_mlp`` on this rank's shards: ``w_gate``, ``w_up`` ``[f/T, h]``, ``w_down``
    ``[h, f/T]``; ``x`` the local sequence shard (``tp.sequence_parallel``) or the replicated
    input. The output has the shape of ``x`` and is the whole MLP's (its shard under SP)."""
    h, f = x.shape[-1], w_gate.shape[0]
    shapes = {"w_gate": (w_gate, (f, h)), "w_up": (w_up, (f, h)), "w_down": (w_down, (h, f))}
    return _apply("tp_chunked_swiglu_mlp", x, tp, _SwiGLU, chunk_size, recompute, weight_grad_queue,
                  (w_gate, w_up, w_down), shapes)


def tp_chunked_gelu_mlp(x: torch.Tensor, w_fc: torch.Tensor, b_fc: torch.Tensor | None, w_proj: torch.Tensor,
                        b_proj: torch.Tensor | None, tp: Any, *, approximate: str = "none",
                        chunk_size: int | None = 4096, recompute: bool = False,
                        weight_grad_queue: WeightGradQueue | None = None) -> torch.Tensor:
    """``chunked_gelu_mlp`` on this rank's shards: ``w_fc`` ``[f/T, h]``, ``b_fc`` ``[f/T]``,
    ``w_proj`` ``[h, f/T]``; ``b_proj`` ``[h]`` replicated, added after the sum. ``x`` as in
    :func:`tp_chunked_swiglu_mlp`."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"tp_chunked_gelu_mlp: approximate must be 'none' or 'tanh', got {approximate!r}")
    h, f = x.shape[-1], w_fc.shape[0]
    shapes = {"w_fc": (w_fc, (f, h)), "b_fc": (b_fc, (f,)), "w_proj": (w_proj, (h, f)), "b_proj": (b_proj, (h,))}
    y = _apply("tp_chunked_gelu_mlp", x, tp, _GeLU(approximate), chunk_size, recompute, weight_grad_queue,
               (w_fc, b_fc, w_proj), shapes)
    return y if b_proj is None else y + b_proj
