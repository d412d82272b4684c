"""Starting ranks: local processes under torch's elastic agent, or one rank of a torchrun job.

``launch`` runs a function on ``world_size`` processes of this machine (gloo, or NCCL with one
GPU each). Supervision is torch's agent with pipert's grace policy (``pipert.launch.supervisor``):
a failed or stopped rank ends the job, a stop signal to this process ends every rank, and no
process or temporary folder outlives the job. Under torchrun (or any launcher that sets RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/MASTER_PORT) ``env_rank`` and ``init_from_env`` make this
process that one rank, on ``cuda:LOCAL_RANK`` under NCCL.
"""
from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any, Callable

from .failures import LaunchError, LaunchInterrupted

__all__ = ["launch", "init_from_env", "env_rank", "EnvRank", "check_gpus", "default_backend", "LaunchError",
           "LaunchInterrupted", "gather_to_zero"]

_BACKENDS = ("gloo", "nccl")


def default_backend() -> str:
    import torch
    return "nccl" if torch.cuda.is_available() and torch.cuda.device_count() > 1 else "gloo"


@dataclass(frozen=True)
class EnvRank:
    """This process's place in a job started by torchrun (or another env:// launcher)."""

    rank: int
    world_size: int
    local_rank: int


def env_rank() -> EnvRank | None:
    """The rank torchrun's environment gives this process (RANK, WORLD_SIZE, LOCAL_RANK), or None
    outside such a job. A partial environment is a ValueError naming what is missing."""
    if "RANK" not in os.environ and "WORLD_SIZE" not in os.environ:
        return None
    missing = [v for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if not os.environ.get(v)]
    if missing:
        raise ValueError(f"this process has part of a torchrun environment (RANK, WORLD_SIZE, MASTER_ADDR, "
                         f"MASTER_PORT) but not {', '.join(missing)}; start it with torchrun, or unset RANK "
                         f"and WORLD_SIZE to let pipert start the ranks")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    return EnvRank(rank, world, int(os.environ.get("LOCAL_RANK", rank)))


def check_gpus(needed: int, local_rank: int | None = None) -> None:
    """ValueError naming the GPUs this process sees unless there are ``needed`` of them (or,
    with ``local_rank``, one with that index)."""
    import torch
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if (n > local_rank) if local_rank is not None else (n >= needed):
        return
    found = ", ".join(f"cuda:{i} {torch.cuda.get_device_name(i)}" for i in range(n)) or "none"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    found += f" (CUDA_VISIBLE_DEVICES={visible})" if visible is not None else ""
    need = (f"local rank {local_rank} uses cuda:{local_rank}" if local_rank is not None
            else f"{needed} ranks need one GPU each")
    raise ValueError(f"backend nccl: {need}, but this machine has {n} GPU(s): {found}; use --backend gloo "
                     f"(CPU), fewer ranks, or a machine with more GPUs")


NCCL_WATCHDOG_MARGIN_S = 30.0
"""Seconds NCCL's process-group timeout exceeds pipert's (``timeout`` of ``init_from_env``)."""


def init_from_env(backend: str | None = None, timeout: float = 120.0) -> int:
    """Initialise torch.distributed from torchrun's environment (env://); returns this rank.
    Under NCCL the process uses ``cuda:LOCAL_RANK``."""
    import torch
    import torch.distributed as dist
    if not dist.is_initialized():
        backend = backend or default_backend()
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            # NCCL's watchdog ends a job whose operation outlives the group's timeout; pipert's own
            # end-of-step wait (timeout) names the stalled rank, action and peer first
            timeout += NCCL_WATCHDOG_MARGIN_S
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout))
    return dist.get_rank()


def launch(fn: Callable[..., Any], world_size: int, args: tuple = (), backend: str = "gloo",
           timeout: float = 120.0, grace: float | None = None) -> None:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` fresh processes of this machine
    joined by torch.distributed (``backend``: gloo, or nccl with a GPU per rank).

    When a rank fails, the others get ``grace`` seconds (default: ``min(timeout, 2)``) to finish
    or fail on their own - their errors name the action and peer they stalled on - and are then
    killed. Raises ``LaunchError`` with every failed rank's error, root cause first;
    ``LaunchInterrupted`` (a KeyboardInterrupt) when this process got a stop signal.
    """
    if backend not in _BACKENDS:
        raise ValueError(f"launch: backend {backend!r} unknown; allowed: {', '.join(_BACKENDS)}")
    if world_size < 1:
        raise ValueError(f"launch: world_size must be >= 1, got {world_size}")
    if backend == "nccl":
        check_gpus(world_size)
    from .rank_entry import run_rank
    from .starter import inherited
    from .supervisor import run_local
    from multiprocessing.util import get_temp_dir  # the fork server's socket folder (pipert.launch.starter)
    run_local(run_rank, world_size, (fn, tuple(args), backend, timeout, os.getpid(), get_temp_dir(), inherited()),
              min(timeout, 2.0) if grace is None else grace)


def gather_to_zero(d: dict) -> dict:
    """Merge every rank's dict on rank 0 (others get {}); every rank must call it."""
    import torch.distributed as dist
    parts = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(d, parts, dst=0)
    if dist.get_rank() != 0:
        return {}
    out: dict = {}
    for p in parts:
        out.update(p)
    return out
