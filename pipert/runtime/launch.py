"""Starting ranks: local gloo/NCCL processes spawned by pipert, or a torchrun job."""
from __future__ import annotations

import datetime
import os
import tempfile
import time
import traceback
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

__all__ = ["launch", "init_from_env", "default_backend", "LaunchError", "gather_to_zero"]


class LaunchError(RuntimeError):
    """One or more ranks failed; ``errors`` maps rank -> that rank's error text."""

    def __init__(self, errors: dict[int, str]) -> None:
        self.errors = errors
        lines = [f"rank {r}: {text.strip().splitlines()[-1] if text.strip() else 'failed'}"
                 for r, text in sorted(errors.items())]
        super().__init__("pipeline ranks failed:\n  " + "\n  ".join(lines))


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


def _entry(rank: int, world: int, backend: str, tmp: str, timeout: float,
           fn: Callable[..., Any], args: tuple) -> None:
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(backend, init_method=f"file://{os.path.join(tmp, 'init')}", rank=rank,
                                world_size=world, timeout=datetime.timedelta(seconds=timeout))
        fn(rank, world, *args)
    except BaseException:
        with open(os.path.join(tmp, f"error-{rank}"), "w") as f:
            f.write(traceback.format_exc())
        os._exit(1)  # skip teardown: the peers may be gone
    if dist.is_initialized():
        dist.destroy_process_group()


def launch(fn: Callable[..., Any], world_size: int, args: tuple = (), backend: str = "gloo",
           timeout: float = 120.0, grace: float | None = None) -> None:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` fresh processes joined by
    torch.distributed.

    When a rank fails, the others get ``grace`` seconds (default: ``timeout`` + 10) to
    finish or fail on their own - their errors name the action and peer they stalled on -
    and are then stopped. Raises ``LaunchError`` with every failed rank's error.
    """
    if backend == "nccl" and torch.cuda.device_count() < world_size:
        raise ValueError(f"backend nccl needs one GPU per rank: {world_size} ranks, "
                         f"{torch.cuda.device_count()} GPUs visible")
    grace = timeout + 10.0 if grace is None else grace
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="pipert-") as tmp:
        procs = [ctx.Process(target=_entry, args=(r, world_size, backend, tmp, timeout, fn, args), daemon=True)
                 for r in range(world_size)]
        for p in procs:
            p.start()
        first_failure = None
        while any(p.is_alive() for p in procs):
            time.sleep(0.05)
            if first_failure is None and any(p.exitcode not in (None, 0) for p in procs):
                first_failure = time.monotonic()
            if first_failure is not None and time.monotonic() - first_failure > grace:
                break
        errors: dict[int, str] = {}
        for r, p in enumerate(procs):
            if p.is_alive():
                p.terminate()
                p.join(5)
                errors[r] = "stopped by the launcher: still running after another rank failed"
            elif p.exitcode != 0:
                path = os.path.join(tmp, f"error-{r}")
                errors[r] = open(path).read() if os.path.exists(path) else f"exited with code {p.exitcode}"
        if errors:
            raise LaunchError(errors)


def gather_to_zero(d: dict) -> dict:
    """Merge every rank's dict on rank 0 (others get {}); every rank must call it."""
    parts = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(d, parts, dst=0)
    if dist.get_rank() != 0:
        return {}
    out: dict = {}
    for p in parts:
        out.update(p)
    return out
