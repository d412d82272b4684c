"""Boundary shapes: what each unit passes to the next, found without computing the model.

``infer_boundaries`` runs one micro-batch through the unit chain on the meta device: every
unit is called with meta copies of its parameters and buffers (``torch.func.functional_call``;
a unit already on the meta device is called as it is), so shapes and dtypes propagate while
nothing is allocated or computed. Every rank of a torch.distributed job can do this for the
whole model, including the units that exist on it only as meta skeletons.

Units whose code cannot run on meta tensors (a custom kernel without a meta implementation)
fall back to one real no-grad pass when every unit is materialised (the single-process
backend); with units on the meta device that is impossible and the error names the unit.
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor, nn
from torch.func import functional_call

from ..device.tensors import device_of, is_materialized
from .buffers import BoundarySpec

__all__ = ["infer_boundaries"]


def _meta(v):
    if isinstance(v, Tensor):
        return v.to("meta")
    return tuple(_meta(t) for t in v)


def _on_meta(unit: nn.Module, x):
    state = {n: t.to("meta") for n, t in list(unit.named_parameters()) + list(unit.named_buffers())}
    return functional_call(unit, state, (x,))


def _devices(units: Sequence[nn.Module], x: Tensor, default: torch.device) -> list[torch.device]:
    """Device of each unit's output: the unit's own device; ``default`` for a unit on the meta
    device (it runs elsewhere: this process receives its output on ``default``); the device of
    its input for a unit without tensors."""
    out, dev = [], x.device
    for unit in units:
        if not is_materialized(unit):
            dev = default
        else:
            dev = device_of([unit]) or dev
        out.append(dev)
    return out


def infer_boundaries(units: Sequence[nn.Module], x: Tensor, default: torch.device) -> list[BoundarySpec]:
    """The BoundarySpec of the output of every unit but the last for input ``x`` (one
    micro-batch); ``default`` is the device of the outputs of units on the meta device."""
    devices = _devices(units[:-1], x, default)
    specs = []
    with torch.no_grad():
        v = _meta(x)
        for u, unit in enumerate(units[:-1]):
            try:
                v = _on_meta(unit, v)
            except Exception as e:  # noqa: BLE001 - any failure: the real pass or a clear error
                if all(is_materialized(m) for m in units):
                    return _real_pass(units, x)
                raise RuntimeError(f"unit {u} cannot run on the meta device, which boundary-shape inference "
                                   f"needs while some units are not materialised: {type(e).__name__}: {e}") from e
            spec = BoundarySpec.of(v)
            specs.append(BoundarySpec(spec.shapes, spec.dtype, devices[u], spec.packed))
    return specs


def _real_pass(units: Sequence[nn.Module], x: Tensor) -> list[BoundarySpec]:
    specs = []
    with torch.no_grad():
        for unit in units[:-1]:
            x = unit(x)
            specs.append(BoundarySpec.of(x))
    return specs
