"""Saved-activation accounting: a meter over autograd's saved-tensor hooks, and the exact byte
formulas of the helix units (documented in docs/helixpipe.md, tested against the meter).

What a unit keeps for one micro-batch between its forward and its backward (its *stash*): the
distinct byte regions among

- the tensors autograd packs while the forward runs (``saved_tensors_hooks``),
- the op outputs cached by selective-recompute regions (``pipert.models.recompute``),
- the unit's input tensors (the runner keeps them for the input gradient and for
  recomputation; a checkpointed unit's region keeps them too), except relayed ones
  (``relays`` of ``pipert.exec.unit``: passed through, not kept),

parameters and module buffers excluded (they are weights, not activations). Two views of the
same bytes count once (``pipert.exec.stash.tensor_key``). What the unit returns is not
counted: it belongs to the next unit (or the transport) once sent.
"""
from __future__ import annotations

import contextlib
import weakref
from typing import Any, Hashable, Iterable, Iterator

import torch
from torch import Tensor

from ..device.tensors import tensor_key
from .gpt import GPTConfig
from .recompute import cached_tensors, collect_caches, recompute_save_set

__all__ = ["SavedBytesMeter", "helix_stash_bytes"]


class _Held:
    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor: Tensor) -> None:
        self.tensor = tensor


class SavedBytesMeter:
    """Live stash bytes per key (e.g. ``(unit, micro_batch)``), measured, not computed.

    ``exclude``: tensors whose storage never counts (the model's parameters and buffers).
    Use ``with meter.track(key, inputs):`` around a unit's forward; ``bytes(key)`` then gives
    what is still held for that key, dropping to 0 as backward frees the graph.
    """

    def __init__(self, exclude: Iterable[Tensor] = ()) -> None:
        self._excluded = {t.untyped_storage().data_ptr() for t in exclude}
        self._held: dict[Hashable, weakref.WeakSet] = {}
        self._inputs: dict[Hashable, list[weakref.ref]] = {}
        self._caches: dict[Hashable, list[dict]] = {}

    @contextlib.contextmanager
    def track(self, key: Hashable, inputs: Iterable[Tensor] = ()) -> Iterator[None]:
        held = self._held.setdefault(key, weakref.WeakSet())
        self._inputs.setdefault(key, []).extend(weakref.ref(t) for t in inputs)
        caches = self._caches.setdefault(key, [])

        def pack(t: Tensor) -> Any:
            if t.untyped_storage().data_ptr() in self._excluded:
                return t
            h = _Held(t)
            held.add(h)
            return h

        def unpack(h: Any) -> Tensor:
            return h.tensor if isinstance(h, _Held) else h

        with torch.autograd.graph.saved_tensors_hooks(pack, unpack), collect_caches(caches):
            yield

    def tensors(self, key: Hashable) -> list[Tensor]:
        """The live tensors held for ``key`` (saved, cached, inputs), parameters excluded."""
        out = [h.tensor for h in list(self._held.get(key, ()))]
        out += cached_tensors(self._caches.get(key, ()))
        out += [t for r in self._inputs.get(key, ()) if (t := r()) is not None]
        return [t for t in out if t.untyped_storage().data_ptr() not in self._excluded]

    def bytes(self, key: Hashable) -> int:
        """Distinct bytes held for ``key``."""
        return sum(k[3] for k in {tensor_key(t) for t in self.tensors(key)})

    def forget(self, key: Hashable) -> None:
        """Stop tracking ``key`` (e.g. after its backward)."""
        for d in (self._held, self._inputs, self._caches):
            d.pop(key, None)


def _mlp_ffn_saved(cfg: Any, tokens: int) -> int:
    """ffn-wide bytes the layer MLP saves beyond its input (which the norm already accounts)."""
    e = torch.empty((), dtype=cfg.torch_dtype).element_size()
    gpt = isinstance(cfg, GPTConfig)
    if cfg.mlp_chunk:
        from pipert.kernels import saved_activation_bytes
        full = saved_activation_bytes(tokens, cfg.hidden, cfg.ffn, cfg.torch_dtype,
                                      activation="gelu" if gpt else "swiglu", recompute=cfg.mlp_recompute)
        return full - tokens * cfg.hidden * e
    # plain MLP: GeLU keeps fc's output and gelu's output; SwiGLU keeps gate, silu(gate), up, product
    return (2 if gpt else 4) * tokens * cfg.ffn * e


def helix_stash_bytes(cfg: Any, unit: int, batch: int, seq: int, recompute: str = "none",
                      loss_in_backward: bool = False) -> int:
    """Exact stash bytes of helix unit ``unit`` (0..2L) for one micro-batch of ``batch`` x ``seq``
    tokens (float32 or float64 models; table and derivation in docs/helixpipe.md).

    N = batch*seq tokens, e bytes per element, r bytes per statistic (8 for float64, else 4:
    norm statistics and the attention logsumexp), h hidden, f ffn, V vocab, H heads, kv the
    key/value width (Hkv*d), F the MLP's ffn-wide saved bytes (``_mlp_ffn_saved``).
    ``loss_in_backward``: C(L)'s forward stops before the final norm and keeps that norm's input
    (``UnitRunner``), so no norm, head or loss tensors are kept until its backward.
    """
    n_units = 2 * cfg.layers + 1
    if not 0 <= unit < n_units:
        raise ValueError(f"unit {unit} is not a helix unit of a {cfg.layers}-layer model; allowed: 0..{n_units - 1}")
    if cfg.dtype not in ("float32", "float64"):
        raise ValueError(f"helix_stash_bytes covers float32 and float64 models, got dtype={cfg.dtype!r}")
    save = recompute_save_set(recompute)
    gpt = isinstance(cfg, GPTConfig)
    N, h, f = batch * seq, cfg.hidden, cfg.ffn
    e = torch.empty((), dtype=cfg.torch_dtype).element_size()
    r = 8 if e == 8 else 4
    lse = batch * cfg.heads * seq * r
    first, last, attn = unit == 0, unit == n_units - 1, unit % 2 == 1
    tokens = 8 * N  # int64 token ids (first unit) or targets (last unit)
    head_input = N * h * e if last and loss_in_backward else 0
    if save is not None:  # checkpointed: inputs, plus attention output and lse where kept
        if attn:  # h (x is relayed, not kept)
            kept = N * h * e + lse if "attention" in save else 0
            return N * h * e + kept
        return tokens if first else 2 * N * h * e + (tokens + head_input if last else 0)
    if attn:  # h, q, k, v, attention output, lse (x is relayed, not kept)
        kv = cfg.kv_heads * cfg.head_dim
        return 3 * N * h * e + 2 * N * kv * e + lse if not gpt else 5 * N * h * e + lse
    # LLaMA RMSNorm keeps its input, the normalised value and one statistic per token;
    # GPT LayerNorm keeps its input and two statistics per token (mean, rstd)
    norm = (N * h * e + 2 * N * r) if gpt else (2 * N * h * e + N * r)
    if first:  # token ids, embedding output into attn_norm(0)
        return tokens + norm
    post = 2 * N * h * e + norm + N * h * e + _mlp_ffn_saved(cfg, N)  # x, o; mlp_norm; its output; MLP
    if not last:
        return post + norm  # attn_norm(l)
    if loss_in_backward:
        return post + head_input + tokens
    # final norm, its output (head input), log-softmax [N, V], targets, CE's total weight
    return post + norm + N * h * e + N * cfg.vocab * e + tokens + e
