"""Deferred weight gradients: D then W equals the full backward, and accumulates into .grad."""
import copy
import pickle
import threading

import pytest
import torch

from mlp_testutil import clone_leaves, gelu_weights, rel_err, swiglu_weights
from pipert.kernels import (ChunkedSwiGLUMLP, WeightGradQueue, chunked_gelu_mlp,
                            chunked_swiglu_mlp, current_weight_grad_queue, defer_weight_grads)

H, F = 32, 48


def _mlp(activation, recompute, chunk=10):
    if activation == "swiglu":
        return lambda x, *p, **kw: chunked_swiglu_mlp(x, *p, chunk_size=chunk,  # noqa: E731
                                                      recompute=recompute, **kw)
    return lambda x, *p, **kw: chunked_gelu_mlp(x, *p, approximate="tanh",  # noqa: E731
                                                chunk_size=chunk, recompute=recompute, **kw)


def _weights(activation, dtype, device):
    fn = swiglu_weights if activation == "swiglu" else gelu_weights
    return fn(H, F, dtype, device)


@pytest.mark.parametrize("activation", ["swiglu", "gelu"])
@pytest.mark.parametrize("recompute", [False, True], ids=["saved", "recompute"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_d_then_w_equals_full_backward(device, activation, recompute, dtype):
    mlp = _mlp(activation, recompute)
    w_full = _weights(activation, dtype, device)
    w_def = clone_leaves(w_full)
    x0 = torch.randn(3, 13, H, device=device, dtype=dtype)
    dy = torch.randn_like(x0)

    x_full = x0.clone().requires_grad_()
    mlp(x_full, *w_full).backward(dy)

    queue = WeightGradQueue()
    x_def = x0.clone().requires_grad_()
    mlp(x_def, *w_def, weight_grad_queue=queue).backward(dy)
    # D ran: input grad present, weight grads pending
    assert torch.equal(x_def.grad, x_full.grad)
    assert all(p.grad is None for p in w_def) and len(queue) == 1
    assert queue.flush() == 1 and len(queue) == 0
    # the W pass repeats the full backward's chunk loop: bitwise the same grads
    for p, q in zip(w_def, w_full):
        assert torch.equal(p.grad, q.grad)


@pytest.mark.parametrize("activation", ["swiglu", "gelu"])
def test_w_accumulates_into_existing_grad_over_microbatches(device, activation):
    """Two micro-batches, D for both, then W: grads add to what .grad already held."""
    mlp = _mlp(activation, recompute=True, chunk=7)
    w = _weights(activation, torch.float32, device)
    ref = clone_leaves(w)
    for p in w:
        p.grad = torch.ones_like(p)
    queue = WeightGradQueue()
    xs = [torch.randn(20, H, device=device) for _ in range(2)]
    outs = [mlp(x, *w, weight_grad_queue=queue) for x in xs]
    for y in outs:
        (y * y).sum().backward()
    assert len(queue) == 2 and all(torch.equal(p.grad, torch.ones_like(p)) for p in w)
    queue.flush()
    for x in xs:
        (lambda y: (y * y).sum())(mlp(x, *ref)).backward()
    for p, q in zip(w, ref):
        assert rel_err(p.grad, q.grad + 1.0) < 1e-6


def test_context_and_module_queues(device):
    mlp = ChunkedSwiGLUMLP(H, F, chunk_size=8, device=device)
    x = torch.randn(17, H, device=device)
    queue = WeightGradQueue()
    assert current_weight_grad_queue() is None
    with defer_weight_grads(queue):
        assert current_weight_grad_queue() is queue
        y = mlp(x)
    assert current_weight_grad_queue() is None
    y.sum().backward()
    assert len(queue) == 1 and mlp.flush_weight_grads() == 0
    assert mlp.w2.weight.grad is None
    queue.flush()
    g_ctx = [p.grad.clone() for p in mlp.parameters()]

    mlp.zero_grad(set_to_none=True)
    mlp.deferred_wgrad = True
    mlp(x).sum().backward()
    assert mlp.w1.weight.grad is None and len(mlp.weight_grad_queue) == 1
    assert mlp.flush_weight_grads() == 1
    assert all(torch.equal(p.grad, g) for p, g in zip(mlp.parameters(), g_ctx))


def test_backward_on_another_thread_still_defers(device):
    """The queue travels with the graph (CUDA backward runs on an autograd worker thread)."""
    w = swiglu_weights(H, F, torch.float32, device)
    queue = WeightGradQueue()
    with defer_weight_grads(queue):
        y = chunked_swiglu_mlp(torch.randn(9, H, device=device), *w, chunk_size=4)
    t = threading.Thread(target=lambda: y.sum().backward())
    t.start()
    t.join()
    assert len(queue) == 1 and w[0].grad is None
    queue.flush()
    assert all(p.grad is not None for p in w)


def test_deferral_checks_and_no_grad(device):
    w = swiglu_weights(H, F, torch.float32, device)
    x = torch.randn(9, H, device=device)
    queue = WeightGradQueue()
    with pytest.raises(ValueError, match="leaf"):
        chunked_swiglu_mlp(x, w[0] * 1.0, w[1], w[2], weight_grad_queue=queue)
    with pytest.raises(TypeError, match="WeightGradQueue"):
        with defer_weight_grads([]):
            pass
    with torch.no_grad():
        chunked_swiglu_mlp(x, *w, weight_grad_queue=queue)
    assert len(queue) == 0
    y = chunked_swiglu_mlp(x, *w, weight_grad_queue=queue)
    y.sum().backward()
    assert queue.clear() == 1 and queue.flush() == 0 and w[0].grad is None


def test_gelu_frozen_bias_is_not_touched(device):
    w = gelu_weights(H, F, torch.float32, device)
    w[1].requires_grad_(False)
    queue = WeightGradQueue()
    chunked_gelu_mlp(torch.randn(11, H, device=device), *w, chunk_size=4,
                     weight_grad_queue=queue).sum().backward()
    queue.flush()
    assert w[1].grad is None and all(w[i].grad is not None for i in (0, 2, 3))


def test_w_pass_owns_its_output_grad(device):
    """A runtime may reuse its gradient receive buffer between D and W."""
    w = swiglu_weights(H, F, torch.float32, device)
    ref = clone_leaves(w)
    x = torch.randn(12, H, device=device)
    dy = torch.randn(12, H, device=device)
    queue = WeightGradQueue()
    chunked_swiglu_mlp(x, *w, chunk_size=5, weight_grad_queue=queue).backward(dy)
    chunked_swiglu_mlp(x, *ref, chunk_size=5).backward(dy)
    dy.fill_(7.0)  # the buffer is reused for the next micro-batch
    queue.flush()
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(w, ref))


def test_modules_copy_and_pickle_with_a_fresh_queue(device):
    mlp = ChunkedSwiGLUMLP(H, F, chunk_size=8, deferred_wgrad=True, device=device)
    mlp(torch.randn(5, H, device=device)).sum().backward()
    assert len(mlp.weight_grad_queue) == 1
    for clone in (copy.deepcopy(mlp), pickle.loads(pickle.dumps(mlp))):
        assert len(clone.weight_grad_queue) == 0 and clone.deferred_wgrad
        assert torch.equal(clone.w1.weight, mlp.w1.weight)
    assert len(mlp.weight_grad_queue) == 1
