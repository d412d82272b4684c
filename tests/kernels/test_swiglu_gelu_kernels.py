"""The elementwise Triton kernels equal their PyTorch references, and those equal autograd."""
import warnings

import pytest
import torch
import torch.nn.functional as F

from pipert.kernels import (gelu_backward, gelu_backward_reference, gelu_forward,
                            gelu_reference, swiglu_backward, swiglu_backward_reference,
                            swiglu_forward, swiglu_reference)
from pipert.kernels import _backend

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
SHAPE = (37, 71)  # 2627 elements: three programs, the last one masked


def _rand(device, dtype, *seeds, scale=3.0):
    return [(torch.randn(SHAPE, generator=torch.Generator().manual_seed(s)) * scale)
            .to(device, dtype) for s in seeds]


def _close(a, b, dtype):
    # Kernel and reference both compute in float32 and round once; they order the
    # float32 operations differently, which may tip a rounding: a few float32
    # ulps, or one ulp of a narrower storage dtype. Near the erf form's
    # cancellation (1 + erf(z) for very negative z) only an absolute bound holds.
    tol = 1e-5 if dtype == torch.float32 else torch.finfo(dtype).eps
    torch.testing.assert_close(a, b, rtol=tol, atol=tol * 0.1)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_swiglu_kernels_match_reference(device, dtype):
    g, u, dh = _rand(device, dtype, 0, 1, 2)
    _close(swiglu_forward(g, u), swiglu_reference(g, u), dtype)
    a, dg, du = swiglu_backward(g, u, dh, need_a=True)
    ra, rdg, rdu = swiglu_backward_reference(g, u, dh)
    for x, y in [(a, ra), (dg, rdg), (du, rdu)]:
        _close(x, y, dtype)
    none, dg2, du2 = swiglu_backward(g, u, dh, need_a=False)
    assert none is None and torch.equal(dg2, dg) and torch.equal(du2, du)


# The references compute in float32 whatever the dtype, hence 1e-5 against float64 autograd.
def test_swiglu_reference_matches_autograd():
    g, u, dh = _rand("cpu", torch.float64, 0, 1, 2)
    g.requires_grad_(), u.requires_grad_()
    a = F.silu(g) * u
    a.backward(dh)
    ra, rdg, rdu = swiglu_backward_reference(g.detach(), u.detach(), dh)
    for x, y in [(ra, a.detach()), (rdg, g.grad), (rdu, u.grad)]:
        torch.testing.assert_close(x.double(), y, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_kernels_match_reference(device, dtype, approximate):
    z, d = _rand(device, dtype, 3, 4)
    _close(gelu_forward(z, approximate), gelu_reference(z, approximate), dtype)
    act, dz = gelu_backward(z, d, approximate, need_act=True)
    ract, rdz = gelu_backward_reference(z, d, approximate)
    _close(act, ract, dtype)
    _close(dz, rdz, dtype)
    none, dz2 = gelu_backward(z, d, approximate, need_act=False)
    assert none is None
    _close(dz2, dz, dtype)  # two compiled variants: the GPU compiler may contract erf's arithmetic differently


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_reference_matches_autograd(approximate):
    z, d = _rand("cpu", torch.float64, 3, 4)
    z.requires_grad_()
    act = F.gelu(z, approximate=approximate)
    act.backward(d)
    ract, rdz = gelu_backward_reference(z.detach(), d, approximate)
    torch.testing.assert_close(ract.double(), act.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(rdz.double(), z.grad, rtol=1e-5, atol=1e-5)


def test_outputs_may_alias_inputs(device):
    """The chunk loops write a over g, du over u, dg over dh, dz over dact, act over z."""
    g, u, dh = _rand(device, torch.float32, 0, 1, 2)
    a, dg, du = swiglu_backward(g, u, dh, need_a=True)
    g2, u2, dh2 = g.clone(), u.clone(), dh.clone()
    swiglu_backward(g2, u2, dh2, need_a=True, out_a=g2, out_dg=dh2, out_du=u2)
    assert torch.equal(g2, a) and torch.equal(dh2, dg) and torch.equal(u2, du)
    g3 = g.clone()
    swiglu_forward(g3, u, out=g3)
    assert torch.equal(g3, swiglu_forward(g, u))
    z, d = _rand(device, torch.float32, 3, 4)
    act, dz = gelu_backward(z, d, "tanh", need_act=True)
    z2, d2 = z.clone(), d.clone()
    gelu_backward(z2, d2, "tanh", need_act=True, out_act=z2, out_dz=d2)
    assert torch.equal(z2, act) and torch.equal(d2, dz)


def test_wrapper_checks(device):
    g, u = _rand(device, torch.float32, 0, 1)
    with pytest.raises(ValueError, match="shape"):
        swiglu_forward(g, u[:, :-1])
    with pytest.raises(TypeError, match="dtype"):
        swiglu_forward(g, u.half())
    with pytest.raises(ValueError, match="contiguous"):
        swiglu_forward(g.t(), u.t())
    with pytest.raises(TypeError, match="expected one of"):
        swiglu_forward(g.long(), u.long())
    with pytest.raises(ValueError, match="approximate"):
        gelu_forward(g, "exact")
    empty = torch.empty(0, 5, device=device)
    assert swiglu_forward(empty, empty).shape == (0, 5)


def test_cpu_without_interpreter_falls_back_and_warns_once(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(_backend, "_warned", False)
    g, u, dh = _rand("cpu", torch.bfloat16, 0, 1, 2)
    with pytest.warns(RuntimeWarning, match="using the PyTorch reference"):
        a = swiglu_forward(g, u)
    assert torch.equal(a, swiglu_reference(g, u))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, dz = gelu_backward(g, dh, need_act=False)
    assert torch.equal(dz, gelu_backward_reference(g, dh)[1])
