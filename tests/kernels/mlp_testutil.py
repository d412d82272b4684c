"""Shared helpers of the kernel tests: random MLP weights and dtype-aware comparison."""
import torch

# Norm-relative tolerance against the unchunked PyTorch MLP in the same dtype.
TOL = {torch.float32: 2e-6, torch.float16: 2e-3, torch.bfloat16: 1.5e-2, torch.float64: 1e-13}


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| in float64 (0 when both are zero)."""
    a, b = a.double(), b.double()
    den = b.norm().item()
    num = (a - b).norm().item()
    return num / den if den > 0 else num


def assert_matches(ours: torch.Tensor, torch_same: torch.Tensor, truth: torch.Tensor,
                   dtype: torch.dtype, what: str) -> None:
    """Ours is close to PyTorch in the same dtype, and not much less accurate than it.

    ``truth`` is the same computation in float64. Chunked weight gradients round
    once per chunk, hence the factor on PyTorch's own error.
    """
    assert ours.shape == torch_same.shape and ours.dtype == torch_same.dtype, what
    e_same = rel_err(ours, torch_same)
    assert e_same <= TOL[dtype], f"{what}: rel err vs PyTorch {e_same:.2e} > {TOL[dtype]:.0e}"
    if dtype == torch.float64:  # PyTorch in float64 is the truth
        return
    e_ours, e_torch = rel_err(ours, truth), rel_err(torch_same, truth)
    eps = torch.finfo(dtype).eps
    assert e_ours <= 3 * e_torch + 4 * eps, (
        f"{what}: rel err vs float64 {e_ours:.2e}, PyTorch's {e_torch:.2e}")


def swiglu_weights(h: int, f: int, dtype: torch.dtype, device: torch.device,
                   seed: int = 0) -> list[torch.Tensor]:
    """Leaf (w_gate, w_up, w_down) scaled so activations are O(1)."""
    gen = torch.Generator().manual_seed(seed)
    shapes = [(f, h), (f, h), (h, f)]
    return [(torch.randn(s, generator=gen) / s[1] ** 0.5).to(device, dtype).requires_grad_()
            for s in shapes]


def gelu_weights(h: int, f: int, dtype: torch.dtype, device: torch.device, bias: bool = True,
                 seed: int = 0) -> list[torch.Tensor | None]:
    """Leaf (w_fc, b_fc, w_proj, b_proj), biases None when ``bias`` is False."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for s in [(f, h), (f,), (h, f), (h,)]:
        if len(s) == 1 and not bias:
            out.append(None)
            continue
        scale = s[1] ** -0.5 if len(s) == 2 else 0.5
        out.append((torch.randn(s, generator=gen) * scale).to(device, dtype).requires_grad_())
    return out


def clone_leaves(ts: list[torch.Tensor | None], dtype: torch.dtype | None = None
                 ) -> list[torch.Tensor | None]:
    return [None if t is None else t.detach().to(dtype or t.dtype).requires_grad_() for t in ts]
