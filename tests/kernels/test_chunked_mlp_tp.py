"""The chunked MLP on TP shards in one process (a gloo group of one rank): the same values and
gradients as the unchunked MLP, the communication buffers allocated once and reused, only the
input shard saved, deferred weight gradients, meta shapes. Two ranks: tests/multiproc/test_tp_gloo.py."""
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import torch.distributed as dist

from mlp_testutil import clone_leaves, gelu_weights, rel_err, swiglu_weights
from pipert.kernels import (WeightGradQueue, gelu_mlp_reference, swiglu_mlp_reference,
                            tp_chunked_gelu_mlp, tp_chunked_swiglu_mlp)
from pipert.kernels.chunked_tp import _pool, comm_buffer

H, F, TOL = 16, 24, 1e-12


@dataclass(frozen=True)
class Group:
    size: int
    group: Any
    sequence_parallel: bool


@pytest.fixture
def one_rank(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    _pool.buffers = {}
    yield dist.group.WORLD
    dist.destroy_process_group()


def _run(activation, x, w, tp, chunk, recompute, **kw):
    if activation == "swiglu":
        return tp_chunked_swiglu_mlp(x, *w, tp, chunk_size=chunk, recompute=recompute, **kw)
    return tp_chunked_gelu_mlp(x, *w, tp, approximate="tanh", chunk_size=chunk, recompute=recompute, **kw)


def _reference(activation, x, w):
    if activation == "swiglu":
        return swiglu_mlp_reference(x, *w)
    return gelu_mlp_reference(x, *w, approximate="tanh")


def _weights(activation):
    fn = swiglu_weights if activation == "swiglu" else gelu_weights
    return fn(H, F, torch.float64, torch.device("cpu"))


@pytest.mark.parametrize("activation", ["swiglu", "gelu"])
@pytest.mark.parametrize("recompute", [False, True], ids=["saved", "recompute"])
@pytest.mark.parametrize("sp", [False, True], ids=["tp", "sp"])
def test_matches_the_unchunked_mlp_and_reuses_three_buffers(one_rank, activation, recompute, sp):
    tp = Group(1, one_rank, sp)
    w = _weights(activation)
    w_ref = clone_leaves(w)
    for step in range(2):  # the second call runs in the buffers of the first
        x = torch.randn(2, 11, H, dtype=torch.float64, requires_grad=True)
        x_ref = x.detach().clone().requires_grad_()
        dy = torch.randn(2, 11, H, dtype=torch.float64)
        y = _run(activation, x, w, tp, 4, recompute)  # 22 rows: chunks of 4, 4, 4, 4, 4, 2
        y_ref = _reference(activation, x_ref, w_ref)
        assert rel_err(y, y_ref) <= TOL
        y.backward(dy)
        y_ref.backward(dy)
        assert rel_err(x.grad, x_ref.grad) <= TOL
        for p, q in zip(w, w_ref):
            if p is not None:
                assert rel_err(p.grad, q.grad) <= TOL, step
        buffers = dict(_pool.buffers)
        # SP: gathered input, gathered output gradient, and the reduced output / input gradient
        assert sorted(k[0] for k in buffers) == (["gathered", "gathered_grad", "reduced"] if sp else [])
        if step == 0:
            first = {k: b.data_ptr() for k, b in buffers.items()}
    assert {k: b.data_ptr() for k, b in _pool.buffers.items()} == first


def test_comm_buffer_is_one_per_role_shape_and_dtype(one_rank):
    like = torch.empty(3, 8)
    a = comm_buffer("gathered", 6, like)
    assert a.shape == (6, 8) and comm_buffer("gathered", 6, like) is a
    assert comm_buffer("reduced", 6, like) is not a and comm_buffer("gathered", 4, like) is not a
    assert comm_buffer("gathered", 6, like.double()).dtype == torch.float64


@pytest.mark.parametrize("activation", ["swiglu", "gelu"])
def test_saves_only_the_input_shard_in_recompute_mode(one_rank, activation):
    """Under SP the input saved for backward is this rank's shard (re-gathered in backward), not
    the gathered sequence; recompute mode saves nothing else besides the weights."""
    w = _weights(activation)
    x = torch.randn(2, 5, H, dtype=torch.float64, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        _run(activation, x, w, Group(1, one_rank, True), 3, True)
    ids = {id(p) for p in w if p is not None}
    activations = [t for t in saved if id(t) not in ids]
    assert [tuple(t.shape) for t in activations] == [(10, H)]
    assert activations[0].data_ptr() == x.data_ptr()


@pytest.mark.parametrize("activation", ["swiglu", "gelu"])
@pytest.mark.parametrize("sp", [False, True], ids=["tp", "sp"])
def test_deferred_weight_grads_gather_again_in_the_w_pass(one_rank, activation, sp):
    tp = Group(1, one_rank, sp)
    w_full = _weights(activation)
    w_def = clone_leaves(w_full)
    x0, dy = torch.randn(3, 7, H, dtype=torch.float64), torch.randn(3, 7, H, dtype=torch.float64)
    x_full, x_def = x0.clone().requires_grad_(), x0.clone().requires_grad_()
    _run(activation, x_full, w_full, tp, 5, False).backward(dy)
    queue = WeightGradQueue()
    _run(activation, x_def, w_def, tp, 5, False, weight_grad_queue=queue).backward(dy)
    assert rel_err(x_def.grad, x_full.grad) <= TOL
    # proj's bias is outside the chunked function: autograd gives its gradient in D
    assert all(p.grad is None for p in w_def[:3] if p is not None) and len(queue) == 1
    queue.flush()
    for p, q in zip(w_def, w_full):
        if p is not None:
            assert rel_err(p.grad, q.grad) <= TOL


def test_meta_input_gives_the_shape_and_a_group_is_required():
    w = [p.detach().to("meta") for p in _weights("swiglu")]
    x = torch.empty(2, 4, H, device="meta")
    y = tp_chunked_swiglu_mlp(x, *[p.float() for p in w], Group(2, None, True), chunk_size=3)
    assert y.shape == x.shape and y.is_meta
    with pytest.raises(ValueError, match="tp of size 2 has no process group"):
        tp_chunked_swiglu_mlp(torch.randn(2, 4, H), *[torch.randn(p.shape) for p in w], Group(2, None, True))
