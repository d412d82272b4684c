"""SwiGLU gate product ``a = silu(g) * u`` and its backward.

Triton kernels, typed wrappers, PyTorch reference. All arithmetic runs in
float32 and each output is rounded once to the operand dtype (float64 operands
take the reference, in float64). The backward recomputes ``a`` from ``g`` and
``u`` (the down projection's weight gradient needs it), so ``a`` is never saved.

Derivatives, with ``s = sigmoid(g)``::

    du = dh * g * s
    dg = dh * u * s * (1 + g * (1 - s))
"""
import torch

from ._backend import (BLOCK, HAVE_TRITON, check_elementwise, compute_dtype, device_of, kernel,
                       use_triton)

__all__ = [
    "swiglu_forward",
    "swiglu_backward",
    "swiglu_reference",
    "swiglu_backward_reference",
]

if HAVE_TRITON:
    import triton
    import triton.language as tl

    @kernel
    def _swiglu_fwd_kernel(g_ptr, u_ptr, a_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(u_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        a = g * tl.sigmoid(g) * u
        tl.store(a_ptr + offs, a.to(a_ptr.dtype.element_ty), mask=mask)

    @kernel
    def _swiglu_bwd_kernel(g_ptr, u_ptr, dh_ptr, a_ptr, dg_ptr, du_ptr, n,
                           BLOCK: tl.constexpr, STORE_A: tl.constexpr):
        # Outputs may alias inputs: every element is loaded before it is stored,
        # by the same program.
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(u_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        dh = tl.load(dh_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        s = tl.sigmoid(g)
        silu = g * s
        if STORE_A:
            tl.store(a_ptr + offs, (silu * u).to(a_ptr.dtype.element_ty), mask=mask)
        du = dh * silu
        dg = dh * u * s * (1.0 + g * (1.0 - s))
        tl.store(dg_ptr + offs, dg.to(dg_ptr.dtype.element_ty), mask=mask)
        tl.store(du_ptr + offs, du.to(du_ptr.dtype.element_ty), mask=mask)


def swiglu_reference(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """PyTorch reference of the forward kernel: ``silu(g) * u`` in float32 (float64 for
    float64), rounded once."""
    ct = compute_dtype(g)
    return (torch.nn.functional.silu(g.to(ct)) * u.to(ct)).to(g.dtype)


def swiglu_backward_reference(g: torch.Tensor, u: torch.Tensor, dh: torch.Tensor
                              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """PyTorch reference of the backward kernel: returns ``(a, dg, du)``."""
    ct = compute_dtype(g)
    gf, uf, dhf = g.to(ct), u.to(ct), dh.to(ct)
    s = torch.sigmoid(gf)
    silu = gf * s
    a = silu * uf
    du = dhf * silu
    dg = dhf * uf * s * (1.0 + gf * (1.0 - s))
    return a.to(g.dtype), dg.to(g.dtype), du.to(g.dtype)


def swiglu_forward(g: torch.Tensor, u: torch.Tensor, out: torch.Tensor | None = None
                   ) -> torch.Tensor:
    """``silu(g) * u`` elementwise; all operands contiguous, one shape and dtype.

    ``out`` may be ``g`` or ``u`` (in place).
    """
    if out is None:
        out = torch.empty_like(g)
    check_elementwise("swiglu_forward", g=g, u=u, out=out)
    n = g.numel()
    if n == 0:
        return out
    if use_triton(g):
        with device_of(g):
            _swiglu_fwd_kernel[(triton.cdiv(n, BLOCK),)](g, u, out, n, BLOCK=BLOCK)
    else:
        out.copy_(swiglu_reference(g, u))
    return out


def swiglu_backward(g: torch.Tensor, u: torch.Tensor, dh: torch.Tensor, *, need_a: bool,
                    out_a: torch.Tensor | None = None, out_dg: torch.Tensor | None = None,
                    out_du: torch.Tensor | None = None
                    ) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """Backward of ``a = silu(g) * u`` given ``dh = dL/da``: returns ``(a or None, dg, du)``.

    ``a`` is recomputed only when ``need_a``. Outputs may share storage with inputs
    (every element is read before any output element is written), e.g. ``out_dg=dh``,
    ``out_a=g``, ``out_du=u``; outputs must not alias each other.
    """
    out_dg = torch.empty_like(g) if out_dg is None else out_dg
    out_du = torch.empty_like(g) if out_du is None else out_du
    if need_a and out_a is None:
        out_a = torch.empty_like(g)
    outs = {"out_dg": out_dg, "out_du": out_du}
    if need_a:
        outs["out_a"] = out_a
    check_elementwise("swiglu_backward", g=g, u=u, dh=dh, **outs)
    n = g.numel()
    if n == 0:
        return (out_a if need_a else None), out_dg, out_du
    if use_triton(g):
        a_arg = out_a if need_a else out_du  # never written when STORE_A is false
        with device_of(g):
            _swiglu_bwd_kernel[(triton.cdiv(n, BLOCK),)](g, u, dh, a_arg, out_dg, out_du, n,
                                                        BLOCK=BLOCK, STORE_A=need_a)
    else:
        a, dg, du = swiglu_backward_reference(g, u, dh)
        out_dg.copy_(dg)
        out_du.copy_(du)
        if need_a:
            out_a.copy_(a)
    return (out_a if need_a else None), out_dg, out_du
