"""Tensor and sequence parallelism (Megatron-style) inside the built-in models' units.

A TP group of T processes computes one pipeline rank's units together. Each holds a shard of
the sharded parameters (``pipert.models.tpshard``) as a plain local tensor: the pipeline's
executor flattens parameters into ZeRO shards and moves them as plain tensors, which a
``DTensor`` of ``torch.distributed.tensor.parallel`` would not survive, so the layers here
call torch's functional collectives (``torch.distributed._functional_collectives``, which
also give the right shapes on the meta device, where pipert infers boundary shapes) inside
four small autograd functions, the conjugate pairs of Megatron-LM:

=================  ================================  ==================================
 function          forward                           backward
=================  ================================  ==================================
 ``enter`` no SP   identity (input replicated)       all-reduce of the input gradient
 ``leave`` no SP   all-reduce of partial sums         identity
 ``enter`` SP      all-gather along the sequence     reduce-scatter along the sequence
 ``leave`` SP      reduce-scatter along the sequence  all-gather along the sequence
=================  ================================  ==================================

``enter`` stands before the column-parallel layers (wq/wk/wv, w1/w3, fc, the LM head),
``leave`` after the row-parallel ones (wo, w2, proj) and the vocabulary-parallel embedding.
Between a ``leave`` and the next ``enter`` (norms, residuals, the pipeline boundary) the
activation is replicated (no SP) or the local sequence shard ``[b, s/T, hidden]`` (SP).

Invariant: every member of a TP group runs the same computes in the same order, so the
collectives of one group are posted in the same order on every member (NCCL's rule).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["TensorParallel", "enter", "leave", "row_linear", "vocab_embed", "seq_shard", "vocab_parallel_loss",
           "all_reduce_grad"]

SEQ_DIM = 1
"""Hidden states are ``[batch, seq, hidden]``: sequence parallelism splits dim 1."""


@dataclass(frozen=True)
class TensorParallel:
    """Where this process stands in its TP group."""

    size: int = 1
    """T: processes sharing one pipeline rank's computes."""
    rank: int = 0
    """This process's index in its TP group (its tp coordinate)."""
    group: Any = None
    """The TP group's ProcessGroup; None for shapes only (units that never run)."""
    sequence_parallel: bool = False
    """Keep norms, residuals and stage boundaries split along the sequence."""

    def __post_init__(self) -> None:
        if self.size < 1 or not 0 <= self.rank < self.size:
            raise ValueError(f"TensorParallel: rank {self.rank} of size {self.size}; allowed: size >= 1, "
                             f"0 <= rank < size")


def _wait(t: Tensor) -> Tensor:
    return funcol.wait_tensor(t) if not t.is_meta else t


def _all_reduce(x: Tensor, tp: TensorParallel, op: str = "sum") -> Tensor:
    return _wait(funcol.all_reduce(x.contiguous(), op, tp.group))


def _gather(x: Tensor, tp: TensorParallel, dim: int) -> Tensor:
    return _wait(funcol.all_gather_single(x.contiguous(), dim, tp.group))


def _scatter(x: Tensor, tp: TensorParallel, dim: int) -> Tensor:
    return _wait(funcol.reduce_scatter_single(x.contiguous(), "sum", dim, tp.group))


def _same(x: Tensor, tp: TensorParallel) -> Tensor:
    return x.view_as(x)


def _sum(x: Tensor, tp: TensorParallel) -> Tensor:
    return _all_reduce(x, tp)


def _gather_seq(x: Tensor, tp: TensorParallel) -> Tensor:
    return _gather(x, tp, SEQ_DIM)


def _scatter_seq(x: Tensor, tp: TensorParallel) -> Tensor:
    return _scatter(x, tp, SEQ_DIM)


class _Conjugate(torch.autograd.Function):
    """``fwd(x)`` forward and the conjugate ``bwd(g)`` backward (the pairs of the module doc)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, tp: TensorParallel, fwd: Callable, bwd: Callable) -> Tensor:
        ctx.tp, ctx.bwd = tp, bwd
        return fwd(x, tp)

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple:
        return ctx.bwd(g, ctx.tp), None, None, None


def enter(tp: TensorParallel | None, x: Tensor) -> Tensor:
    """The full input of a column-parallel layer: ``x`` itself (its gradient all-reduced over the
    group), or under SP the sequence gathered from the group's shards."""
    if tp is None or tp.size == 1:
        return x
    pair = (_gather_seq, _scatter_seq) if tp.sequence_parallel else (_same, _sum)
    return _Conjugate.apply(x, tp, *pair)


def leave(tp: TensorParallel | None, x: Tensor) -> Tensor:
    """The sum over the group of partial results ``x``: replicated, or under SP this rank's
    sequence shard of it."""
    if tp is None or tp.size == 1:
        return x
    pair = (_scatter_seq, _gather_seq) if tp.sequence_parallel else (_sum, _same)
    return _Conjugate.apply(x, tp, *pair)


def row_linear(tp: TensorParallel | None, lin: nn.Linear, x: Tensor) -> Tensor:
    """A row-parallel ``lin`` (weight ``[out, in/T]``) of the local columns ``x``; its bias is
    replicated and added once, after the sum."""
    if tp is None or tp.size == 1:
        return lin(x)
    y = leave(tp, F.linear(x, lin.weight))
    return y if lin.bias is None else y + lin.bias


def vocab_embed(tp: TensorParallel | None, tokens: Tensor, embed: nn.Embedding) -> Tensor:
    """Token embedding with the vocabulary split over the group: each rank looks up the tokens in
    its rows (zeros for the others), ``leave`` sums them."""
    if tp is None or tp.size == 1:
        return embed(tokens)
    rows = embed.weight.shape[0]
    local = tokens - tp.rank * rows
    outside = (local < 0) | (local >= rows)
    x = F.embedding(local.masked_fill(outside, 0), embed.weight)
    return leave(tp, x.masked_fill(outside.unsqueeze(-1), 0.0))


def seq_shard(tp: TensorParallel | None, x: Tensor, dim: int) -> Tensor:
    """This rank's slice of ``x`` along ``dim`` under SP (``x`` itself otherwise)."""
    if tp is None or tp.size == 1 or not tp.sequence_parallel:
        return x
    return x.chunk(tp.size, dim)[tp.rank]


class _VocabParallelCE(torch.autograd.Function):
    """Token-mean cross-entropy of logits split along the vocabulary (``[N, V/T]`` per rank):
    max, sum of exponentials and the target's logit are all-reduced; the gradient is local."""

    @staticmethod
    def forward(ctx: Any, logits: Tensor, targets: Tensor, tp: TensorParallel) -> Tensor:
        cols = logits.shape[-1]
        m = _all_reduce(logits.detach().amax(-1), tp, "max")
        shifted = logits - m.unsqueeze(-1)
        e = shifted.exp()
        total = _all_reduce(e.sum(-1), tp)
        local = targets - tp.rank * cols
        inside = (local >= 0) & (local < cols)
        idx = local.clamp(0, cols - 1)
        picked = shifted.gather(-1, idx.unsqueeze(-1)).squeeze(-1).masked_fill(~inside, 0.0)
        picked = _all_reduce(picked, tp)
        ctx.save_for_backward(e.div_(total.unsqueeze(-1)), idx, inside)
        return (total.log() - picked).mean()

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple:
        softmax, idx, inside = ctx.saved_tensors
        grad = softmax.clone()
        grad.scatter_add_(-1, idx.unsqueeze(-1), -inside.to(grad.dtype).unsqueeze(-1))
        return grad.mul_(g / grad.shape[0]), None, None


def vocab_parallel_loss(tp: TensorParallel, h: Tensor, head_weight: Tensor, targets: Tensor | None) -> Tensor:
    """The LM head (``head_weight``: ``[V/T, hidden]``) on normalised ``h`` and, with ``targets``,
    the token-mean cross-entropy over the whole vocabulary (the same value on every member);
    without targets the logits gathered to the whole vocabulary."""
    logits = F.linear(enter(tp, h), head_weight)
    if targets is None:
        return _gather(logits, tp, logits.dim() - 1)
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    return _VocabParallelCE.apply(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), tp)


def all_reduce_grad(tp: TensorParallel):
    """A tensor hook summing a replicated parameter's gradient over the group (SP: each rank's
    gradient covers its sequence shard only)."""
    def hook(g: Tensor) -> Tensor:
        return _all_reduce(g, tp)
    return hook
