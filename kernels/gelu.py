"""GeLU of the GPT-style MLP and its backward: Triton kernels, typed wrappers, reference.

``approximate`` follows ``torch.nn.functional.gelu``: ``"none"`` is the erf form,
``"tanh"`` the tanh form of GPT-2 and Megatron. The tanh form is evaluated as
``z * sigmoid(2v)`` with ``v = sqrt(2/pi) * (z + 0.044715 z^3)``, which equals
``0.5 z (1 + tanh(v))`` and needs no libdevice call. All arithmetic runs in
float32 and each output is rounded once to the operand dtype (float64 operands
take the reference, in float64).
"""
import math

import torch

from ._backend import (BLOCK, HAVE_TRITON, check_elementwise, compute_dtype, device_of, kernel,
                       use_triton)

__all__ = ["gelu_forward", "gelu_backward", "gelu_reference", "gelu_backward_reference"]

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_INV_SQRT_2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_APPROXIMATE = ("none", "tanh")

if HAVE_TRITON:
    import triton
    import triton.language as tl

    @kernel
    def _gelu_kernel(z_ptr, dact_ptr, act_ptr, dz_ptr, n, BLOCK: tl.constexpr,
                     TANH: tl.constexpr, STORE_ACT: tl.constexpr, STORE_DZ: tl.constexpr):
        # Forward: STORE_ACT only. Backward: STORE_DZ, and STORE_ACT when the
        # activation is wanted too. Outputs may alias inputs: every element is
        # loaded before it is stored, by the same program.
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        z = tl.load(z_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        if STORE_DZ:
            dact = tl.load(dact_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        if TANH:
            # 1.5957691216057308 = 2 * sqrt(2/pi)
            s = tl.sigmoid(1.5957691216057308 * (z + 0.044715 * z * z * z))
            act = z * s
            grad = s + act * (1.0 - s) * 1.5957691216057308 * (1.0 + 3.0 * 0.044715 * z * z)
        else:
            cdf = 0.5 * (1.0 + tl.erf(z * 0.7071067811865476))  # 1/sqrt(2)
            act = z * cdf
            grad = cdf + z * tl.exp(-0.5 * z * z) * 0.3989422804014327  # 1/sqrt(2 pi)
        if STORE_ACT:
            tl.store(act_ptr + offs, act.to(act_ptr.dtype.element_ty), mask=mask)
        if STORE_DZ:
            tl.store(dz_ptr + offs, (dact * grad).to(dz_ptr.dtype.element_ty), mask=mask)


def _check_approximate(approximate: str) -> bool:
    if approximate not in _APPROXIMATE:
        raise ValueError(f"approximate must be one of {_APPROXIMATE}, got {approximate!r}")
    return approximate == "tanh"


def _gelu_and_grad_reference(z: torch.Tensor, tanh: bool) -> tuple[torch.Tensor, torch.Tensor]:
    if tanh:
        s = torch.sigmoid(2.0 * _SQRT_2_OVER_PI * (z + 0.044715 * z ** 3))
        act = z * s
        grad = s + act * (1.0 - s) * 2.0 * _SQRT_2_OVER_PI * (1.0 + 3.0 * 0.044715 * z * z)
    else:
        cdf = 0.5 * (1.0 + torch.erf(z * _INV_SQRT_2))
        act = z * cdf
        grad = cdf + z * torch.exp(-0.5 * z * z) * _INV_SQRT_2PI
    return act, grad


def gelu_reference(z: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """PyTorch reference of the forward kernel: float32 inside (float64 for float64), one rounding."""
    tanh = _check_approximate(approximate)
    return _gelu_and_grad_reference(z.to(compute_dtype(z)), tanh)[0].to(z.dtype)


def gelu_backward_reference(z: torch.Tensor, dact: torch.Tensor, approximate: str = "none"
                            ) -> tuple[torch.Tensor, torch.Tensor]:
    """PyTorch reference of the backward kernel: returns ``(gelu(z), dz)``."""
    tanh = _check_approximate(approximate)
    ct = compute_dtype(z)
    act, grad = _gelu_and_grad_reference(z.to(ct), tanh)
    return act.to(z.dtype), (dact.to(ct) * grad).to(z.dtype)


def gelu_forward(z: torch.Tensor, approximate: str = "none", out: torch.Tensor | None = None
                 ) -> torch.Tensor:
    """``gelu(z)`` elementwise; ``out`` may be ``z`` itself (in place)."""
    tanh = _check_approximate(approximate)
    if out is None:
        out = torch.empty_like(z)
    check_elementwise("gelu_forward", z=z, out=out)
    n = z.numel()
    if n == 0:
        return out
    if use_triton(z):
        with device_of(z):
            _gelu_kernel[(triton.cdiv(n, BLOCK),)](z, z, out, out, n, BLOCK=BLOCK, TANH=tanh,
                                                   STORE_ACT=True, STORE_DZ=False)
    else:
        out.copy_(gelu_reference(z, approximate))
    return out


def gelu_backward(z: torch.Tensor, dact: torch.Tensor, approximate: str = "none", *,
                  need_act: bool, out_act: torch.Tensor | None = None,
                  out_dz: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Backward of ``gelu(z)`` given ``dact``: returns ``(gelu(z) or None, dz)``.

    ``gelu(z)`` is recomputed only when ``need_act``. ``out_dz`` may be ``dact``
    itself, ``out_act`` may be ``z``; the two outputs must not alias each other.
    """
    tanh = _check_approximate(approximate)
    out_dz = torch.empty_like(z) if out_dz is None else out_dz
    if need_act and out_act is None:
        out_act = torch.empty_like(z)
    outs = {"out_dz": out_dz}
    if need_act:
        outs["out_act"] = out_act
    check_elementwise("gelu_backward", z=z, dact=dact, **outs)
    n = z.numel()
    if n == 0:
        return (out_act if need_act else None), out_dz
    if use_triton(z):
        act_arg = out_act if need_act else out_dz  # never written when STORE_ACT is false
        with device_of(z):
            _gelu_kernel[(triton.cdiv(n, BLOCK),)](z, dact, act_arg, out_dz, n, BLOCK=BLOCK,
                                                   TANH=tanh, STORE_ACT=need_act, STORE_DZ=True)
    else:
        act, dz = gelu_backward_reference(z, dact, approximate)
        out_dz.copy_(dz)
        if need_act:
            out_act.copy_(act)
    return (out_act if need_act else None), out_dz
