"""Starting ranks: local gloo/NCCL processes spawned by pipert, or a torchrun job."""
from __future__ import annotations

import datetime
import os
import tempfile
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

__all__ = ["launch", "init_from_env", "default_backend"]


def default_backend() -> str:
    return "nccl" if torch.cuda.is_available() and torch.cuda.device_count() > 1 else "gloo"


def init_from_env(backend: str | None = None, timeout: float = 120.0) -> int:
    """Initialise torch.distributed from torchrun's environment; returns this rank."""
    if not dist.is_initialized():
        backend = backend or default_backend()
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout))
    return dist.get_rank()


def _entry(rank: int, world: int, backend: str, init_file: str, timeout: float,
           fn: Callable[..., Any], args: tuple) -> None:
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout))
    try:
        fn(rank, world, *args)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def launch(fn: Callable[..., Any], world_size: int, args: tuple = (), backend: str = "gloo",
           timeout: float = 120.0) -> None:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` fresh processes joined by
    torch.distributed; raises if any process fails (with that process's error)."""
    if backend == "nccl" and torch.cuda.device_count() < world_size:
        raise ValueError(f"backend nccl needs one GPU per rank: {world_size} ranks, "
                         f"{torch.cuda.device_count()} GPUs visible")
    with tempfile.TemporaryDirectory(prefix="pipert-") as tmp:
        init_file = os.path.join(tmp, "init")
        mp.spawn(_entry, args=(world_size, backend, init_file, timeout, fn, args), nprocs=world_size, join=True)
