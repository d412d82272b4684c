"""Selective recomputation per operation inside a unit, with PyTorch's selective activation
checkpointing (``torch.utils.checkpoint`` + ``create_selective_checkpoint_contexts``).

``selective_recompute(unit, save)`` makes the unit's forward a non-reentrant checkpoint whose
policy keeps the outputs of the aten ops named in ``save`` and recomputes every other op during
the backward (norms, activations, element-wise products, ...). Names are aten op names
(``"mm"``, ``"silu"``, ``"rsqrt"``) or the groups of :data:`OP_GROUPS`. The unit's parameters and
their names are unchanged, so pipelined runs compare with the reference as before; the result is
exactly the forward without checkpointing (the recomputed ops run on the same inputs).

Invariant: the unit's inputs are saved (the checkpoint needs them to recompute), so every stash
still holds at least its inputs; what the policy saves lives in the checkpoint's cache.
"""
from __future__ import annotations

import functools
from typing import Any, Iterable

import torch
from torch import nn

__all__ = ["OP_GROUPS", "selective_recompute", "resolve_ops"]

OP_GROUPS: dict[str, frozenset[str]] = {
    "projections": frozenset({"mm", "addmm", "bmm", "linear"}),
    "attention": frozenset({"_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_for_cpu",
                            "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
                            "scaled_dot_product_attention"}),
    "norms": frozenset({"pow", "mean", "rsqrt", "native_layer_norm", "_fused_rms_norm"}),
    "activations": frozenset({"silu", "gelu", "relu"}),
}
"""Named groups of aten ops (``save={"projections", "attention"}`` recomputes the rest)."""


def resolve_ops(save: Iterable[str]) -> frozenset[str]:
    """Aten op names of ``save`` (groups expanded); unknown names are an error naming them."""
    out: set[str] = set()
    bad = []
    for name in save:
        if name in OP_GROUPS:
            out |= OP_GROUPS[name]
        elif hasattr(torch.ops.aten, name):
            out.add(name)
        else:
            bad.append(name)
    if bad:
        raise ValueError(f"selective recompute: unknown op(s) {bad}; allowed: aten op names (e.g. mm, silu) or "
                         f"the groups {', '.join(sorted(OP_GROUPS))}")
    return frozenset(out)


def _policy(save: frozenset[str], ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
    from torch.utils.checkpoint import CheckpointPolicy
    name = getattr(getattr(op, "overloadpacket", op), "__name__", str(op))
    return CheckpointPolicy.MUST_SAVE if name in save else CheckpointPolicy.PREFER_RECOMPUTE


class _Checkpointed:
    """The unit's own forward run as a selective checkpoint (picklable and deep-copyable: the
    bound forward follows the module it is copied with)."""

    def __init__(self, forward: Any, save: frozenset[str]) -> None:
        self.forward = forward
        self.save = save

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts
        if not torch.is_grad_enabled():  # nothing is saved: nothing to recompute
            return self.forward(*args, **kwargs)
        context = functools.partial(create_selective_checkpoint_contexts, functools.partial(_policy, self.save))
        return checkpoint(self.forward, *args, use_reentrant=False, context_fn=context, **kwargs)


def selective_recompute(unit: nn.Module, save: Iterable[str]) -> nn.Module:
    """``unit`` with its forward selectively recomputed (module doc); returns the same module."""
    ops = resolve_ops(save)
    forward = unit.forward.forward if isinstance(unit.forward, _Checkpointed) else unit.forward
    unit.forward = _Checkpointed(forward, ops)
    return unit
