"""On a GPU: allocator-measured memory of forward and backward equals the formulas.

Skipped without CUDA. Values and gradients run on the GPU through the other
test files (their ``device`` fixture is CUDA when one is present).
"""
import pytest
import torch

from mlp_testutil import gelu_weights, swiglu_weights
from pipert.kernels import (chunk_temp_bytes, chunked_gelu_mlp, chunked_swiglu_mlp,
                            saved_activation_bytes)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

N, H, F, CHUNK = 8192, 512, 1536, 1024
SLACK = 4 * 2 ** 20  # allocator rounding and small buffers (bias sums)


def _measure(fn, x, dy):
    """(bytes held after forward, forward peak, backward peak), each above its start."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    y = fn(x)
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated() - base
    fwd_peak = torch.cuda.max_memory_allocated() - base
    base_b = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    y.backward(dy)
    torch.cuda.synchronize()
    return held, fwd_peak, torch.cuda.max_memory_allocated() - base_b


@pytest.mark.parametrize("activation", ["swiglu", "gelu"])
@pytest.mark.parametrize("recompute", [False, True], ids=["saved", "recompute"])
def test_allocated_memory_matches_formulas(activation, recompute):
    dev, dtype, b = torch.device("cuda"), torch.bfloat16, 2
    if activation == "swiglu":
        w = swiglu_weights(H, F, dtype, dev)
        fn = lambda x: chunked_swiglu_mlp(x, *w, chunk_size=CHUNK, recompute=recompute)  # noqa: E731
        wgrad = 3 * F * H * b
    else:
        w = gelu_weights(H, F, dtype, dev)
        fn = lambda x: chunked_gelu_mlp(x, *w, chunk_size=CHUNK, recompute=recompute)  # noqa: E731
        wgrad = (2 * F * H + F + H) * b
    x = torch.randn(N, H, device=dev, dtype=dtype, requires_grad=True)
    dy = torch.randn(N, H, device=dev, dtype=dtype)
    fn(x).backward(dy)  # warm-up: kernels compiled, cuBLAS workspace allocated
    x.grad = None
    for p in w:
        p.grad = None
    held, fwd_peak, bwd_peak = _measure(fn, x, dy)
    out = N * H * b
    saved_new = saved_activation_bytes(N, H, F, dtype, activation=activation,
                                       recompute=recompute) - N * H * b  # x existed before
    temps = chunk_temp_bytes(CHUNK, F, dtype, activation=activation)
    assert abs(held - (saved_new + out)) <= SLACK
    assert fwd_peak <= saved_new + out + temps + SLACK
    # backward allocates dx, the weight grads and one chunk's temporaries, nothing sequence-wide
    assert bwd_peak <= out + wgrad + temps + SLACK
    whole_sequence_intermediate = N * F * b
    assert bwd_peak < out + wgrad + whole_sequence_intermediate
