"""Tensor-parallel shards in checkpoints: each entry of a sharded parameter is written and read
as a ``DTensor`` over its TP group, so the checkpoint holds the whole tensor and any T reads it.

An entry ``model.unit{u}.{name}``, ``master.unit{u}.{name}`` or ``optim.unit{u}.{name}.{state}``
(a tensor with dimensions: AdamW's ``exp_avg``, ``exp_avg_sq``; not its 0-d ``step``) of a
parameter that :func:`pipert.models.tpshard.shard_dim` splits is this process's slice ``t`` of
``T`` along that dimension: it becomes ``DTensor.from_local(slice, tp_mesh, [Shard(dim)])``
(no communication). DCP stores the global shape with one chunk per TP rank (data-parallel
replicas offer the same chunks; DCP keeps one), and on load it fills each process's slice from
whichever chunks overlap it, so a checkpoint written at one T is read at any other (T = 1
writes and reads plain whole tensors). Replicated entries stay plain tensors: every TP rank
holds the same one.
"""
from __future__ import annotations

from typing import Any

import torch

from .models.tpshard import shard_dim

__all__ = ["TPLayout", "layout_of"]

_KINDS = ("model.", "master.", "optim.")


class TPLayout:
    """How this process's checkpoint entries map to whole tensors (size 1: they are whole)."""

    def __init__(self, size: int = 1, group: Any = None, device_type: str = "cpu") -> None:
        self.size, self._group, self._device_type = size, group, device_type

    def dim(self, key: str, ndim: int) -> int | None:
        """The dimension entry ``key`` (of ``ndim`` dimensions) is split along; None: whole."""
        if self.size == 1 or ndim == 0 or not key.startswith(_KINDS):
            return None
        name = key.split(".", 1)[1]
        if key.startswith("optim."):
            name = name.rpartition(".")[0]
        return shard_dim(name)

    def global_shape(self, key: str, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The whole tensor's shape of this process's entry ``key`` of ``shape``."""
        d = self.dim(key, len(shape))
        return tuple(n * self.size if i == d else n for i, n in enumerate(shape))

    def local_shape(self, key: str, shape: tuple[int, ...]) -> tuple[int, ...]:
        """This process's slice's shape of the whole entry ``key`` of ``shape``."""
        d = self.dim(key, len(shape))
        return tuple(n // self.size if i == d else n for i, n in enumerate(shape))

    def wrap(self, sd: dict[str, Any]) -> dict[str, Any]:
        """``sd`` with every sharded entry a DTensor viewing this process's slice (loading into
        it writes the slice in place)."""
        if self.size == 1:
            return sd
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.tensor import DTensor, Shard
        mesh = DeviceMesh.from_group(self._group, self._device_type)
        out = dict(sd)
        for key, t in sd.items():
            d = self.dim(key, t.dim()) if isinstance(t, torch.Tensor) else None
            if d is not None:
                whole = torch.Size(self.global_shape(key, t.shape))
                out[key] = DTensor.from_local(t, mesh, [Shard(d)], run_check=False, shape=whole,
                                              stride=torch.empty(whole, device="meta").stride())
        return out

    @staticmethod
    def unwrap(sd: dict[str, Any]) -> dict[str, Any]:
        """``sd`` with every DTensor its local slice."""
        from torch.distributed.tensor import DTensor
        return {k: v.to_local() if isinstance(v, DTensor) else v for k, v in sd.items()}


def layout_of(pipe) -> TPLayout:
    """The TP layout of this process of ``pipe`` (its units' ``tp``; size 1 without TP)."""
    if getattr(pipe, "tp", 1) == 1:
        return TPLayout()
    tp = next((m.tp for r in pipe.ranks for m in pipe.modules[r].values() if getattr(m, "tp", None) is not None), None)
    if tp is None:
        raise ValueError(f"tp={pipe.tp}: checkpoints of TP shards need units cut by "
                         f"pipert.models.tpshard.shard_units (none of this process's units is)")
    device = next((p.device.type for r in pipe.ranks for m in pipe.modules[r].values() for p in m.parameters()
                   if not p.is_meta), "cpu")
    return TPLayout(tp.size, tp.group, device)
