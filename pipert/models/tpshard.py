"""Cutting the built-in models' units into tensor-parallel shards, and putting shards back together.

Which parameter is split along which dimension (names keep the whole model's; each TP rank
holds the slice ``rank`` of ``T`` equal slices):

- column-parallel (dim 0 of weight and bias): ``attn.wq``, ``attn.wk``, ``attn.wv`` (whole heads),
  ``mlp.w1``, ``mlp.w3`` (LLaMA), ``mlp.fc`` (GPT);
- row-parallel (dim 1 of the weight; the bias replicated): ``attn.wo``, ``mlp.w2``, ``mlp.proj``;
- vocabulary-parallel (dim 0): ``embed.weight``, ``head.weight``;
- replicated: norms, row-parallel biases, ``pos.weight``.

A replicated parameter gets the same gradient on every TP rank without SP (its activations and
their gradients are replicated); under SP each rank's gradient covers its sequence shard only,
so a tensor hook sums it over the group before it is accumulated
(``pipert.models.tp.all_reduce_grad``): the replicas stay equal after every optimizer step.
"""
from __future__ import annotations

from typing import Any, Iterable

import torch
from torch import Tensor, nn

from .common import Attention
from .unitbase import QKV
from .tp import TensorParallel, all_reduce_grad

__all__ = ["shard_dim", "shard_units", "check_tp_sizes", "gather_shards", "tp_divisors", "TP_KINDS"]

TP_KINDS = ("layers", "pre_attn", "attn", "post_attn", "helix_param", "helix_attn")
"""Units that shard: those of every cut of a built-in model (``pipert.models.partition``)."""
_COLUMN = ("attn.wq.", "attn.wk.", "attn.wv.", "mlp.w1.", "mlp.w3.", "mlp.fc.")
_ROW = ("attn.wo.weight", "mlp.w2.weight", "mlp.proj.weight")
_VOCAB = ("embed.weight", "head.weight")


def shard_dim(name: str) -> int | None:
    """The dimension parameter ``name`` (a model or ``unit{u}.`` name) is split along; None: replicated."""
    dotted = "." + name
    if any(f".{c}" in dotted for c in _COLUMN):
        return 0
    if dotted.endswith(tuple("." + r for r in _ROW)):
        return 1
    if dotted.endswith(tuple("." + v for v in _VOCAB)):
        return 0
    return None


def tp_divisors(sizes: dict[str, int]) -> list[int]:
    """Every T that divides all of ``sizes``."""
    limit = min(sizes.values())
    return [t for t in range(1, limit + 1) if all(v % t == 0 for v in sizes.values())]


def check_tp_sizes(cfg: Any, tp: int, seq: int | None = None, flag: str = "--tp") -> None:
    """ValueError unless ``tp`` divides the model's heads, kv_heads, ffn and vocab (and, with
    ``seq`` given for sequence parallelism, the sequence length)."""
    sizes = {"heads": cfg.heads, "kv_heads": cfg.kv_heads, "ffn": cfg.ffn, "vocab": cfg.vocab}
    if seq is not None:
        sizes["seq"] = seq
    bad = [f"{k}={v}" for k, v in sizes.items() if v % tp]
    if bad:
        raise ValueError(f"{flag} {tp} must divide {', '.join(bad)} ({'sequence-parallel, ' if seq else ''}"
                         f"{type(cfg).__name__}); allowed {flag}: {', '.join(map(str, tp_divisors(sizes)))}")


def _slice(p: nn.Parameter, dim: int, tp: TensorParallel) -> None:
    """Replace ``p``'s data by its slice ``tp.rank`` of ``tp.size`` along ``dim`` (same Parameter
    object: units sharing it with the model see the shard)."""
    n = p.shape[dim] // tp.size
    if p.is_meta:
        shape = list(p.shape)
        shape[dim] = n
        p.data = torch.empty(shape, dtype=p.dtype, device="meta")
    else:
        p.data = p.data.narrow(dim, tp.rank * n, n).clone()


def shard_units(units: Iterable[nn.Module], tp: TensorParallel) -> None:
    """Make the units of a built-in model (cut into chunks of layers) this rank's TP shards, in
    place: parameters sliced (``shard_dim``), attention modules counting local heads, every
    module that runs a collective given ``tp``; under SP, replicated parameters' gradients
    summed over the group. Units on the meta device get the shapes of the shards."""
    if tp.size == 1:
        return
    for u, unit in enumerate(units):
        if getattr(unit, "kind", None) not in TP_KINDS:
            raise ValueError(f"tensor parallelism shards the units of a built-in model; unit {u} is "
                             f"{getattr(unit, 'kind', type(unit).__name__)!r} (allowed: {', '.join(TP_KINDS)})")
        if unit.tp is not None:
            raise ValueError(f"unit {u} is a TP shard already (of {unit.tp.size}); shard a unit once")
        unit.tp = tp
        for name, m in unit.named_modules():
            if name.endswith("mlp") and not hasattr(type(m), "tp"):
                raise ValueError(f"unit {u}: the MLP {type(m).__name__} has no tensor-parallel form (a `tp` "
                                 f"attribute); allowed: the built-in MLPs, plain or chunked (mlp_chunk)")
            if isinstance(m, (Attention, QKV)):
                m.heads, m.kv_heads = m.heads // tp.size, m.kv_heads // tp.size
            if hasattr(type(m), "tp"):
                m.tp = tp
        for name, p in unit.named_parameters():
            dim = shard_dim(name)
            if dim is not None:
                _slice(p, dim, tp)
            elif tp.sequence_parallel and not p.is_meta and tp.group is not None:
                p.register_hook(all_reduce_grad(tp))


def gather_shards(named: dict[str, Tensor], tp: TensorParallel) -> dict[str, Tensor]:
    """Whole tensors from this rank's shards ``named`` (by ``shard_dim`` of each name), gathered
    over the TP group in sorted name order (every member must call this with the same names);
    replicated ones as they are."""
    import torch.distributed as dist
    if tp.size == 1:
        return dict(named)
    out = {}
    for name in sorted(named):
        t, dim = named[name], shard_dim(name)
        if dim is None:
            out[name] = t
            continue
        parts = [torch.empty_like(t) for _ in range(tp.size)]
        dist.all_gather(parts, t.contiguous(), group=tp.group)
        out[name] = torch.cat(parts, dim)
    return out
