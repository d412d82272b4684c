"""The TP shards of a built-in model against the whole model, on one batch (a check, not runtime).

``tp_layer_errors`` runs two units (embedding + layers, layers + head + loss) of a model cut to
this process's TP shard and of the whole model, forward and backward, and compares the loss and
every gradient (shards gathered to whole tensors). ``check_ranks`` is the body of one process of
a gloo job that does this for several cases and writes rank 0's results as JSON.
"""
from __future__ import annotations

import json
from typing import Any

import torch

from ..models import build_units
from ..models.tp import TensorParallel
from ..models.tpshard import gather_shards, shard_units
from .reference import rel_err

__all__ = ["tp_layer_errors", "check_ranks"]


def _grads(units: list) -> dict[str, torch.Tensor]:
    return {f"unit{i}.{n}": p.grad for i, u in enumerate(units) for n, p in u.named_parameters()}


def _loss(units: list, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, list]:
    """The loss of the chain of ``units`` on ``x``, and the shapes of what unit 0 passes on."""
    out = units[0](x)
    first = [list(t.shape) for t in (out if isinstance(out, tuple) else (out,))]
    for unit in units[1:-1]:
        out = unit(out)
    return units[-1](out, y), first


def tp_layer_errors(model: str, tp: TensorParallel, *, cut: str = "layers", batch: int = 2, seq: int = 8,
                    seed: int = 0, mlp_chunk: int = 0, mlp_recompute: bool = False) -> dict[str, Any]:
    """{"loss_err", "grad_err", "boundary"}: the loss's absolute error, the largest relative error
    of a gradient (``pipert.tools.reference.rel_err``), the shapes of what the first unit passes on
    (the local sequence shard under SP; q, k, v of the rank's heads). ``cut``: "layers" (two units),
    "fine" or "helix". ``mlp_chunk`` > 0: the chunked MLP of ``pipert.kernels`` (``mlp_recompute``
    its mode) in both models. Every member of ``tp.group`` must call this."""
    kw = {"dtype": "float64", "max_seq": seq, "seed": seed, "cut": cut}
    if mlp_chunk:
        kw.update(mlp_chunk=mlp_chunk, mlp_recompute=mlp_recompute)
    n = 2 if cut == "layers" else None
    whole, units = build_units(model, n, **kw), build_units(model, n, **kw)
    shard_units(units, tp)
    gen = torch.Generator().manual_seed(seed)
    x, y = (torch.randint(0, 256, (batch, seq), generator=gen) for _ in range(2))
    ref, _ = _loss(whole, x, y)
    ref.backward()
    loss, first = _loss(units, x, y)
    loss.backward()
    return {"loss_err": abs(loss.item() - ref.item()), "grad_err": rel_err(gather_shards(_grads(units), tp),
                                                                             _grads(whole)), "boundary": first}


def check_ranks(rank: int, world: int, cases: list[tuple], path: str) -> None:
    """One process of a gloo job of ``world`` = T processes: ``tp_layer_errors`` of every
    (model, sequence_parallel, cut[, mlp_chunk, mlp_recompute]) case; rank 0 writes
    [{case..., errors...}] to ``path``."""
    import torch.distributed as dist
    torch.set_num_threads(1)
    group = dist.new_group(list(range(world)))
    out = []
    for m, sp, cut, *mlp in cases:
        chunked = dict(zip(("mlp_chunk", "mlp_recompute"), mlp))
        errors = tp_layer_errors(m, TensorParallel(world, rank, group, sp), cut=cut, **chunked)
        out.append({"model": m, "sp": sp, "cut": cut, **chunked, **errors})
    if rank == 0:
        with open(path, "w") as f:
            json.dump(out, f)
