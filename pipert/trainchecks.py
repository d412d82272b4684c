"""Checks of ``pipert train`` settings against this machine and the checkpoint rules, run by
``TrainConfig.validate`` before any schedule is built or process started: each failure is a
ValueError naming the flag, its value and what is allowed."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

__all__ = ["check_folder_writable", "check_batch_fits", "check_checkpoint_dtype", "check_tensor_parallel", "check_mesh_order",
           "host_memory"]


_GiB = float(1 << 30)
_ELEMENT_BYTES = {"float32": 4, "float64": 8, "bfloat16": 2}
_TOKEN_BYTES = 2 * 8
"""Bytes a sequence position takes in a step's inputs and targets (int64 each)."""


def check_folder_writable(flag: str, path: str) -> None:
    """``path`` is a folder this user can write, or can be created as one (its nearest existing
    ancestor is a writable folder)."""
    p = Path(path).expanduser()
    allowed = "allowed: a folder this user can write (created if missing)"
    if p.exists() and not p.is_dir():
        raise ValueError(f"{flag} {path}: is a file, not a folder; {allowed}")
    q = p
    while not q.exists() and q != q.parent:
        q = q.parent
    if not q.is_dir():
        raise ValueError(f"{flag} {path}: {q} is a file, so the folder cannot be created there; {allowed}")
    if not os.access(q, os.W_OK | os.X_OK):
        what = "is not writable by this user" if q == p else "(its nearest existing folder) is not writable"
        raise ValueError(f"{flag} {path}: {q} {what}; {allowed}")


def host_memory() -> int:
    """Bytes of memory this process may use: the machine's, or its cgroup's limit when lower."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
    except OSError:
        return total
    return min(total, int(limit)) if limit.isdigit() else total


def check_batch_fits(cfg: Any, memory: int | None = None) -> None:
    """The step of ``cfg`` (a TrainConfig) fits this machine's memory (``memory`` bytes, default
    :func:`host_memory`) by a lower bound: every process of this machine holds the step's inputs
    and targets (int64) and one micro-batch's activations at a unit boundary."""
    from .models import model_config
    procs = 1 if cfg.backend == "local" else int(os.environ.get("LOCAL_WORLD_SIZE", cfg.world))
    hidden = model_config(cfg.model).hidden
    per_sequence = procs * cfg.seq * (_TOKEN_BYTES + hidden * _ELEMENT_BYTES[cfg.dtype] / cfg.microbatches)
    memory = host_memory() if memory is None else memory
    if cfg.batch_size * per_sequence <= memory:
        return
    largest = int(memory // per_sequence) // cfg.microbatches * cfg.microbatches
    raise ValueError(f"--batch-size {cfg.batch_size}: a step needs at least {cfg.batch_size * per_sequence / _GiB:.3g} "
                     f"GiB on this machine ({procs} process(es), each holding the step's {cfg.batch_size} x "
                     f"{cfg.seq} tokens and targets as int64 and one micro-batch's activations of width {hidden} "
                     f"in {cfg.dtype}), and it has {memory / _GiB:.3g} GiB; allowed: --batch-size <= {largest} "
                     f"(a multiple of --microbatches {cfg.microbatches})")


def check_checkpoint_dtype(cfg: Any) -> None:
    """Checkpoints of ZeRO-sharded units step fp32 master copies sharded with the weights under
    bf16, which pipert.checkpoint cannot write or read: refused with --save or --resume."""
    if cfg.dtype != "bfloat16" or cfg.zero == "0" or not (cfg.save or cfg.resume):
        return
    which = f"--save {cfg.save}" if cfg.save else f"--resume {cfg.resume}"
    raise ValueError(f"{which} with --dtype bfloat16 and --zero {cfg.zero}: checkpoints of ZeRO-sharded bf16 units "
                     f"(their fp32 master copies are sharded) are not supported; allowed: --zero 0, --dtype float32 "
                     f"or float64, or no checkpoint")


def check_tensor_parallel(cfg: Any) -> None:
    """--tp and --sp against the model's sizes and the other flags (every family and cut shards)."""
    from .models import model_config
    from .models.tpshard import check_tp_sizes
    if cfg.tp < 1:
        raise ValueError(f"--tp must be >= 1 (processes per pipeline rank), got {cfg.tp}")
    if cfg.sp and cfg.tp == 1:
        raise ValueError("--sp splits the sequence over the TP group: give --tp > 1 as well")
    if cfg.tp == 1:
        return
    check_tp_sizes(model_config(cfg.model), cfg.tp, cfg.seq if cfg.sp else None)
    refused = {"--backend local": cfg.backend == "local", "--dcs/--node-*": cfg.link_options().active}
    bad = [flag for flag, given in refused.items() if given]
    if bad:
        raise ValueError(f"--tp {cfg.tp}: {', '.join(bad)} not supported with tensor parallelism yet; "
                         f"run with --tp 1 or leave {'them' if len(bad) > 1 else 'it'} out")



def check_mesh_order(cfg: Any, backend: str) -> None:
    """--mesh-order places processes: a non-default order needs processes (not --backend local,
    nor auto where it runs every rank in this process)."""
    from .comm.mesh import DEFAULT_MESH_ORDER, parse_mesh_order
    if backend == "local" and parse_mesh_order(cfg.mesh_order) != DEFAULT_MESH_ORDER:
        how = "--backend local" if cfg.backend == "local" else f"--backend {cfg.backend} (here: local)"
        raise ValueError(f"--mesh-order {cfg.mesh_order!r}: {how} runs every rank as a thread of one process, "
                         f"so there is no process to place; allowed there: {','.join(DEFAULT_MESH_ORDER)} "
                         f"(or use --backend gloo/nccl)")
