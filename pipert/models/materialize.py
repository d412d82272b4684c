"""Units of a LLaMA model built without memory; only the ones a process needs get real tensors.

``build_units`` constructs the whole model under ``torch.device("meta")`` (parameters and
buffers have shapes and dtypes but no storage), cuts it into units (``partition``), and
materialises the units named in ``keep``: ``Module.to_empty`` allocates them on ``device``
and ``init_parameters`` gives every parameter the value it has in a full
``LlamaModel``/``GPTModel(cfg, seed=seed)`` built in one process - bit for bit, since each parameter is
drawn from its own generator seeded by its name (``pipert.models.llama.param_seed``). The
other units stay on the meta device: a pipeline rank passes them to ``Pipeline`` as they are
(shape inference only), so a model larger than one process's memory can start as long as
each rank's own units fit.
"""
from __future__ import annotations

from typing import Callable, Iterable

import torch
from torch import nn

from .common import init_parameters
from .partition import partition
from .zoo import ModelConfig, model_config, model_from_config

__all__ = ["build_units", "materialize"]


def materialize(unit: nn.Module, cfg: ModelConfig, *, seed: int, device: torch.device | str = "cpu") -> nn.Module:
    """Allocate a meta-device unit of the model of ``cfg`` (``seed=seed``) on ``device`` and initialise
    it (``GPTModel`` for a ``GPTConfig``); returns ``unit`` (changed in place).

    Relies on the unit contract of ``pipert.models.partition``: inside a unit, parameters keep
    the model's names, which are what seeds their values. Buffers (the rotary tables) are
    recomputed by their module when it is moved (``Rotary._apply``).
    """
    unit.to_empty(device=device)
    init_parameters(unit.named_parameters(), seed=seed, layers=cfg.layers)
    return unit


def build_units(model: str | ModelConfig, num_units: int | None = None, *, seed: int = 0,
                keep: Iterable[int] | None = None, device: torch.device | str = "cpu", fine: bool = False,
                cut: str | None = None, recompute: str = "none", mlp_factory: Callable | None = None,
                **overrides) -> list[nn.Module]:
    """The ``num_units`` units of the model (a preset name with ``overrides``, or a config) with
    the units in ``keep`` (default: all) materialised on ``device``; the others on the meta device.

    A unit of the result equals (``torch.equal``, parameter by parameter) the same unit of
    ``partition(model_from_config(cfg, seed=seed).to(device), num_units, fine=fine, cut=cut,
    recompute=recompute)``.
    """
    cfg = model_config(model, **overrides) if isinstance(model, str) else model
    if not isinstance(model, str) and overrides:
        raise ValueError("overrides apply to a preset name; pass a config with them applied instead")
    with torch.device("meta"):
        units = partition(model_from_config(cfg, seed=seed, mlp_factory=mlp_factory), num_units, fine=fine,
                          cut=cut, recompute=recompute)
    wanted = range(len(units)) if keep is None else sorted(set(keep))
    for u in wanted:
        if not 0 <= u < len(units):
            raise ValueError(f"unit {u} to materialise is not one of the {len(units)} units")
        materialize(units[u], cfg, seed=seed, device=device)
    return units
