"""What every unit of a built-in model shares: recomputation by mode, the q/k/v view, the loss."""
from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from .common import final_logits, lm_loss
from .tp import TensorParallel, vocab_parallel_loss
from .recompute import selective_checkpoint

__all__ = ["ModelUnit", "QKV", "final_loss"]


class ModelUnit(nn.Module):
    """A unit whose ``forward`` runs ``body``; with ``save_ops`` set (a set of op groups of
    ``pipert.models.recompute``; ``partition(recompute=...)`` sets it) the body runs under
    selective checkpointing: only the inputs and the outputs of those ops are kept."""

    save_ops: frozenset[str] | None = None
    tp: TensorParallel | None = None
    """This process's place in its TP group (``pipert.models.tpshard.shard_units`` sets it)."""

    def body(self, *args: Any) -> Any:
        raise NotImplementedError

    def run_body(self, *args: Any) -> Any:
        """``body(*args)``, under selective checkpointing when ``save_ops`` is set."""
        return self._region(self.body, *args)

    def _region(self, fn: Any, *args: Any) -> Any:
        if self.save_ops is None:
            return fn(*args)
        return selective_checkpoint(fn, *args, save=self.save_ops)

    def forward(self, *args: Any) -> Any:
        return self.run_body(*args)

    # The unit that holds the head: ``body(x, targets) == head_loss(trunk(x), targets)``.
    def trunk(self, *args: Any) -> Tensor:
        """The head holder's body up to the final norm's input (the residual stream)."""
        raise NotImplementedError(f"{type(self).__name__} holds no LM head")

    def forward_trunk(self, *args: Any) -> Tensor:
        """F of a head holder whose loss runs in its backward: :meth:`trunk`, recomputed as the
        unit's forward is (under selective checkpointing when ``save_ops`` is set)."""
        return self._region(self.trunk, *args)

    def head_loss(self, x: Tensor, targets: Tensor | None) -> Tensor:
        """Final norm, LM head and (with ``targets``) the cross-entropy of the residual stream ``x``;
        a tied head reads the embedding's weight."""
        head = getattr(self, "head", None)
        w = head.weight if head is not None else self.embed.weight
        return final_loss(x, self.norm, w, targets, self.tp)


class QKV(nn.Module):
    """The q/k/v projections and rotary tables of one attention module (shared, not copied)."""

    def __init__(self, attn: nn.Module) -> None:
        super().__init__()
        self.wq, self.wk, self.wv, self.rope = attn.wq, attn.wk, attn.wv, attn.rope
        self.heads, self.kv_heads = attn.heads, attn.kv_heads


def final_loss(x: Tensor, norm: nn.Module, head_weight: Tensor, targets: Tensor | None,
               tp: TensorParallel | None = None) -> Tensor:
    """Final norm, LM head and (with ``targets``) the token-mean cross-entropy; with ``tp`` the
    head is vocabulary-parallel and so is the cross-entropy."""
    if tp is not None and tp.size > 1:
        return vocab_parallel_loss(tp, norm(x), head_weight, targets)
    logits = final_logits(x, norm, head_weight)
    return logits if targets is None else lm_loss(logits, targets)
