"""Folders of checkpoints: ``DIR/step-N`` holds the checkpoint taken after N steps (a DCP
folder, complete once its ``.metadata`` is written: DCP writes it last), ``DIR/run.json`` names
the run that owns DIR.

Invariants: a save folder holds the checkpoints of one run, the run whose settings hash to the
``run`` of its ``run.json`` (a folder without run.json is owned by the settings in its newest
checkpoint's meta); a run resumed from one of the folder's checkpoints continues that run (its
given --lr becomes the folder's); resolving a folder never passes over a partial checkpoint
newer than the one it returns; a zero-padded name (``step-00000004``) is read as the same step
as ``step-4``.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Callable

__all__ = ["CheckpointError", "step_dir", "steps", "resolve", "check_files", "run_hash", "claim", "RUN_FILE"]

RUN_FILE = "run.json"
_STEP = re.compile(r"^step-(\d+)$")


class CheckpointError(ValueError):
    """A checkpoint folder that is missing, incomplete, owned by another run or does not fit."""


def step_dir(root: str | os.PathLike, step: int) -> Path:
    """The folder of the checkpoint taken after ``step`` steps under ``root``: ``root/step-N``."""
    return Path(root) / f"step-{step}"


def _complete(path: Path) -> bool:
    return (path / ".metadata").is_file()


def steps(root: str | os.PathLike) -> list[tuple[int, Path, bool]]:
    """(step, folder, complete) of every ``step-N`` folder under ``root``, by step."""
    out = []
    for d in Path(root).iterdir() if Path(root).is_dir() else ():
        m = _STEP.match(d.name)
        if m and d.is_dir():
            out.append((int(m.group(1)), d, _complete(d)))
    return sorted(out, key=lambda t: (t[0], t[1].name))


def resolve(path: str | os.PathLike) -> Path:
    """The checkpoint ``path`` names: the folder itself when it holds one, else its newest
    ``step-N`` sub-folder, which must be complete (a partial one is named, never passed over)."""
    p = Path(path)
    if not p.is_dir():
        raise CheckpointError(f"checkpoint folder {str(path)!r} does not exist or is not a folder")
    if _complete(p):
        return p
    if _STEP.match(p.name):
        raise CheckpointError(f"checkpoint {str(p)!r} is partial: it has no .metadata (the save that wrote it "
                              f"did not finish); give a complete step-N folder")
    found = steps(p)
    if not found:
        raise CheckpointError(f"{str(path)!r} holds no checkpoint: neither a .metadata file (a DCP checkpoint) "
                              f"nor step-N sub-folders with one")
    step, newest, complete = found[-1]
    if not complete:
        done = [d for _, d, ok in found if ok]
        instead = f"resume from {str(done[-1])!r}, the newest complete one" if done else "no complete one is left"
        raise CheckpointError(f"{str(path)!r}: its newest checkpoint {newest.name} is partial (no .metadata: the "
                              f"save that wrote it did not finish); {instead}, or remove {newest.name}")
    return newest


def check_files(path: Path) -> None:
    """Every file the checkpoint's metadata names exists and is as long as its entries need
    (a truncated or missing shard is named here, before anything reads it)."""
    from torch.distributed.checkpoint import FileSystemReader
    need: dict[str, int] = {}
    for info in FileSystemReader(str(path)).read_metadata().storage_data.values():
        need[info.relative_path] = max(need.get(info.relative_path, 0), info.offset + info.length)
    for name, size in sorted(need.items()):
        f = path / name
        if not f.is_file():
            raise CheckpointError(f"checkpoint {str(path)!r}: file {name} is missing (its metadata lists it)")
        have = f.stat().st_size
        if have < size:
            raise CheckpointError(f"checkpoint {str(path)!r}: file {str(f)!r} has {have} bytes, but its entries "
                                  f"need {size}: it is truncated (a copy or a save that did not finish)")


def run_hash(settings: dict) -> str:
    """The identity of a run: a hash of the settings that fix its trajectory."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


def claim(root: str | os.PathLike, settings: dict, flags: Callable[[str], str],
          read_meta: Callable[[Path], dict], resumed_from: str | os.PathLike | None = None) -> str:
    """Make ``root`` the save folder of the run with ``settings`` (created with its run.json if
    new) and return the run's hash; a folder owned by another run is refused naming the settings
    that differ (``flags`` spells a setting as its flag), unless this run goes on from one of
    the folder's own checkpoints (``resumed_from``): it continues the folder's run, whose
    settings become its own. ``read_meta`` reads a checkpoint's meta (for folders without
    run.json)."""
    p = Path(root)
    mine = run_hash(settings)
    owner = _owner(p, read_meta)
    continues = resumed_from is not None and Path(resumed_from).resolve().parent == p.resolve()
    if owner is not None and not continues:
        theirs = {k: v for k, v in owner.items() if k in settings}
        differ = [k for k in settings if k in theirs and theirs[k] != settings[k]]
        if differ:
            diffs = ", ".join(f"{flags(k)} {settings[k]} (the folder's: {theirs[k]})" for k in differ)
            raise CheckpointError(f"--save {root}: the folder holds the checkpoints of another run, and this run "
                                  f"differs in {diffs}; save into another folder (a folder belongs to one run)")
    try:
        p.mkdir(parents=True, exist_ok=True)
        (p / RUN_FILE).write_text(json.dumps({"run": mine, "settings": settings}, sort_keys=True) + "\n")
    except OSError as e:
        raise CheckpointError(f"--save {root}: cannot write the folder ({e.strerror}: {e.filename}); allowed: a "
                              f"folder this user can write") from None
    return mine


def _owner(root: Path, read_meta: Callable[[Path], dict]) -> dict | None:
    """The settings of the run that owns ``root`` (None: nobody)."""
    f = root / RUN_FILE
    if f.is_file():
        return json.loads(f.read_text())["settings"]
    done = [d for _, d, ok in steps(root) if ok]
    return read_meta(done[-1]) if done else None
