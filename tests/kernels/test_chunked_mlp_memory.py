"""Saved-tensor bytes per mode, measured with saved-tensor hooks, equal the formulas."""
import pytest
import torch

from mlp_testutil import gelu_weights, swiglu_weights
from pipert.kernels import (chunk_size_for_budget, chunk_temp_bytes, chunked_gelu_mlp,
                            chunked_swiglu_mlp, gelu_mlp_reference, saved_activation_bytes,
                            swiglu_mlp_reference)

H, F, N = 32, 80, 50


def _saved(fn, params):
    """Runs ``fn`` under saved-tensor hooks; returns (activation bytes, saved params).

    Parameters are saved by reference (no new memory), so they are counted
    apart; activations are counted once per distinct storage region.
    """
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        fn()
    ids = {id(p) for p in params if p is not None}
    param_hits = [t for t in saved if id(t) in ids]
    seen, act = set(), 0
    for t in saved:
        if id(t) in ids:
            continue
        key = (t.data_ptr(), t.numel(), t.dtype)
        if key not in seen:
            seen.add(key)
            act += t.numel() * t.element_size()
    return act, param_hits


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("recompute", [False, True], ids=["saved", "recompute"])
def test_swiglu_saved_bytes(device, dtype, recompute):
    w = swiglu_weights(H, F, dtype, device)
    x = torch.randn(2, N // 2, H, device=device, dtype=dtype, requires_grad=True)
    act, params = _saved(lambda: chunked_swiglu_mlp(x, *w, chunk_size=16, recompute=recompute), w)
    b = x.element_size()
    expected = (H if recompute else H + 2 * F) * N * b
    assert act == expected == saved_activation_bytes(N, H, F, dtype, recompute=recompute)
    assert sorted(map(id, params)) == sorted(map(id, w))  # each weight once, by reference
    ref_act, _ = _saved(lambda: swiglu_mlp_reference(x, *w), w)
    assert ref_act >= (H + 3 * F) * N * b > act  # PyTorch also keeps silu(g) and the product


@pytest.mark.parametrize("recompute", [False, True], ids=["saved", "recompute"])
@pytest.mark.parametrize("bias", [True, False])
def test_gelu_saved_bytes(device, recompute, bias):
    dtype = torch.float16
    w = gelu_weights(H, F, dtype, device, bias=bias)
    x = torch.randn(N, H, device=device, dtype=dtype, requires_grad=True)
    act, params = _saved(lambda: chunked_gelu_mlp(x, *w, chunk_size=7, recompute=recompute), w)
    expected = (H if recompute else H + F) * N * 2
    assert act == expected == saved_activation_bytes(N, H, F, dtype, activation="gelu",
                                                     recompute=recompute)
    assert sorted(map(id, params)) == sorted(id(p) for p in w if p is not None)
    ref_act, _ = _saved(lambda: gelu_mlp_reference(x, *w), w)
    assert ref_act >= (H + 2 * F) * N * 2 > act


def test_formulas_and_budget():
    bf16 = torch.bfloat16
    # the benchmark shape: hidden 4096, ffn 14336, 128k tokens
    n, h, f = 128 * 1024, 4096, 14336
    assert saved_activation_bytes(n, h, f, bf16) == (h + 2 * f) * n * 2
    assert saved_activation_bytes(n, h, f, bf16, recompute=True) == h * n * 2 == 2 ** 30
    assert chunk_temp_bytes(4096, f, bf16) == 3 * 4096 * f * 2
    assert chunk_temp_bytes(4096, f, bf16, activation="gelu") == 2 * 4096 * f * 2
    budget = chunk_temp_bytes(4096, f, bf16)
    assert chunk_size_for_budget(budget, h, f, bf16) == 4096
    assert chunk_size_for_budget(budget - 1, h, f, bf16) == 4096 - 128
    assert chunk_size_for_budget(budget, h, f, bf16, activation="gelu") == 6144
    with pytest.raises(ValueError, match="fewer than 128 rows"):
        chunk_size_for_budget(1000, h, f, bf16)
    with pytest.raises(ValueError, match="activation"):
        saved_activation_bytes(1, 1, 1, bf16, activation="relu")
