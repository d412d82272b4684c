"""Chunked SwiGLU and GeLU MLPs: autograd functions, functional API, unchunked references.

The token rows (all leading dims of ``x`` flattened, ``N`` of them) are processed
``chunk`` rows at a time; the last chunk may be shorter. GEMMs run in PyTorch
(cuBLAS on a GPU), the activation and its backward in the Triton kernels of
``swiglu.py`` / ``gelu.py``.

Two memory modes (formulas in ``mlp_memory.py``):
- ``recompute=False`` (chunked temporaries): saves ``x`` and the ffn-wide
  pre-activations for the whole sequence; every other ffn-wide tensor exists one
  chunk at a time.
- ``recompute=True``: saves only ``x``; backward recomputes each chunk's
  pre-activations (two extra GEMMs for SwiGLU, one for GeLU).

Weight gradients are summed over chunks. With a :class:`WeightGradQueue` (passed
in, or from an enclosing ``defer_weight_grads`` block at forward time) the
backward computes only ``dx`` and queues the weight-gradient pass; see ``wgrad.py``.
"""
from __future__ import annotations

from typing import Callable, Iterator

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from ._backend import FLOAT_DTYPES
from .gelu import gelu_backward, gelu_forward
from .swiglu import swiglu_backward, swiglu_forward
from .wgrad import GradSink, WeightGradQueue, current_weight_grad_queue

__all__ = [
    "chunked_swiglu_mlp",
    "chunked_gelu_mlp",
    "swiglu_mlp_reference",
    "gelu_mlp_reference",
]


def _chunks(n: int, chunk: int) -> Iterator[tuple[int, int]]:
    for r0 in range(0, n, chunk):
        yield r0, min(r0 + chunk, n)


def _sinks(params: tuple[torch.Tensor | None, ...], needs: tuple[bool, ...], into_param: bool
           ) -> list[GradSink | None]:
    return [GradSink(p, into_param) if (p is not None and need) else None
            for p, need in zip(params, needs)]


def _defer(queue: WeightGradQueue, dy_in: torch.Tensor, dy: torch.Tensor,
           params: tuple[torch.Tensor | None, ...], needs: tuple[bool, ...],
           loop: Callable[[torch.Tensor, list[GradSink | None]], None]) -> None:
    """Queues the W pass of one backward: ``loop(dy, sinks)`` into ``.grad`` of ``params``.

    The W pass owns its copy of the output gradient: a pipeline runtime may reuse
    the buffer it received ``dy_in`` in before the W pass runs.
    """
    dy_w = dy.clone() if dy.data_ptr() == dy_in.data_ptr() else dy

    def weight_grads() -> None:
        sinks = _sinks(params, needs, into_param=True)
        loop(dy_w, sinks)
        for s in sinks:
            if s is not None:
                s.finish()

    queue.put(weight_grads)


# ---------------------------------------------------------------- SwiGLU


def _swiglu_chunk_loop(x: torch.Tensor, wg: torch.Tensor, wu: torch.Tensor, wd: torch.Tensor,
                       g_all: torch.Tensor | None, u_all: torch.Tensor | None,
                       dy: torch.Tensor, chunk: int, dx: torch.Tensor | None,
                       sg: GradSink | None, su: GradSink | None, sd: GradSink | None) -> None:
    """One backward sweep over the chunks, filling ``dx`` and/or the sinks.

    ``g_all``/``u_all`` are the saved pre-activations, or None to recompute them.
    Per-chunk buffers, reused by every chunk: gate (recompute only), up
    (recompute only), dh (overwritten by dgate), dup and the activation (the
    last two land in the up and gate buffers when those are recomputed).
    """
    n, f = x.shape[0], wg.shape[0]
    c = min(chunk, n)
    need_dgu = dx is not None or sg is not None or su is not None
    need_a = sd is not None
    if not (need_dgu or need_a):
        return
    new = lambda: x.new_empty(c, f)  # noqa: E731
    recompute = g_all is None
    g_buf, u_buf = (new(), new()) if recompute else (None, None)
    dh_buf = new() if need_dgu else None
    du_buf = u_buf if recompute else (new() if need_dgu else None)
    a_buf = g_buf if recompute else (new() if need_a else None)
    for r0, r1 in _chunks(n, chunk):
        m = r1 - r0
        x_c, dy_c = x[r0:r1], dy[r0:r1]
        if recompute:
            g_c = torch.mm(x_c, wg.t(), out=g_buf[:m])
            u_c = torch.mm(x_c, wu.t(), out=u_buf[:m])
        else:
            g_c, u_c = g_all[r0:r1], u_all[r0:r1]
        if need_dgu:
            dh = torch.mm(dy_c, wd, out=dh_buf[:m])
            a_c, dg, du = swiglu_backward(g_c, u_c, dh, need_a=need_a,
                                          out_a=a_buf[:m] if need_a else None,
                                          out_dg=dh, out_du=du_buf[:m])
        else:
            a_c = swiglu_forward(g_c, u_c, out=a_buf[:m])
        if sd is not None:
            sd.addmm(dy_c.t(), a_c)
        if dx is not None:
            dx_c = torch.mm(dg, wg, out=dx[r0:r1])
            dx_c.addmm_(du, wu)
        if sg is not None:
            sg.addmm(dg.t(), x_c)
        if su is not None:
            su.addmm(du.t(), x_c)


def swiglu_forward_into(x: torch.Tensor, wg: torch.Tensor, wu: torch.Tensor, wd: torch.Tensor,
                        chunk: int, recompute: bool, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The chunked forward of the rows ``x`` into ``y``; returns what the backward sweep needs
    beyond ``x`` and the weights: nothing (``recompute``) or the pre-activations ``(g, u)``."""
    n, f = x.shape[0], wg.shape[0]
    if recompute:
        # a_c is written over g_c in place
        g_buf, u_buf = x.new_empty(min(chunk, n), f), x.new_empty(min(chunk, n), f)
        for r0, r1 in _chunks(n, chunk):
            m = r1 - r0
            g_c = torch.mm(x[r0:r1], wg.t(), out=g_buf[:m])
            u_c = torch.mm(x[r0:r1], wu.t(), out=u_buf[:m])
            torch.mm(swiglu_forward(g_c, u_c, out=g_c), wd.t(), out=y[r0:r1])
        return ()
    g, u = torch.mm(x, wg.t()), torch.mm(x, wu.t())
    a_buf = x.new_empty(min(chunk, n), f)
    for r0, r1 in _chunks(n, chunk):
        a_c = swiglu_forward(g[r0:r1], u[r0:r1], out=a_buf[:r1 - r0])
        torch.mm(a_c, wd.t(), out=y[r0:r1])
    return g, u


class _ChunkedSwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, wg: torch.Tensor, wu: torch.Tensor, wd: torch.Tensor,
                chunk: int, recompute: bool, queue: WeightGradQueue | None) -> torch.Tensor:
        y = x.new_empty(x.shape[0], wd.shape[0])
        ctx.save_for_backward(x, wg, wu, wd, *swiglu_forward_into(x, wg, wu, wd, chunk, recompute, y))
        ctx.chunk, ctx.recompute, ctx.queue = chunk, recompute, queue
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy: torch.Tensor):
        saved = ctx.saved_tensors
        x, wg, wu, wd = saved[:4]
        g, u = (None, None) if ctx.recompute else saved[4:6]
        dy_in, dy = dy, dy.contiguous()
        need_x, need_g, need_u, need_d = ctx.needs_input_grad[:4]
        chunk, queue = ctx.chunk, ctx.queue
        dx = x.new_empty(x.shape) if need_x else None
        tail = (None, None, None)
        if queue is None:
            sg, su, sd = _sinks((wg, wu, wd), (need_g, need_u, need_d), into_param=False)
            _swiglu_chunk_loop(x, wg, wu, wd, g, u, dy, chunk, dx, sg, su, sd)
            grads = [s.finish() if s is not None else None for s in (sg, su, sd)]
            return (dx, *grads, *tail)
        if need_x:  # D: input gradient only
            _swiglu_chunk_loop(x, wg, wu, wd, g, u, dy, chunk, dx, None, None, None)
        if need_g or need_u or need_d:
            _defer(queue, dy_in, dy, (wg, wu, wd), (need_g, need_u, need_d),
                   lambda dy_w, sinks: _swiglu_chunk_loop(x, wg, wu, wd, g, u, dy_w, chunk,
                                                          None, *sinks))
        return (dx, None, None, None, *tail)


# ---------------------------------------------------------------- GeLU


def _gelu_chunk_loop(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor | None,
                     w2: torch.Tensor, z_all: torch.Tensor | None, dy: torch.Tensor,
                     chunk: int, approximate: str, dx: torch.Tensor | None,
                     s_w1: GradSink | None, s_b1: GradSink | None,
                     s_w2: GradSink | None, s_b2: GradSink | None) -> None:
    """One backward sweep over the chunks, filling ``dx`` and/or the sinks.

    Per-chunk buffers: z (recompute only; takes the activation in place), dact
    (overwritten by dz), and the activation (saved-z mode only).
    """
    n, f = x.shape[0], w1.shape[0]
    c = min(chunk, n)
    need_dz = dx is not None or s_w1 is not None or s_b1 is not None
    need_act = s_w2 is not None
    if not (need_dz or need_act or s_b2 is not None):
        return
    recompute = z_all is None
    z_buf = x.new_empty(c, f) if recompute else None
    dact_buf = x.new_empty(c, f) if need_dz else None
    act_buf = z_buf if recompute else (x.new_empty(c, f) if need_act else None)
    for r0, r1 in _chunks(n, chunk):
        m = r1 - r0
        x_c, dy_c = x[r0:r1], dy[r0:r1]
        if recompute:
            z_c = _linear_into(x_c, w1, b1, z_buf[:m])
        else:
            z_c = z_all[r0:r1]
        if need_dz:
            dact = torch.mm(dy_c, w2, out=dact_buf[:m])
            act, dz = gelu_backward(z_c, dact, approximate, need_act=need_act,
                                    out_act=act_buf[:m] if need_act else None, out_dz=dact)
        elif need_act:
            act = gelu_forward(z_c, approximate, out=act_buf[:m])
        if s_w2 is not None:
            s_w2.addmm(dy_c.t(), act)
        if s_b2 is not None:
            s_b2.add_row_sum(dy_c)
        if dx is not None:
            torch.mm(dz, w1, out=dx[r0:r1])
        if s_w1 is not None:
            s_w1.addmm(dz.t(), x_c)
        if s_b1 is not None:
            s_b1.add_row_sum(dz)


def _linear_into(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, out: torch.Tensor
                 ) -> torch.Tensor:
    if b is None:
        return torch.mm(x, w.t(), out=out)
    return torch.addmm(b, x, w.t(), out=out)


def gelu_forward_into(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor | None, w2: torch.Tensor,
                      b2: torch.Tensor | None, approximate: str, chunk: int, recompute: bool,
                      y: torch.Tensor) -> torch.Tensor | None:
    """The chunked forward of the rows ``x`` into ``y``; returns the pre-activations ``z`` the
    backward sweep needs (None with ``recompute``: it recomputes them chunk by chunk)."""
    n, f = x.shape[0], w1.shape[0]
    buf = x.new_empty(min(chunk, n), f)  # recompute: z_c, then act_c in place
    z = None if recompute else _linear_into(x, w1, b1, x.new_empty(n, f))
    for r0, r1 in _chunks(n, chunk):
        m = r1 - r0
        z_c = _linear_into(x[r0:r1], w1, b1, buf[:m]) if recompute else z[r0:r1]
        act = gelu_forward(z_c, approximate, out=buf[:m])
        _linear_into(act, w2, b2, y[r0:r1])
    return z


class _ChunkedGeLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor | None,
                w2: torch.Tensor, b2: torch.Tensor | None, approximate: str, chunk: int,
                recompute: bool, queue: WeightGradQueue | None) -> torch.Tensor:
        y = x.new_empty(x.shape[0], w2.shape[0])
        z = gelu_forward_into(x, w1, b1, w2, b2, approximate, chunk, recompute, y)
        ctx.save_for_backward(x, w1, b1, w2, b2, z)
        ctx.chunk, ctx.recompute, ctx.queue, ctx.approximate = chunk, recompute, queue, approximate
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy: torch.Tensor):
        x, w1, b1, w2, b2, z = ctx.saved_tensors
        dy_in, dy = dy, dy.contiguous()
        need_x, *needs = ctx.needs_input_grad[:5]
        params = (w1, b1, w2, b2)
        chunk, queue, approx = ctx.chunk, ctx.queue, ctx.approximate
        dx = x.new_empty(x.shape) if need_x else None
        tail = (None, None, None, None)
        if queue is None:
            sinks = _sinks(params, tuple(needs), into_param=False)
            _gelu_chunk_loop(x, w1, b1, w2, z, dy, chunk, approx, dx, *sinks)
            return (dx, *[s.finish() if s is not None else None for s in sinks], *tail)
        if need_x:  # D: input gradient only
            _gelu_chunk_loop(x, w1, b1, w2, z, dy, chunk, approx, dx, None, None, None, None)
        if any(needs):
            _defer(queue, dy_in, dy, params, tuple(needs),
                   lambda dy_w, sinks: _gelu_chunk_loop(x, w1, b1, w2, z, dy_w, chunk, approx,
                                                        None, *sinks))
        return (dx, None, None, None, None, *tail)


# ---------------------------------------------------------------- checks and public API


def _check_inputs(fn: str, x: torch.Tensor, chunk_size: int | None,
                  shapes: dict[str, tuple[torch.Tensor | None, tuple[int, ...]]]) -> int:
    """Validates dtype, device and shapes; returns the chunk size in rows."""
    if not isinstance(x, torch.Tensor) or x.dim() < 1:
        raise ValueError(f"{fn}: x must be a tensor with at least one dim (..., hidden)")
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{fn}: x has dtype {x.dtype}; expected float32, float16, bfloat16 "
                        "or float64")
    for name, (t, shape) in shapes.items():
        if t is None:
            continue
        if tuple(t.shape) != shape:
            raise ValueError(f"{fn}: {name} has shape {tuple(t.shape)}, expected {shape} "
                             f"(x is {tuple(x.shape)})")
        if t.dtype != x.dtype:
            raise TypeError(f"{fn}: {name} has dtype {t.dtype} but x has {x.dtype}; "
                            "cast the weights or the input so that they match")
        if t.device != x.device:
            raise ValueError(f"{fn}: {name} is on {t.device} but x is on {x.device}")
    n = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if chunk_size is None:
        return max(n, 1)
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"{fn}: chunk_size must be a positive int or None, got {chunk_size!r}")
    return chunk_size


def _needs_grad(*ts: torch.Tensor | None) -> bool:
    """Whether this call builds a graph (else the forward takes the chunk-only path)."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in ts)


def _resolve_queue(fn: str, queue: WeightGradQueue | None,
                   params: tuple[torch.Tensor | None, ...]) -> WeightGradQueue | None:
    queue = queue if queue is not None else current_weight_grad_queue()
    if queue is None or not torch.is_grad_enabled():
        return None
    if not isinstance(queue, WeightGradQueue):
        raise TypeError(f"{fn}: weight_grad_queue must be a WeightGradQueue")
    for p in params:
        if p is not None and p.requires_grad and not p.is_leaf:
            raise ValueError(f"{fn}: deferred weight gradients are written to .grad, so every "
                             "weight that requires grad must be a leaf tensor (a Parameter)")
    return queue


def chunked_swiglu_mlp(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor,
                       w_down: torch.Tensor, *, chunk_size: int | None = 4096,
                       recompute: bool = False,
                       weight_grad_queue: WeightGradQueue | None = None) -> torch.Tensor:
    """``down(silu(x w_gate^T) * (x w_up^T))``, chunked over the token rows of ``x``.

    Shapes: ``x`` (..., h); ``w_gate``, ``w_up`` (f, h); ``w_down`` (h, f); all one
    dtype and device (float32/float16/bfloat16; float64 runs the reference
    activation). ``chunk_size`` rows per chunk (None: one chunk). ``recompute``
    picks the memory mode. With a queue, the backward defers the weight
    gradients into it. Without autograd (no_grad, nothing requiring grad) the
    forward never holds more than one chunk's intermediates.
    """
    fn = "chunked_swiglu_mlp"
    h = x.shape[-1] if x.dim() else 0
    f = w_gate.shape[0] if w_gate.dim() else 0
    chunk = _check_inputs(fn, x, chunk_size, {"w_gate": (w_gate, (f, h)), "w_up": (w_up, (f, h)),
                                              "w_down": (w_down, (h, f))})
    queue = _resolve_queue(fn, weight_grad_queue, (w_gate, w_up, w_down))
    # weights are passed as they are (GEMMs take any strides), so that a deferred
    # W pass writes .grad of the very tensors the caller passed
    recompute = bool(recompute) or not _needs_grad(x, w_gate, w_up, w_down)
    y = _ChunkedSwiGLU.apply(x.reshape(-1, h).contiguous(), w_gate, w_up, w_down, chunk,
                             recompute, queue)
    return y.view(*x.shape[:-1], h)


def chunked_gelu_mlp(x: torch.Tensor, w_fc: torch.Tensor, b_fc: torch.Tensor | None,
                     w_proj: torch.Tensor, b_proj: torch.Tensor | None, *,
                     approximate: str = "none", chunk_size: int | None = 4096,
                     recompute: bool = False,
                     weight_grad_queue: WeightGradQueue | None = None) -> torch.Tensor:
    """``gelu(x w_fc^T + b_fc) w_proj^T + b_proj``, chunked over the token rows of ``x``.

    Shapes: ``x`` (..., h); ``w_fc`` (f, h); ``b_fc`` (f,) or None; ``w_proj``
    (h, f); ``b_proj`` (h,) or None. ``approximate`` is ``"none"`` or ``"tanh"``
    as in ``torch.nn.functional.gelu``. Other arguments as in :func:`chunked_swiglu_mlp`.
    """
    fn = "chunked_gelu_mlp"
    if approximate not in ("none", "tanh"):
        raise ValueError(f"{fn}: approximate must be 'none' or 'tanh', got {approximate!r}")
    h = x.shape[-1] if x.dim() else 0
    f = w_fc.shape[0] if w_fc.dim() else 0
    chunk = _check_inputs(fn, x, chunk_size, {"w_fc": (w_fc, (f, h)), "b_fc": (b_fc, (f,)),
                                              "w_proj": (w_proj, (h, f)),
                                              "b_proj": (b_proj, (h,))})
    queue = _resolve_queue(fn, weight_grad_queue, (w_fc, b_fc, w_proj, b_proj))
    recompute = bool(recompute) or not _needs_grad(x, w_fc, b_fc, w_proj, b_proj)
    y = _ChunkedGeLU.apply(x.reshape(-1, h).contiguous(), w_fc, b_fc, w_proj, b_proj,
                           approximate, chunk, recompute, queue)
    return y.view(*x.shape[:-1], h)


def swiglu_mlp_reference(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor,
                         w_down: torch.Tensor) -> torch.Tensor:
    """The unchunked PyTorch SwiGLU MLP that the chunked one must match."""
    return F.linear(F.silu(F.linear(x, w_gate)) * F.linear(x, w_up), w_down)


def gelu_mlp_reference(x: torch.Tensor, w_fc: torch.Tensor, b_fc: torch.Tensor | None,
                       w_proj: torch.Tensor, b_proj: torch.Tensor | None,
                       approximate: str = "none") -> torch.Tensor:
    """The unchunked PyTorch GeLU MLP that the chunked one must match."""
    return F.linear(F.gelu(F.linear(x, w_fc, b_fc), approximate=approximate), w_proj, b_proj)
