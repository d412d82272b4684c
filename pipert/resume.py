"""``pipert train``'s checkpoints: what each records, which run owns a save folder, what a
resumed run must share with its checkpoint and what it may change.

A resumed run keeps the model and the data stream (``--model``, ``--dtype``, ``--seq``,
``--batch-size``, ``--seed`` equal the checkpoint's, else refused); ``--lr`` given on
``--resume`` replaces the checkpoint's learning rate from the first resumed step on (left out:
the checkpoint's); the schedule, ``--stages``, ``--microbatches``, ``--dp``, ``--zero``, ``--tp``, ``--sp``,
passes, backend and links may change (a TP shard is saved as its slice of the whole tensor:
``pipert.ckpttp``); ``--steps`` is the total.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

from torch import nn

from .checkpoint import check_model, read_hyper, read_meta
from .ckptfolder import CheckpointError, check_files, resolve

__all__ = ["train_meta", "claim_save", "check_resume", "saved_lr", "run_settings", "prepare_resume"]

_SAME = ("model", "dtype", "seq", "batch_size", "seed")
"""Settings a resumed ``pipert train`` run must share with the checkpoint: the model and the
data stream (batch ``k`` is a pure function of seed, k, batch size and sequence length)."""
_RUN = (*_SAME, "lr")
"""Settings that fix a run's trajectory; a save folder holds the checkpoints of one run
(:func:`pipert.ckptfolder.claim`)."""


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def run_settings(cfg) -> dict:
    """The settings that identify the run of ``cfg`` (a TrainConfig whose lr is resolved)."""
    return {k: getattr(cfg, k) for k in _RUN}


def train_meta(cfg, step: int) -> dict:
    """The ``meta`` of a ``pipert train`` checkpoint taken after ``step`` steps."""
    from .ckptfolder import run_hash
    settings = run_settings(cfg)
    return {"step": step, **settings, "run": run_hash(settings),
            "schedule": cfg.schedule, "stages": cfg.stages, "microbatches": cfg.microbatches, "tp": cfg.tp}


def claim_save(cfg) -> str:
    """Make ``cfg.save`` this run's save folder (:func:`pipert.ckptfolder.claim`; ``cfg.resume``,
    resolved to a step folder, continues its folder's run); its hash."""
    from .ckptfolder import claim
    return claim(cfg.save, run_settings(cfg), _flag, read_meta, cfg.resume or None)


def check_resume(cfg, units: Iterable[nn.Module]) -> Path:
    """The checkpoint ``cfg.resume`` names, after checking it fits the run: complete, every file
    whole, the same model (``units``, on the meta device, give its shapes), data settings, and a
    step below ``cfg.steps``."""
    try:
        p = resolve(cfg.resume)
        check_files(p)
    except CheckpointError as e:
        raise CheckpointError(f"--resume {cfg.resume}: {e}") from None
    meta = read_meta(p)
    for k in _SAME:
        if meta.get(k) != getattr(cfg, k):
            raise CheckpointError(f"{_flag(k)} {getattr(cfg, k)} differs from the checkpoint's {meta.get(k)!r} "
                                  f"({str(p)!r}); a resumed run keeps the model and the data stream")
    if meta["step"] >= cfg.steps:
        raise CheckpointError(f"--steps {cfg.steps}: the checkpoint {str(p)!r} is already at step {meta['step']}; "
                              f"give --steps > {meta['step']} (the total, counting the steps already run)")
    try:
        check_model(p, units)
    except CheckpointError as e:
        raise CheckpointError(f"--resume {cfg.resume}: {e}") from None
    return p


def saved_lr(path: Path) -> float | None:
    """The learning rate the checkpoint's run used (None: it holds no optimizer state)."""
    meta = read_meta(path)
    return meta["lr"] if meta.get("lr") is not None else read_hyper(path).get("lr")


def prepare_resume(cfg, units: Iterable[nn.Module]) -> None:
    """``cfg.resume`` (a TrainConfig's) becomes the checkpoint it names, checked against the run
    (:func:`check_resume`; ``units`` on the meta device); ``cfg.lr`` left out becomes the
    checkpoint's, and one given that replaces the checkpoint's is noted on stderr."""
    import sys
    path = check_resume(cfg, units)
    cfg.resume, before = str(path), saved_lr(path)
    if cfg.lr is None:
        cfg.lr = before
    elif before is not None and cfg.lr != before:
        print(f"pipert train: --lr {cfg.lr:g} replaces the checkpoint's learning rate {before:g} ({cfg.resume})",
              file=sys.stderr)
