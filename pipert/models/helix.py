"""The HelixPipe cut: 2L+1 units ``[C(0), A(0), C(1), A(1), ..., C(L-1), A(L-1), C(L)]``.

    C(0)             tokens [b,s]             -> (x, h)      embedding (+ positions), attn_norm(0)
    A(l)             (x, h)                   -> (x, o)      wq/wk/wv (+ rotary), causal attention
    C(l), 0<l<L      (x, o)                   -> (x', h')    post(l-1) = wo, residual add, mlp_norm,
                                                             MLP, residual add; pre(l) = attn_norm(l)
    C(L)             ((x, o), targets)        -> loss        post(L-1), final norm, head, loss

``x`` is the residual stream ``[b,s,hidden]``, ``h = attn_norm(x)`` the normalised input of
attention, ``o = attention(q, k, v)`` ``[b,s,hidden]`` before the output projection. A(l)
relays ``x`` unchanged (the paper's residual relay through the attention stage), so each
unit takes exactly what its predecessor returns; A(l) declares the relay (``relays``), so the
attention stage keeps no copy of ``x`` between forward and backward.

With tensor parallelism (``pipert.models.tpshard``) A(l) holds its TP rank's heads: it enters the
group (under SP: gathers ``h`` along the sequence) and returns ``o`` of its heads only (1/T of the
bytes); C(l+1)'s row-parallel ``wo`` sums the heads; ``x`` and ``h`` are replicated, or under SP
the local sequence shard.

Parameters: C(l) owns the parameters of post(l-1) and pre(l); A(l) holds the QKV projection
of layer l. A schedule keeps A(l)'s weights on the rank of C(l) and moves them to wherever
A(l) runs as a weight payload (their gradient comes back the same way); the model side
only fixes which unit the weights belong to.
"""
from __future__ import annotations

from torch import Tensor, nn

from .common import DecoderModel, attention_core, embed_input, project_qkv
from .tp import enter, row_linear
from .unitbase import QKV, ModelUnit

__all__ = ["HelixUnit", "HelixAttentionUnit", "helix_units"]


def _post_part(layer: nn.Module) -> nn.Module:
    part = nn.Module()
    part.attn = nn.Module()
    part.attn.wo = layer.attn.wo
    part.mlp_norm, part.mlp = layer.mlp_norm, layer.mlp
    return part


def _pre_part(layer: nn.Module) -> nn.Module:
    part = nn.Module()
    part.attn_norm = layer.attn_norm
    return part


class HelixUnit(ModelUnit):
    """C(l): ``post(l-1)`` (for l > 0) then ``pre(l)`` (for l < L); the embedding for l = 0,
    the final norm, head and loss for l = L."""

    kind = "helix_param"

    def __init__(self, model: DecoderModel, layer: int) -> None:
        super().__init__()
        n = len(model.layers)
        if not 0 <= layer <= n:
            raise ValueError(f"C({layer}) does not exist in a {n}-layer model; allowed: 0..{n}")
        self.layer_index, self.is_last = layer, layer == n
        self.embed = model.embed if layer == 0 else None
        self.pos = model.pos if layer == 0 else None
        parts = {}
        if layer > 0:
            parts[str(layer - 1)] = _post_part(model.layers[layer - 1])
        if layer < n:
            parts[str(layer)] = _pre_part(model.layers[layer])
        self.layers = nn.ModuleDict(parts)
        self.norm = model.norm if self.is_last else None
        self.head = model.head if self.is_last else None

    def body(self, xs: Tensor | tuple[Tensor, Tensor], targets: Tensor | None = None):
        x = self.trunk(xs)
        if self.is_last:
            return self.head_loss(x, targets)
        return x, self.layers[str(self.layer_index)].attn_norm(x)

    def trunk(self, xs: Tensor | tuple[Tensor, Tensor]) -> Tensor:
        """The residual stream after the embedding (C(0)) or after post(l-1)."""
        l = self.layer_index
        if l == 0:
            return embed_input(xs, self.embed, self.pos, self.tp)
        x, o = xs
        post = self.layers[str(l - 1)]
        x = x + row_linear(self.tp, post.attn.wo, o)
        return x + post.mlp(post.mlp_norm(x))


class HelixAttentionUnit(ModelUnit):
    """A(l): ``(x, h) -> (x, attention(qkv(h)))``; holds layer l's q/k/v projections.

    ``x`` is relayed (``relays``: input 0 is output 0, untouched): neither the runner nor a
    recompute region keeps it; only ``h -> o`` is the unit's computation."""

    kind = "helix_attn"
    relays = {0: 0}

    def __init__(self, model: DecoderModel, layer: int) -> None:
        super().__init__()
        part = nn.Module()
        part.attn = QKV(model.layers[layer].attn)
        self.layers = nn.ModuleDict({str(layer): part})
        self.layer_index = layer

    def forward(self, xs: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        x, h = xs
        return x, self.run_body(h)

    def body(self, h: Tensor) -> Tensor:
        qkv = self.layers[str(self.layer_index)].attn
        return attention_core(*project_qkv(qkv, enter(self.tp, h), qkv.heads, qkv.kv_heads))


def helix_units(model: DecoderModel) -> list[nn.Module]:
    """``[C(0), A(0), ..., C(L-1), A(L-1), C(L)]`` of ``model`` (sharing its parameters)."""
    n = len(model.layers)
    units: list[nn.Module] = []
    for l in range(n):
        units += [HelixUnit(model, l), HelixAttentionUnit(model, l)]
    return units + [HelixUnit(model, n)]
