"""HelixPipe's analysis model: per-part unit times and the paper's Table 2 bubble formulas.

``HelixPartsCost`` times the helix units (``pipert.schedules.helixpipe``) from three numbers per
layer, as the paper's analysis does: C(0) = ``t_pre``, C(l) = ``t_post + t_pre``, C(L) =
``t_post``, A(l) = ``t_attn``; a backward takes ``backward`` times its forward, plus one more
forward for C units with ``recompute`` (recomputation without attention reruns everything
but the attention). Like every cost model it prices one micro-batch of a whole compute; the
engine applies folds and sub-blocks (a quarter piece of a forward takes a quarter of its time). An activation message is 1 per micro-batch, a weight message
``weight_bytes``; memory is uniform.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..ir.action import Action, Op, Payload

__all__ = ["HelixPartsCost", "table2_bubble", "TABLE2_VARIANTS"]

TABLE2_VARIANTS = ("1f1b", "zb1p", "helix", "helix-2fold", "helix-2fold-recompute")


@dataclass(frozen=True)
class HelixPartsCost:
    """Helix unit times from per-layer part times (see the module doc)."""

    layers: int
    """L: the chain has 2L+1 units."""
    t_pre: float
    """Forward time of pre-attention (the part of C(l) that belongs to layer l)."""
    t_attn: float
    """Forward time of A(l)."""
    t_post: float
    """Forward time of post-attention (the part of C(l) that belongs to layer l-1)."""
    backward: float = 2.0
    """Backward time / forward time."""
    recompute: bool = False
    """C units recompute their forward inside their backward."""
    weight_bytes: float = 1.0
    """Size of a weight or weight-gradient message (activation messages: 1 per micro-batch)."""

    def forward_time(self, unit: int) -> float:
        l, is_attn = divmod(unit, 2)
        if is_attn:
            return self.t_attn
        return (self.t_pre if l < self.layers else 0.0) + (self.t_post if l > 0 else 0.0)

    def compute_time(self, action: Action, rank: int) -> float:
        if action.op is Op.F or action.op is Op.RECOMPUTE:
            k = 1.0
        elif action.op is Op.B:
            k = self.backward + (1.0 if self.recompute and action.unit % 2 == 0 else 0.0)
        else:
            return 0.0
        return k * self.forward_time(action.unit)

    def message_bytes(self, payload: Payload, unit: int, num_mbs: int = 1) -> float:
        return float(num_mbs) if payload in (Payload.ACT, Payload.GRAD) else self.weight_bytes

    def memory(self, kind: str, unit: int) -> float:
        return 1.0


def table2_bubble(variant: str, stages: int, layers: int, t_pre: float, t_attn: float, t_post: float) -> float:
    """The paper's Table 2 bubble time (backward = 2 x forward): for 1F1B and ZB1P per
    iteration, for HelixPipe per group of P·F micro-batches."""
    p, L, tl = stages, layers, t_pre + t_post
    formulas = {"1f1b": 3 * (p - 1) * (tl + t_attn) * L / p, "zb1p": (p - 1) * (tl + 3 * t_attn) * L / p,
                "helix": 3 * (p - 1) * tl, "helix-2fold": 6 * (p - 1) * tl, "helix-2fold-recompute": 8 * (p - 1) * tl}
    if variant not in formulas:
        raise ValueError(f"variant {variant!r} unknown; allowed: {', '.join(TABLE2_VARIANTS)}")
    return formulas[variant]
