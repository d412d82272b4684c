"""Chunked MLP values and gradients equal the unchunked PyTorch MLP, in every mode and dtype."""
import pytest
import torch

from mlp_testutil import assert_matches, clone_leaves, gelu_weights, rel_err, swiglu_weights
from pipert.kernels import (ChunkedGeluMLP, ChunkedSwiGLUMLP, chunked_gelu_mlp,
                            chunked_swiglu_mlp, gelu_mlp_reference, swiglu_mlp_reference)

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# 2 x 37 = 74 token rows: chunks of 16 and 25 leave ragged last chunks (10, 24),
# 7 gives eleven chunks, 1000 one chunk larger than the input (None, the whole
# input as one chunk, runs in the GeLU cases).
CHUNKS = [16, 25, 7, 1000]
H, F = 48, 80


def _run(fn, x, params, dy):
    """Forward + backward; returns (y, dx, [dparam...])."""
    y = fn(x, *params)
    y.backward(dy)
    return y.detach(), x.grad, [None if p is None else p.grad for p in params]


def _compare(ours_fn, ref_fn, x0, params0, dtype, device, seed=1):
    gen = torch.Generator().manual_seed(seed)
    dy = (torch.randn(x0.shape, generator=gen)).to(device, dtype)
    runs = {}
    for name, fn, dt in [("ours", ours_fn, dtype), ("torch", ref_fn, dtype),
                         ("truth", ref_fn, torch.float64)]:
        x = x0.detach().to(dt).requires_grad_()
        runs[name] = _run(fn, x, clone_leaves(params0, dt), dy.to(dt))
    names = ["y", "dx"] + [f"d{i}" for i in range(len(params0))]
    flat = {k: [v[0], v[1], *v[2]] for k, v in runs.items()}
    for i, what in enumerate(names):
        if flat["ours"][i] is None:
            assert flat["torch"][i] is None, what
            continue
        assert_matches(flat["ours"][i], flat["torch"][i], flat["truth"][i], dtype, what)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("recompute", [False, True], ids=["saved", "recompute"])
@pytest.mark.parametrize("chunk", CHUNKS)
def test_swiglu_matches_unchunked(device, dtype, recompute, chunk):
    x0 = torch.randn(2, 37, H, generator=torch.Generator().manual_seed(0)).to(device, dtype)
    w = swiglu_weights(H, F, dtype, device)
    ours = lambda x, *p: chunked_swiglu_mlp(x, *p, chunk_size=chunk, recompute=recompute)  # noqa: E731
    _compare(ours, swiglu_mlp_reference, x0, w, dtype, device)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("recompute", [False, True], ids=["saved", "recompute"])
@pytest.mark.parametrize("chunk,approximate,bias", [(16, "none", True), (25, "tanh", True),
                                                    (7, "tanh", False), (None, "none", False)])
def test_gelu_matches_unchunked(device, dtype, recompute, chunk, approximate, bias):
    x0 = torch.randn(74, H, generator=torch.Generator().manual_seed(0)).to(device, dtype)
    w = gelu_weights(H, F, dtype, device, bias=bias)
    ours = lambda x, *p: chunked_gelu_mlp(x, *p, approximate=approximate,  # noqa: E731
                                          chunk_size=chunk, recompute=recompute)
    ref = lambda x, *p: gelu_mlp_reference(x, *p, approximate=approximate)  # noqa: E731
    _compare(ours, ref, x0, w, dtype, device)


@pytest.mark.parametrize("recompute", [False, True], ids=["saved", "recompute"])
def test_float64_takes_the_exact_path(device, recompute):
    """float64 (oracle runs) uses the reference activation in float64: matches to ~1e-15."""
    x0 = torch.randn(74, H, generator=torch.Generator().manual_seed(0)).to(device, torch.float64)
    w = swiglu_weights(H, F, torch.float64, device)
    ours = lambda x, *p: chunked_swiglu_mlp(x, *p, chunk_size=16, recompute=recompute)  # noqa: E731
    _compare(ours, swiglu_mlp_reference, x0, w, torch.float64, device)
    wg = gelu_weights(H, F, torch.float64, device)
    ours = lambda x, *p: chunked_gelu_mlp(x, *p, chunk_size=25, recompute=recompute)  # noqa: E731
    _compare(ours, gelu_mlp_reference, x0, wg, torch.float64, device)


def test_drop_in_for_builtin_model(device):
    """The built-in model with the chunked MLP gives the same loss and grads as with its own."""
    from pipert.models import llama
    cfg = llama.LlamaConfig(hidden=32, layers=2, heads=4, kv_heads=2, ffn=48, max_seq=32)
    ref = llama.LlamaModel(cfg, seed=3).to(device)
    ours = llama.LlamaModel(cfg, seed=3, mlp_factory=ChunkedSwiGLUMLP.factory(chunk_size=7)).to(device)
    assert isinstance(ours.layers[0].mlp, ChunkedSwiGLUMLP)
    assert set(ours.state_dict()) == set(ref.state_dict())
    tokens = torch.randint(0, cfg.vocab, (2, 20), generator=torch.Generator().manual_seed(0))
    tokens = tokens.to(device)
    losses = [m(tokens[:, :-1], tokens[:, 1:]) for m in (ref, ours)]
    for loss in losses:
        loss.backward()
    assert rel_err(losses[1], losses[0]) < 1e-6
    grads = dict(ref.named_parameters())
    for name, p in ours.named_parameters():
        assert rel_err(p.grad, grads[name].grad) < 1e-5, name


@pytest.mark.parametrize("recompute", [False, True])
def test_frozen_weights_and_input_without_grad(device, recompute):
    """needs_input_grad is honoured: no grad where none is asked for, right grads elsewhere."""
    wg, wu, wd = swiglu_weights(H, F, torch.float32, device)
    wu.requires_grad_(False)
    x = torch.randn(30, H, device=device)  # no grad
    chunked_swiglu_mlp(x, wg, wu, wd, chunk_size=8, recompute=recompute).sum().backward()
    assert wu.grad is None and x.grad is None
    rg, rd = clone_leaves([wg, wd])
    swiglu_mlp_reference(x, rg, wu, rd).sum().backward()
    assert rel_err(wg.grad, rg.grad) < 1e-5 and rel_err(wd.grad, rd.grad) < 1e-5


def test_grads_accumulate_into_existing_grad(device):
    w = swiglu_weights(H, F, torch.float32, device)
    x = torch.randn(40, H, device=device, requires_grad=True)
    for p in w:
        p.grad = torch.full_like(p, 0.5)
    chunked_swiglu_mlp(x, *w, chunk_size=16).sum().backward()
    r = clone_leaves(w)
    swiglu_mlp_reference(x.detach(), *r).sum().backward()
    for p, q in zip(w, r):
        assert rel_err(p.grad, q.grad + 0.5) < 1e-6


@pytest.mark.parametrize("rows", [0, 1])
def test_tiny_and_empty_inputs(device, rows):
    w = swiglu_weights(H, F, torch.float32, device)
    x = torch.randn(rows, H, device=device, requires_grad=True)
    y = chunked_swiglu_mlp(x, *w, chunk_size=4)
    y.sum().backward()
    assert y.shape == (rows, H) and x.grad.shape == (rows, H)
    if rows == 0:
        assert all(float(p.grad.abs().sum()) == 0.0 for p in w)


def test_modules_are_drop_in(device):
    """Modules wrap existing linears without copying and match nn.Linear-built MLPs."""
    lin = [torch.nn.Linear(H, F, bias=False), torch.nn.Linear(H, F, bias=False),
           torch.nn.Linear(F, H, bias=False)]
    lin = [m.to(device) for m in lin]
    mlp = ChunkedSwiGLUMLP.from_linears(*lin, chunk_size=10, recompute=True)
    assert mlp.w1.weight is lin[0].weight and mlp.w3 is lin[1] and mlp.w2 is lin[2]
    assert set(mlp.state_dict()) == {"w1.weight", "w3.weight", "w2.weight"}
    x = torch.randn(3, 11, H, device=device)
    ref = lin[2](torch.nn.functional.silu(lin[0](x)) * lin[1](x))
    assert rel_err(mlp(x), ref) < 1e-5

    g = ChunkedGeluMLP(H, F, approximate="tanh", chunk_size=9, device=device)
    assert set(g.state_dict()) == {"fc.weight", "fc.bias", "proj.weight", "proj.bias"}
    ref = g.proj(torch.nn.functional.gelu(g.fc(x), approximate="tanh"))
    assert rel_err(g(x), ref) < 1e-5
    with torch.no_grad():  # inference takes the chunk-only path
        assert rel_err(g(x), ref) < 1e-5
    g2 = ChunkedGeluMLP.from_linears(g.fc, g.proj, chunk_size=5)
    assert g2.fc is g.fc and g2.approximate == "none"


def test_memory_budget_sets_chunk_size():
    mlp = ChunkedSwiGLUMLP(H, 1024, memory_budget=3 * 1024 * 4 * 256, dtype=torch.float32,
                           device="meta")
    assert mlp.chunk_size == 256


@pytest.mark.parametrize("bad,match,exc", [
    (dict(w_up=(F + 1, H)), "w_up has shape", ValueError),
    (dict(w_down=(F, H)), "w_down has shape", ValueError),
    (dict(dtype_up=torch.float16), "w_up has dtype", TypeError),
    (dict(x_dtype=torch.int32), "x has dtype", TypeError),
    (dict(chunk=0), "chunk_size must be a positive int", ValueError),
    (dict(chunk=2.5), "chunk_size must be a positive int", ValueError),
])
def test_shape_and_dtype_errors(device, bad, match, exc):
    shapes = {"w_gate": (F, H), "w_up": bad.get("w_up", (F, H)), "w_down": bad.get("w_down", (H, F))}
    w = {k: torch.randn(s, device=device) for k, s in shapes.items()}
    if "dtype_up" in bad:
        w["w_up"] = w["w_up"].to(bad["dtype_up"])
    x = torch.randn(5, H, device=device)
    if "x_dtype" in bad:
        x = x.to(bad["x_dtype"])
    with pytest.raises(exc, match=match):
        chunked_swiglu_mlp(x, w["w_gate"], w["w_up"], w["w_down"], chunk_size=bad.get("chunk", 4))


def test_gelu_errors(device):
    w = gelu_weights(H, F, torch.float32, device)
    x = torch.randn(5, H, device=device)
    with pytest.raises(ValueError, match="b_fc has shape"):
        chunked_gelu_mlp(x, w[0], w[3], w[2], w[3])
    with pytest.raises(ValueError, match="approximate"):
        chunked_gelu_mlp(x, *w, approximate="erf")
    with pytest.raises(ValueError, match="w_fc has shape"):
        chunked_gelu_mlp(torch.randn(5, H + 1, device=device), *w)
