"""Where a rank's tensors live: its units' device, meta-device units, the device of a reduction.

A process of a torch.distributed job computes on one device: the device of the units it
holds. Units it neither computes nor holds may stay on the meta device (shapes and dtypes,
no storage; see ``pipert.models.materialize``). Collectives the runtime issues itself (the
step's loss) put their tensor where the process group's backend can reduce it.
"""
from __future__ import annotations

from typing import Iterable

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["meta_tensors", "is_materialized", "device_of", "backend_device_types", "reduction_device", "tensor_key"]


def meta_tensors(module: nn.Module) -> list[str]:
    """Names of ``module``'s parameters and buffers that are still on the meta device."""
    named = list(module.named_parameters()) + list(module.named_buffers())
    return [n for n, t in named if t.is_meta]


def is_materialized(module: nn.Module) -> bool:
    """True when no parameter or buffer of ``module`` is on the meta device."""
    return not meta_tensors(module)


def device_of(modules: Iterable[nn.Module]) -> torch.device | None:
    """The device of the first parameter or buffer of ``modules`` not on the meta device;
    None when they have none (units without tensors, or all still on meta)."""
    for m in modules:
        for t in list(m.parameters()) + list(m.buffers()):
            if not t.is_meta:
                return t.device
    return None


def backend_device_types(backend: str) -> list[str]:
    """Device types whose tensors a process-group backend reduces. ``backend`` is what
    ``torch.distributed.get_backend()`` returns: a name (``"gloo"``, ``"nccl"``) or a
    per-device list (``"cpu:gloo,cuda:nccl"``). Names come from torch's own table
    (``Backend.backend_capability``); an unknown name gives ``[]``."""
    if ":" in backend:
        return [part.split(":", 1)[0].strip() for part in backend.split(",") if part.strip()]
    return list(dist.Backend.backend_capability.get(backend.lower(), []))


def reduction_device(backend: str, compute: torch.device) -> torch.device:
    """The device of a tensor this rank reduces over a process group of ``backend``: the CPU
    when the backend reduces CPU tensors (gloo, mpi, ucc; host memory keeps the GPU out of a
    scalar's reduction), else ``compute``, the device this rank's units are on (NCCL: its GPU).
    Raises when the backend can reduce neither."""
    types = backend_device_types(backend)
    if "cpu" in types:
        return torch.device("cpu")
    if compute.type in types or not types:
        return compute
    raise RuntimeError(f"process-group backend {backend!r} reduces tensors on {', '.join(types)} only, but this "
                       f"rank computes on {compute}; put its units on a {types[0]} device or use a backend that "
                       f"supports {compute.type}")


def tensor_key(t: torch.Tensor) -> tuple:
    """Identity of the bytes a tensor views: (device, first byte, bytes). Two views of the same
    bytes count once; distinct views of one storage count separately (a received fold's buffer
    split per micro-batch is two values)."""
    nbytes = t.numel() * t.element_size()
    if t.numel() > 1 and not any(t.stride()):
        nbytes = 0  # the one-element placeholder of a freed or offloaded tensor
    return (t.device.type, t.device.index, t.data_ptr(), nbytes)
