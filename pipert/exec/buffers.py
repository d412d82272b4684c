"""Buffers: boundary tensor specs, packing of tuple activations, flat weight/grad views."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["BoundarySpec", "pack", "unpack", "flatten_params", "flatten_grads", "load_params", "load_grads"]


@dataclass(frozen=True)
class BoundarySpec:
    """Shape(s) and dtype of what crosses one unit boundary for one micro-batch.

    ``shapes`` has one entry per tensor; ``packed`` is True when the value is a tuple,
    sent as one flat buffer (all parts share ``dtype``).
    """

    shapes: tuple[tuple[int, ...], ...]
    dtype: torch.dtype
    device: torch.device
    packed: bool

    @staticmethod
    def of(value: torch.Tensor | tuple) -> "BoundarySpec":
        if isinstance(value, torch.Tensor):
            return BoundarySpec((tuple(value.shape),), value.dtype, value.device, False)
        dtypes = {t.dtype for t in value}
        if len(dtypes) != 1:
            raise TypeError(f"a unit boundary tuple must share one dtype, got {sorted(map(str, dtypes))}")
        return BoundarySpec(tuple(tuple(t.shape) for t in value), value[0].dtype, value[0].device, True)

    def numel(self) -> int:
        total = 0
        for s in self.shapes:
            n = 1
            for d in s:
                n *= d
            total += n
        return total

    def pack(self, value: torch.Tensor | tuple) -> torch.Tensor:
        """The value as one flat tensor (what crosses a link)."""
        if isinstance(value, torch.Tensor):
            return value.reshape(-1)
        return pack(value)

    def unpack(self, flat: torch.Tensor) -> torch.Tensor | tuple:
        """The value back from :meth:`pack` (views of ``flat``)."""
        if self.packed:
            return unpack(flat, self)
        return flat.view(self.shapes[0])

    def empty(self) -> torch.Tensor:
        if self.packed:
            return torch.empty(self.numel(), dtype=self.dtype, device=self.device)
        return torch.empty(self.shapes[0], dtype=self.dtype, device=self.device)


def pack(parts: tuple | list) -> torch.Tensor:
    return torch.cat([p.reshape(-1) for p in parts])


def unpack(flat: torch.Tensor, spec: BoundarySpec) -> tuple[torch.Tensor, ...]:
    out, off = [], 0
    for s in spec.shapes:
        n = 1
        for d in s:
            n *= d
        out.append(flat[off:off + n].view(s))
        off += n
    return tuple(out)


def flatten_params(module: nn.Module, params: list | None = None) -> torch.Tensor:
    """Every parameter (or those of ``params``) in one vector (empty for none)."""
    return _cat(module, [p.detach().reshape(-1) for p in _params(module, params)])


def flatten_grads(module: nn.Module, params: list | None = None) -> torch.Tensor:
    """Every gradient (or those of ``params``) in one vector, zeros where none."""
    return _cat(module, [(p.grad if p.grad is not None else torch.zeros_like(p)).detach().reshape(-1)
                         for p in _params(module, params)])


def _params(module: nn.Module, params: list | None) -> list:
    return list(module.parameters()) if params is None else params


def _cat(module: nn.Module, parts: list[torch.Tensor]) -> torch.Tensor:
    if parts:
        return torch.cat(parts)
    buffer = next(module.buffers(), None)  # the unit's device, where it has one
    return torch.zeros(0, device=None if buffer is None else buffer.device)


def load_params(module: nn.Module, flat: torch.Tensor, params: list | None = None) -> None:
    """Bind every parameter to its slice of ``flat`` (no copy). ``flat`` must be a fresh
    buffer: graphs of earlier micro-batches keep the storage they were built on, so a
    received weight never overwrites a tensor that a pending backward still reads."""
    off = 0
    for p in _params(module, params):
        n = p.numel()
        p.data = flat[off:off + n].view_as(p)
        off += n


def load_grads(module: nn.Module, flat: torch.Tensor | None, accumulate: bool = False,
               params: list | None = None) -> None:
    """Set (or add into) every parameter's (or ``params``') ``.grad`` from ``flat``; ``None`` zeroes them."""
    off = 0
    for p in _params(module, params):
        n = p.numel()
        if flat is None:
            if p.grad is not None:
                p.grad.zero_()
            continue
        part = flat[off:off + n].view_as(p)
        if p.grad is None:
            p.grad = part.clone()
        elif accumulate:
            p.grad.add_(part)
        else:
            p.grad.copy_(part)
        off += n
